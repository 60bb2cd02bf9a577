"""Suite-wide settings.

MSTAR_STEP=eager: every generation service a test starts (stacks, servers) runs its steps op by
op (services/generation/step_choice.py). Compiling the default model's decode graphs costs a minute on a cold Inductor cache, per
distinct graph; the compiled path has its own tests (tests/unit/generation/test_compiled_step.py,
and a slow one on the default model), the rest of the suite tests behaviour, not the compiler.

MSTAR_CPU_FLAGS: the numerics defaults (services/generation/numerics.py) read these flags instead
of the CPU's, here a CPU's without native bf16, so every test, and every server a test starts,
takes the same defaults on every machine (HF weights in fp32). The bf16 branch an avx512_bf16 or AMX
CPU takes reruns in tests/unit/generation/test_cpu_flags.py; `MSTAR_CPU_FLAGS=avx512_bf16 make
test` runs the whole suite in it. The kernel build reads the real CPU (kernels/cpu/library.py).
"""

import os

os.environ.setdefault("MSTAR_STEP", "eager")
os.environ.setdefault("MSTAR_CPU_FLAGS", "avx2 fma f16c")
