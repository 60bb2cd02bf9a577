"""Speculative decoding by prompt lookup on the default model, engine alone: off vs ngram.

    .venv/bin/python -m bench.speculation [--new-tokens 128] [--rounds 3] [--no-write]

Workloads, greedy, chat-templated prompts (the preprocess service's template and tokenizer):
copy-heavy (repeat a given passage), edit (rewrite the passage with one change), ordinary (an
open question, where little of the output is in the prompt), each at 1 stream, and the ordinary
one at 16 streams (speculation turns itself off above max_rows decoding sequences). Per workload
the modes take turns for --rounds rounds and each keeps its best; tokens/s counts generated tokens
over the wall time from the first step to the last. The outputs of both modes must be identical
(greedy speculation is exact): the bench fails otherwise. Writes docs/benchmarks.md's
`speculation` section.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench import doc_sections
from bench.engine import machine, make_runner
from services.generation.engine import Engine, EngineConfig
from services.generation.sampling_params import SamplingParams
from services.generation.speculation import SpeculationConfig
from services.generation.weights.locate import load_checkpoint
from services.preprocess.chat_template import ChatMessage
from services.preprocess.model import load_model

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, "
           "polished the great lens, and wrote the weather in a leather logbook: wind from the west, "
           "light rain, three ships passing north. In forty years he had never missed a night, and the "
           "fishermen of the village said they could set their clocks by the moment his lamp came on.")
WORKLOADS = {
    "copy": f"Repeat the following passage exactly, word for word:\n\n{PASSAGE}",
    "edit": f"Rewrite the following passage, changing 'lighthouse keeper' to 'old sailor' and nothing else:\n\n{PASSAGE}",
    "ordinary": "Write a short story about a robot who learns to paint.",
}


def chat_ids(spec, text: str) -> list[int]:
    return spec.tokenizer.encode(spec.chat_template.render([ChatMessage("user", text)]))


def run(runner, prompts: list[list[int]], new_tokens: int, mode: str) -> tuple[float, list, dict]:
    config = EngineConfig(num_blocks=runner.config.num_blocks, block_size=runner.config.block_size, max_num_seqs=64,
                          max_num_batched_tokens=2048, speculation=SpeculationConfig(mode))
    engine = Engine(runner, config, on_step=lambda out: None)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
    for i, p in enumerate(prompts):
        engine.add_request(i, p, params)
    tokens: dict = {}
    start = None
    while engine.seqs or not engine._commands.empty():
        out = engine.run_once()
        for t in out.tokens:
            tokens.setdefault(t.key, []).append(t.token_id)
        if start is None and out.tokens:
            start = time.perf_counter()  # decode from the first token on: prefill is the same work
    seconds = time.perf_counter() - start
    generated = sum(len(v) for v in tokens.values()) - len(prompts)
    s = engine.stats
    return generated / seconds, [tokens[i] for i in range(len(prompts))], {
        "proposed": s.num_spec_proposed, "accepted": s.num_spec_accepted}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    spec = load_model("default")
    runner = make_runner("default", load_checkpoint("default"), __import__("torch").device("cpu"), args.threads)
    cases = [(name, 1) for name in WORKLOADS] + [("ordinary", 16)]
    rows = []
    for name, streams in cases:
        prompts = [chat_ids(spec, WORKLOADS[name] + ("" if i == 0 else f" (variant {i})")) for i in range(streams)]
        best = {"off": 0.0, "ngram": 0.0}
        outputs, counts = {}, {}
        for _ in range(args.rounds):
            for mode in ("off", "ngram"):
                rate, out, count = run(runner, prompts, args.new_tokens, mode)
                best[mode] = max(best[mode], rate)
                outputs[mode], counts[mode] = out, count
        if outputs["off"] != outputs["ngram"]:
            raise SystemExit(f"{name}: speculation changed the greedy output")
        c = counts["ngram"]
        rate = c["accepted"] / c["proposed"] if c["proposed"] else 0.0
        rows.append((name, streams, best["off"], best["ngram"], c["proposed"], rate))
        print(f"{name:9s} x{streams:<3d} off {best['off']:7.1f} tok/s  ngram {best['ngram']:7.1f} tok/s  "
              f"{best['ngram'] / best['off']:.2f}x  proposed {c['proposed']} accepted {rate:.0%}", flush=True)
    body = render(rows, args)
    print(body)
    if not args.no_write:
        doc_sections.write(DOC, "speculation", body)


def render(rows, args) -> str:
    lines = [f"Measured on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine(__import__('torch').device('cpu'))}, "
             f"{args.threads} threads. Engine alone, the default model (`make run`'s numerics), greedy, "
             f"{args.new_tokens} new tokens at most, chat-templated prompts; best of {args.rounds} alternating rounds; "
             "outputs identical in both modes. `python -m bench.speculation`.", "",
             "| workload | streams | off tok/s | ngram tok/s | ratio | proposed | accepted |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, streams, off, ngram, proposed, rate in rows:
        lines.append(f"| {name} | {streams} | {off:.1f} | {ngram:.1f} | {ngram / off:.2f}x | {proposed} | {rate:.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
