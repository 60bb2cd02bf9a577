"""kernels/cpu built for every instruction set it has paths for (library.ISAS), on every machine.

The kernels choose their paths at compile time from the ISA macros (quant_matmul: AVX512-VNNI,
AVX2 or plain C++ tiles; attention and argmax: 16 or 8 lanes or plain loops), so a machine's own
build (native) compiles and runs only its own paths. Here every build is compiled, whatever the
CPU (a compile error in a path this CPU never takes fails the suite on any machine), its binary
checked for that ISA's instructions, and test_cpu_ops.py with the fused decoder stack's tests rerun
in a child pytest against each build this CPU can execute ($MSTAR_KERNEL_ISA), against the fp32
oracles. An AVX-512 build runs only on a CPU with those flags (elsewhere it dies of SIGILL; no
emulator for it is practical: Intel SDE is no package, QEMU 7.2's user-mode TCG stops at AVX2).
Builds are cached as the native one is (library.build), so only a source change pays ~25 s an ISA.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.cpu import library

pytestmark = pytest.mark.skipif(library.load_error() is not None, reason=f"kernels/cpu unavailable: {library.load_error()}")

EXPLICIT = [isa for isa in library.ISAS if isa != library.NATIVE]
AVX2_CPU = "fpu sse2 avx avx2 fma f16c bmi2"  # an AMD EPYC (Zen 3) without AVX-512
SAPPHIRE_RAPIDS = AVX2_CPU + " avx512f avx512bw avx512dq avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_tile"
REPO = Path(__file__).resolve().parents[2]
# What each build's disassembly must show: registers or instructions of its widest path.
INSTRUCTIONS = {"scalar": (None, r"%[yz]mm"), "avx2": (r"%ymm", r"%zmm"), "avx512": (r"%zmm", r"vpdpbusd"),
                "avx512_vnni": (r"vpdpbusd", None)}


def test_each_build_targets_baseline_x86_64_plus_exactly_its_features():
    assert library.target_flags("native") == ["-march=native"]
    assert library.target_flags("scalar") == ["-march=x86-64"]
    assert library.target_flags("avx2") == ["-march=x86-64", "-mavx2", "-mfma", "-mf16c"]
    assert library.target_flags("avx512_vnni")[-5:] == ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl",
                                                        "-mavx512vnni"]


def test_a_build_runs_only_where_the_cpu_has_its_flags():
    assert library.missing_flags("native", "") == [] and library.missing_flags("scalar", "") == []
    assert library.missing_flags("avx2", AVX2_CPU) == []
    assert library.missing_flags("avx512", AVX2_CPU) == ["avx512f", "avx512bw", "avx512dq", "avx512vl"]
    assert library.missing_flags("avx512_vnni", AVX2_CPU)[-1] == "avx512_vnni"
    assert all(library.missing_flags(isa, SAPPHIRE_RAPIDS) == [] for isa in library.ISAS)
    assert library.missing_flags("avx2", "fpu sse2 avx") == ["avx2", "fma", "f16c"]


def test_the_isa_is_chosen_by_name_and_a_wrong_name_is_refused():
    assert library.chosen_isa({}) == "native"
    assert library.chosen_isa({library.ISA_ENV: "avx512_vnni"}) == "avx512_vnni"
    with pytest.raises(library.KernelBuildError, match="native, scalar, avx2, avx512, avx512_vnni; got 'avx3'"):
        library.chosen_isa({library.ISA_ENV: "avx3"})


@pytest.mark.timeout(900)  # a cold build: ~1 min on 2 idle cores, several on a loaded box
@pytest.mark.parametrize("isa", EXPLICIT)
def test_every_build_compiles_here_with_its_own_instructions(isa):
    path = library.build(isa)
    assert path.is_file() and path.parent.name.endswith(f"-{isa}")  # its own cache entry
    if shutil.which("objdump") is None:
        pytest.skip("compiled; no objdump here to read its instructions")
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True,
                          check=True).stdout
    present, absent = INSTRUCTIONS[isa]
    assert present is None or re.search(present, text), f"the {isa} build has no {present}"
    assert absent is None or not re.search(absent, text), f"the {isa} build has {absent}"


@pytest.mark.parametrize("isa", EXPLICIT)
def test_each_build_this_cpu_runs_gives_the_oracles_results(isa):
    missing = library.missing_flags(isa, library.detect_cpu_flags())
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(missing)}: the {isa} build is compiled and read, not run")
    library.build(isa)  # built (or found) here, outside the child's time
    fused = "tests/unit/generation/test_fused_step.py::test_"
    selected = ["tests/kernels/test_cpu_ops.py", f"{fused}the_fused_stack_computes_what_the_per_op_path_computes",
                f"{fused}a_row_gets_the_same_bits_alone_in_a_batch_and_on_two_threads"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selected], cwd=REPO,
                         env={**os.environ, library.ISA_ENV: isa}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"exit {run.returncode} (negative: killed by that signal)\n{run.stdout[-3000:]}{run.stderr[-2000:]}"
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
