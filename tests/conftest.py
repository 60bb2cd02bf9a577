"""Suite-wide settings.

MSTAR_COMPILE=0: every generation service a test starts (stacks, servers) runs its decode steps
eagerly. Compiling the default model's decode graphs costs a minute on a cold Inductor cache, per
distinct graph; the compiled path has its own tests (tests/unit/generation/test_compiled_step.py,
and a slow one on the default model), the rest of the suite tests behaviour, not the compiler.
"""

import os

os.environ.setdefault("MSTAR_COMPILE", "0")
