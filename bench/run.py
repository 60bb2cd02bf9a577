"""`make bench`: mstar against its peers in one run, then docs/benchmarks.md + plots.

    python -m bench.run                 # QUICK settings, < 10 min on 2 cores
    python -m bench.run --full          # the whole sweep (1..32 streams, 3 Poisson rates, 1..64 transport)
    python -m bench.run --only mstar,hf # a subset (the doc is still rewritten from what ran)

Order: HF (its own process), llama-server (if built), mstar, transport, streamed input; one
system at a time so none competes with another for the two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from bench import procs, targets
from bench.plots import plot_all
from bench.prompts import PromptSource
from bench.report import render
from bench.settings import FULL, QUICK

DOCS = procs.ROOT / "docs"
PARTS = ("hf", "llama", "mstar", "transport", "streamed")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=procs.ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(procs.ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the whole sweep (tens of minutes)")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    ap.add_argument("--json", type=Path, default=DOCS / "benchmarks.json")
    ap.add_argument("--doc", type=Path, default=DOCS / "benchmarks.md")
    args = ap.parse_args(argv)
    s = FULL if args.full else QUICK
    only = set(args.only.split(","))
    from services.generation.weights.locate import default_model_path

    gguf = default_model_path()
    prompts = PromptSource(s.prompt_words)
    t0 = time.time()
    results: dict = {"meta": {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "full": args.full, "commit": _commit(), "cpu": _cpu_name(),
        "cores": os.cpu_count(), "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "gguf": Path(gguf).name, "settings": s.as_dict(), "json": _rel(args.json),
    }}
    steps = [("hf", "hf_generate", lambda: targets.hf(s)),
             ("llama", "llama_server", lambda: targets.llama(s, prompts, gguf)),
             ("mstar", "mstar", lambda: targets.mstar(s, prompts)),
             ("transport", "transport", lambda: targets.transport(s)),
             ("streamed", "streamed_input", lambda: targets.streamed_input(s))]
    for part, key, fn in steps:
        if part not in only:
            continue
        prompts.reset()  # every system gets the same prompt sequence
        try:
            results[key] = fn()
        except Exception as e:  # one broken system must not cost the others' numbers
            targets.log(f"{key} failed: {type(e).__name__}: {e}")
            results[key] = {"skipped": f"failed: {type(e).__name__}: {str(e)[:300]}"}
    results["meta"]["duration_s"] = time.time() - t0
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    plots = [p.name for p in plot_all(results, args.doc.parent)]
    args.doc.write_text(render(results, plots))
    targets.log(f"wrote {args.doc}, {args.json} and {len(plots)} plots in {results['meta']['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
