"""python -m kernels.aot [--update-ledger] [--recompile] [--jobs N] [--report PATH]

Builds the launch matrix for sm_90 and sm_80, takes each configuration's resources from the ledger
or compiles it (always the default model's bf16 configurations, as a spot check), applies the
limits (kernels/aot/limits.py) and prints what fails. Exit status: 0 all pass and the ledger is
current; 1 a kernel fails the limits or does not compile; 2 the ledger is out of date (run
``make kernels-doc``) or disagrees with a fresh compile.
"""

from __future__ import annotations

import os
import sys
import tempfile

# Before Triton is imported: the real compiler, not the interpreter, and none of Triton's settings
# (they enter the compile hashes the ledger is keyed by, e.g. TRITON_DEFAULT_FP_FUSION). Compiles go
# to a scratch cache: the gate compiles fresh anyway, and ~/.triton stays the user's.
for _name in [n for n in os.environ if n.startswith("TRITON_")]:
    del os.environ[_name]
_scratch = tempfile.TemporaryDirectory(prefix="mstar-aot-")
os.environ["TRITON_CACHE_DIR"] = _scratch.name

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

from kernels.aot import gate, ledger  # noqa: E402
from kernels.aot.limits import GPUS  # noqa: E402
from kernels.shapes import SUPPORTED  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.aot", description=__doc__.splitlines()[0])
    parser.add_argument("--update-ledger", action="store_true", help="rewrite kernels/aot/ledger.json for the current matrix")
    parser.add_argument("--recompile", action="store_true", help="compile every configuration, ignoring the ledger")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes (default: all cores)")
    parser.add_argument("--report", help="write every configuration's outcome as JSON here")
    parser.add_argument("--ledger", type=Path, default=ledger.PATH, help="the ledger to read (and update)")
    parser.add_argument("--models", nargs="+", metavar="NAME", help="only these models (kernels/shapes.py names)")
    parser.add_argument("--archs", nargs="+", choices=[g.arch for g in GPUS], help="only these targets")
    args = parser.parse_args(argv)
    partial = bool(args.models or args.archs)
    if partial and args.update_ledger:
        parser.error("--update-ledger needs the whole matrix (no --models/--archs)")
    models = [m for m in SUPPORTED if not args.models or m.name in args.models]
    if args.models and len(models) != len(args.models):
        parser.error(f"--models: known models are {', '.join(m.name for m in SUPPORTED)}")
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")

    start = time.perf_counter()
    configs = gate.collect(tuple(g for g in GPUS if not args.archs or g.arch in args.archs), models=models)
    stored = ledger.load(args.ledger)
    collected = time.perf_counter()
    outcomes = gate.evaluate(configs, stored, args.jobs, recompile=args.recompile)
    compiled = [o for o in outcomes if o.compiled]
    print(f"kernels.aot: {len(configs)} configurations ({sum(c.gpu.arch == 'sm_90' for c in configs)} sm_90, "
          f"{sum(c.gpu.arch == 'sm_80' for c in configs)} sm_80) in {collected - start:.1f} s; compiled "
          f"{len(compiled)} ({sum(o.seconds for o in compiled):.1f} s of compiler time, {args.jobs} processes) "
          f"in {time.perf_counter() - collected:.1f} s, the rest from the ledger")

    failed = [o for o in outcomes if o.problems or o.disagreements]
    for o in failed:
        c = o.config
        print(f"FAIL {c.kernel} [{c.gpu.arch}, {c.dtype}, {_meta(c.meta)}, warps {c.spec.num_warps}, "
              f"stages {c.spec.num_stages}] ({', '.join(sorted(c.models))}):")
        for problem in o.problems + o.disagreements:
            print(f"    {problem}")
    if args.report:
        with open(args.report, "w") as f:
            json.dump([o.to_json() for o in outcomes], f, indent=1)

    missing, stale = gate.ledger_diff(configs, stored)
    if partial:
        stale = set()  # a partial matrix cannot tell a stale entry from another model's
    if args.update_ledger:
        import triton

        ledger.save({o.config.spec.key: (o.config.kernel, o.config.gpu.arch, o.resources) for o in outcomes},
                    triton.__version__, args.ledger)
        print(f"kernels.aot: wrote {args.ledger} ({len(outcomes)} entries; {len(missing)} new, {len(stale)} dropped)")
        missing, stale = [], set()
    if missing or stale:
        print(f"kernels.aot: the ledger is out of date ({len(missing)} configurations missing, {len(stale)} stale "
              "entries): run `make kernels-doc` and commit kernels/aot/ledger.json and docs/kernels.md")
    if any(o.problems for o in failed):
        print(f"kernels.aot: {sum(bool(o.problems) for o in failed)} of {len(outcomes)} configurations fail the limits")
        return 1
    if failed and not args.update_ledger:  # the ledger disagreed with a fresh compile (an update rewrote it)
        print(f"kernels.aot: the ledger disagrees with the compiler on {len(failed)} configurations")
        return 2
    if missing or stale:
        return 2
    print(f"kernels.aot: all {len(outcomes)} configurations compile within the limits")
    return 0


def _meta(meta: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in meta.items())


if __name__ == "__main__":
    sys.exit(main())
