"""Write the generated tables of docs/kernels.md: the AOT compile report and the static roofline.

    python -m bench.kernel_doc [--report PATH] [--check]     (make kernels-doc runs the gate first)

The compile table comes from a gate report (``python -m kernels.aot --report PATH``: every
configuration, its models and its ptxas numbers) or, without ``--report``, from the launch matrix
joined with the ledger; the roofline table is bench/roofline.py's default shapes. ``--check``
exits 1 when docs/kernels.md differs from what would be written, naming the section.
"""

from __future__ import annotations

import os
import sys

# The compile matrix needs Triton's real JIT functions, not the interpreter's, and hashes that
# no TRITON_* setting has changed (the ledger is keyed by them).
for _name in [n for n in os.environ if n.startswith("TRITON_")]:
    del os.environ[_name]

import argparse  # noqa: E402
import json  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

from bench import doc_sections, roofline  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "kernels.md"
_SHORT = {"_paged_attention_kernel": "paged_attention", "_reduce_splits_kernel": "reduce_splits",
          "_rms_norm_kernel": "rms_norm", "_rotary_kernel": "rotary", "_silu_and_mul_kernel": "silu_and_mul",
          "_store_kv_kernel": "store_kv", "_sample_kernel": "sample"}
_HIDDEN_META = {"FP32_IEEE", "UPCAST"}  # implied by the dtype on a GPU


def report_from_ledger() -> list[dict]:
    from kernels.aot import gate, ledger

    configs = gate.collect()
    stored = ledger.load()
    missing, _ = gate.ledger_diff(configs, stored)
    if missing:
        raise SystemExit(f"kernel_doc: {len(missing)} configurations are not in the ledger: run "
                         "`python -m kernels.aot --update-ledger` first (make kernels-doc does)")
    return [o.to_json() for o in gate.from_ledger(configs, stored)]


def compile_table(report: list[dict]) -> str:
    from kernels.aot import limits
    from kernels.aot.build import Resources

    rows: dict[tuple, dict[str, tuple]] = {}
    for entry in report:
        kernel, meta = entry["kernel"], entry["meta"]
        label = " ".join(_meta_item(k, v) for k, v in meta.items() if k not in _HIDDEN_META)
        if kernel == "_paged_attention_kernel":
            label = ("decode: " if meta["BLOCK_Q"] * meta["GROUP_PAD"] <= 16 else "prefill: ") + label
        row = (_SHORT.get(kernel, kernel), entry["dtype"], label, entry["num_warps"], entry["num_stages"],
               ", ".join(entry["models"]))
        if entry["arch"] in rows.setdefault(row, {}):
            raise SystemExit(f"kernel_doc: two {entry['arch']} compiles share the row {row}; add what tells them apart")
        rows[row][entry["arch"]] = (entry, Resources.from_json(entry["resources"]))
    header = ["kernel", "dtype", "config", "warps", "stages", "models"]
    for gpu in limits.GPUS:
        header += [f"{gpu.arch} regs", "spills", "smem", "warps/SM"]
    header += ["needs warps/SM (regs)"]
    align = ["---"] * 6 + ["---:", "---:", "---:", "---"] * len(limits.GPUS) + ["---"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for row in sorted(rows, key=_order):
        cells = [f"`{row[0]}`", row[1], row[2], str(row[3]), str(row[4]), row[5]]
        need = ""
        for gpu in limits.GPUS:
            if gpu.arch not in rows[row]:
                cells += ["-"] * 4
                continue
            entry, res = rows[row][gpu.arch]
            warps, limiter = limits.resident_warps(res.regs, res.smem, entry["num_warps"], gpu)
            spills = "0" if not (res.spill_stores or res.stack) else f"{res.spill_stores} B (stack {res.stack} B)"
            cells += [str(res.regs) if not res.error else "error", spills, _kb(res.smem), f"{warps} ({limiter})"]
            need_warps = limits.min_warps(entry["kernel"], entry["meta"])
            need = f"{need_warps} (≤ {limits.register_bound(need_warps)})"
        lines.append("| " + " | ".join(cells + [need]) + " |")
    return "\n".join(lines)


def _meta_item(key: str, value: object) -> str:
    return key if value is True else f"{key}=0" if value is False else f"{key}={value}"


def _order(row: tuple) -> tuple:
    kernels = list(_SHORT.values())
    return (kernels.index(row[0]) if row[0] in kernels else 99, row[1], row[2], row[5])


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KB" if n >= 1024 else f"{n} B"


def sections(report: list[dict]) -> dict[str, str]:
    return {"aot": compile_table(report), "roofline": roofline.render(roofline.default_rows())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kernel_doc", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/kernels.md is out of date")
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--report", type=Path, help="a `python -m kernels.aot --report` file (else: matrix + ledger)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
    wanted = sections(json.loads(args.report.read_text()) if args.report else report_from_ledger())
    if args.check:
        stale = [name for name, body in wanted.items() if doc_sections.read(args.doc, name) != body]
        if stale:
            print(f"kernel_doc: the {', '.join(stale)} section(s) of {args.doc} are out of date: run `make kernels-doc`")
            return 1
        print(f"kernel_doc: {args.doc} is up to date")
        return 0
    for name, body in wanted.items():
        doc_sections.write(args.doc, name, body)
    print(f"kernel_doc: wrote the {', '.join(wanted)} sections of {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
