"""`make bench`: mstar against its peers in one run, then docs/benchmarks.md + plots.

    python -m bench.run                 # QUICK settings, ~10 min on a quiet 2-core box
    python -m bench.run --full          # the whole sweep (1..64 streams, 3 Poisson rates, 1..64 transport)
    python -m bench.run --only compare  # a subset (the doc is still rewritten from what ran)
    python -m bench.run --concurrency 1,4 --max-tokens 8 --variants fp32 --rounds 1 --no-cold-start   # a smoke
    python -m bench.run --model gemma3-270m --doc docs/benchmarks-gemma3.md --json docs/benchmarks-gemma3.json

Order: the comparison (mstar through Envoy, llama-server if built, HF generate; all up, measured
in turns per level, see bench/compare.py), then the transport ceiling, then streamed input.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from bench import doc_sections, procs, targets
from bench.compare import compare
from bench.plots import plot_all
from bench.report import render
from bench.settings import FULL, QUICK

DOCS = procs.ROOT / "docs"
PARTS = ("compare", "transport", "streamed")


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


def run_meta() -> dict:
    """When, on what and at which commit a benchmark ran: the fields every report's first line shows."""
    return {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "commit": _commit(), "cpu": _cpu_name(),
            "cores": os.cpu_count(), "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(procs.ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the whole sweep (tens of minutes)")
    ap.add_argument("--model", default="default", help="a packaged model every peer serves (default, gemma3-270m); "
                                                       "write to another --doc and --json")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    ap.add_argument("--json", type=Path, default=DOCS / "benchmarks.json")
    ap.add_argument("--doc", type=Path, default=DOCS / "benchmarks.md")
    ap.add_argument("--concurrency", help="override the comparison's levels, e.g. 1,16")
    ap.add_argument("--rounds", type=int, help="override the comparison's rounds")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], help="mstar's --dtype (default auto)")
    ap.add_argument("--quantization", choices=["auto", "gguf", "none"], help="mstar's --quantization (default auto)")
    ap.add_argument("--variants", help="mstar numerics variants to run as extra rows: a comma list of names in "
                                       "bench/settings.py (fp32, bf16), or none")
    ap.add_argument("--max-tokens", type=int, help="new tokens per request (default 64)")
    ap.add_argument("--no-cold-start", action="store_true",
                    help="start mstar once on its own Inductor cache (no cold start, no warm restart)")
    ap.add_argument("--mstar-threads", help="mstar's --threads: a number, or auto for its own default "
                                            "(default: the same as every peer's)")
    args = ap.parse_args(argv)
    s = FULL if args.full else QUICK
    if args.concurrency:
        s.concurrency = s.hf_batches = [int(x) for x in args.concurrency.split(",")]
        s.grpc_concurrency = [max(s.concurrency)]
    if args.rounds:
        s.rounds = args.rounds
    if args.dtype:
        s.dtype = args.dtype
    if args.quantization:
        s.quantization = args.quantization
    if args.variants is not None:
        names = set(args.variants.split(",")) - {"none", ""}
        unknown = names - {v["name"] for v in s.variants}
        if unknown:
            ap.error(f"unknown variants {sorted(unknown)}; known: {[v['name'] for v in s.variants]}")
        s.variants = [v for v in s.variants if v["name"] in names]
    if args.max_tokens:
        s.max_tokens = args.max_tokens
    if args.mstar_threads:
        s.mstar_threads = args.mstar_threads
    if args.no_cold_start:
        s.cold_start = False
    only = set(args.only.split(","))
    from services.common.packaged_models import packaged_model_path

    s.model = args.model
    gguf = packaged_model_path(args.model)
    t0 = time.time()
    results: dict = {"meta": {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "full": args.full, "commit": _commit(), "cpu": _cpu_name(),
        "cores": os.cpu_count(), "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "gguf": Path(gguf).name, "model": args.model, "settings": s.as_dict(), "json": _rel(args.json),
    }}
    steps = [("compare", lambda: compare(s, gguf)),
             ("transport", lambda: {"transport": targets.transport(s)}),
             ("streamed", lambda: {"streamed_input": targets.streamed_input(s)})]
    for part, fn in steps:
        if part not in only:
            continue
        try:
            results.update(fn())
        except Exception as e:  # one broken part must not cost the others' numbers
            targets.log(f"{part} failed: {type(e).__name__}: {e}")
            key = {"compare": "mstar", "transport": "transport", "streamed": "streamed_input"}[part]
            results[key] = {"skipped": f"failed: {type(e).__name__}: {str(e)[:300]}"}
    results["meta"]["duration_s"] = time.time() - t0
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    main_doc = args.doc.name == "benchmarks.md"  # other docs get their own plot names, no fp32 notes
    plots = [p.name for p in plot_all(results, args.doc.parent, "bench" if main_doc else args.doc.stem)]
    args.doc.write_text(doc_sections.carried(args.doc, render(results, plots, notes=main_doc)))  # keeps bench.fairness's
    targets.log(f"wrote {args.doc}, {args.json} and {len(plots)} plots in {results['meta']['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
