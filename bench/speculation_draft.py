"""Speculative decoding by a draft model on the default model (engine alone): off vs ngram vs draft.

    .venv/bin/python -m bench.speculation_draft [--new-tokens 128] [--rounds 2] [--layers 4 8] [--no-write]

No package index here ships a smaller model with SmolLM2's tokenizer, so the drafts are built from
the target itself:
- ``first-N``: the target's first N decoder layers, its final norm and its (tied) head, i.e. an
  untrained early exit (LayerSkip-style self-speculation, without LayerSkip's training);
- ``target``: the target as its own draft, which proposes what it will accept (the mechanism's
  ceiling on acceptance, at a draft as costly as the target).
Both run through the same engine code as any --draft-model (draft.py). Workloads and timing as
bench/speculation.py (1 stream, greedy and seeded sampling); outputs must be identical in every
mode, or the bench fails. Writes docs/benchmarks.md's `speculation-draft` section.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import time
from pathlib import Path

import torch

from bench import doc_sections
from bench.engine import machine, make_runner
from bench.speculation import chat_ids, prompt_text
from services.generation.engine import Engine, EngineConfig
from services.generation.sampling_params import SamplingParams
from services.generation.speculation import SpeculationConfig
from services.generation.weights.locate import load_checkpoint
from services.preprocess.model import load_model

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
CASES = [("copy", 0.0), ("edit", 0.0), ("ordinary", 0.0), ("copy", 0.7), ("ordinary", 0.7)]
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def first_layers(checkpoint, n: int):
    """The checkpoint cut to its first n decoder layers (norm and head kept)."""
    def keep(name: str) -> bool:
        m = _LAYER.match(name)
        return m is None or int(m.group(1)) < n

    config = dataclasses.replace(checkpoint.config, num_layers=n,
                                 layer_types=checkpoint.config.layer_types[:n] if checkpoint.config.layer_types else
                                 checkpoint.config.layer_types)
    return dataclasses.replace(checkpoint, name=f"{checkpoint.name}-first-{n}", config=config,
                               tensors={k: v for k, v in checkpoint.tensors.items() if keep(k)},
                               blocks={k: v for k, v in checkpoint.blocks.items() if keep(k)})


def run(runner, draft, prompt: list[int], new_tokens: int, mode: str, temperature: float):
    config = EngineConfig(num_blocks=runner.config.num_blocks, block_size=runner.config.block_size, max_num_seqs=64,
                          max_num_batched_tokens=2048, speculation=SpeculationConfig(mode))
    engine = Engine(runner, config, on_step=lambda out: None, draft=draft if mode == "draft" else None)
    engine.add_request(0, prompt, SamplingParams(temperature=temperature, seed=0, max_tokens=new_tokens))
    tokens, start = [], None
    while engine.seqs or not engine._commands.empty():
        out = engine.run_once()
        tokens += [t.token_id for t in out.tokens]
        if start is None and out.tokens:
            start = time.perf_counter()  # decode from the first token on: prefill is the same work
    rate = (len(tokens) - 1) / (time.perf_counter() - start)
    s = engine.stats
    return rate, tokens, s.num_spec_accepted / s.num_spec_proposed if s.num_spec_proposed else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    spec = load_model("default")
    checkpoint = load_checkpoint("default")
    device = torch.device("cpu")
    runner = make_runner("default", checkpoint, device, args.threads)
    drafts = {f"first-{n}": make_runner("default", first_layers(checkpoint, n), device, args.threads)
              for n in args.layers}
    drafts["target"] = make_runner("default", checkpoint, device, args.threads)
    del checkpoint
    modes = [("off", None), ("ngram", None)] + [("draft", name) for name in drafts]
    rows = []
    for name, temperature in CASES:
        prompt = chat_ids(spec, prompt_text(name, 0))
        best = {m: (0.0, 0.0) for m in modes}
        outputs = {}
        for _ in range(args.rounds):
            for mode, draft in modes:
                rate, out, accepted = run(runner, drafts.get(draft), prompt, args.new_tokens, mode, temperature)
                best[(mode, draft)] = (max(best[(mode, draft)][0], rate), accepted)
                outputs[(mode, draft)] = out
        if any(out != outputs[("off", None)] for out in outputs.values()):
            raise SystemExit(f"{name} at temperature {temperature}: speculation changed the output")
        rows.append((name, temperature, best))
        print(name, temperature, {f"{m}:{d}": f"{r:.1f} tok/s {a:.0%}" for (m, d), (r, a) in best.items()}, flush=True)
    body = render(rows, modes, args)
    print(body)
    if not args.no_write:
        doc_sections.write(DOC, "speculation-draft", body)


def render(rows, modes, args) -> str:
    names = ["ngram" if m == "ngram" else f"draft {d}" for m, d in modes[1:]]
    lines = [f"Measured on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine(torch.device('cpu'))}, "
             f"{args.threads} threads. The default model, 1 stream, {args.new_tokens} new tokens at most, best of "
             f"{args.rounds} alternating rounds, outputs identical in every mode. Each cell: tok/s, its ratio to off, "
             "the accepted share of proposals. `python -m bench.speculation_draft`.", "",
             "| workload | temperature | off tok/s | " + " | ".join(names) + " |",
             "|---|---:|---:|" + "---:|" * len(names)]
    for name, temperature, best in rows:
        off = best[modes[0]][0]
        cells = [f"{r:.1f} ({r / off:.2f}x, {a:.0%})" for r, a in (best[m] for m in modes[1:])]
        lines.append(f"| {name} | {temperature:g} | {off:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
