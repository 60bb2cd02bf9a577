"""Speculative decoding by prompt lookup on the default model: off vs ngram, engine alone and
through the stack (`make bench` runs both).

    .venv/bin/python -m bench.speculation [--new-tokens 128] [--rounds 3] [--no-stack] [--no-write]

Workloads, chat-templated prompts (the preprocess service's template and tokenizer): copy-heavy
(repeat a given passage), edit (rewrite the passage with one change), ordinary (an open question,
where little of the output is in the prompt), greedy and seeded sampling (temperature 0.7), at 1
stream, and the ordinary one at 16 streams (speculation turns itself off above max_rows decoding
sequences). Per workload the modes take turns for --rounds rounds and each keeps its best;
tokens/s counts generated tokens over the wall time from the first token to the last (prefill is
the same work). Both modes' outputs must be identical (speculation is exact, seed for seed): the
bench fails otherwise.

Through the stack (bench/speculation_stack.py): `make run`'s stack, native gRPC through Envoy, the
same workloads with the request field `speculative: false` against unset (the server's policy),
one stack, requests taking turns. Writes docs/benchmarks.md's `speculation` section.
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


CASES = [("copy", 1, 0.0), ("edit", 1, 0.0), ("ordinary", 1, 0.0), ("copy", 1, 0.7), ("ordinary", 1, 0.7),
         ("ordinary", 16, 0.0)]  # (workload, streams, temperature)


def prompt_text(name: str, i: int) -> str:
    return WORKLOADS[name] + ("" if i == 0 else f" (variant {i})")


def run(runner, prompts: list[list[int]], new_tokens: int, mode: str, temperature: float) -> tuple[float, list, dict]:
    config = EngineConfig(num_blocks=runner.config.num_blocks, block_size=runner.config.block_size, max_num_seqs=64,
                          max_num_batched_tokens=2048, speculation=SpeculationConfig(mode))
    engine = Engine(runner, config, on_step=lambda out: None)
    for i, p in enumerate(prompts):
        engine.add_request(i, p, SamplingParams(temperature=temperature, seed=i, max_tokens=new_tokens))
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
    ap.add_argument("--no-stack", action="store_true", help="the engine alone only")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    spec = load_model("default")
    runner = make_runner("default", load_checkpoint("default"), __import__("torch").device("cpu"), args.threads)
    rows = []
    for name, streams, temperature in CASES:
        prompts = [chat_ids(spec, prompt_text(name, i)) for i in range(streams)]
        best = {"off": 0.0, "ngram": 0.0}
        outputs, counts = {}, {}
        for _ in range(args.rounds):
            for mode in ("off", "ngram"):
                rate, out, count = run(runner, prompts, args.new_tokens, mode, temperature)
                best[mode] = max(best[mode], rate)
                outputs[mode], counts[mode] = out, count
        if outputs["off"] != outputs["ngram"]:
            raise SystemExit(f"{name} at temperature {temperature}: speculation changed the output")
        c = counts["ngram"]
        rate = c["accepted"] / c["proposed"] if c["proposed"] else 0.0
        rows.append((name, streams, temperature, best["off"], best["ngram"], c["proposed"], rate))
        print(f"{name:9s} x{streams:<3d} T={temperature} off {best['off']:7.1f} tok/s  ngram {best['ngram']:7.1f} tok/s  "
              f"{best['ngram'] / best['off']:.2f}x  proposed {c['proposed']} accepted {rate:.0%}", flush=True)
    del runner  # the stack's generation process gets the cores and the memory
    stack_rows = None
    if not args.no_stack:
        from bench.speculation_stack import measure_stack

        stack_rows = measure_stack(CASES, prompt_text, args.new_tokens, args.rounds, args.threads)
    body = render(rows, stack_rows, args)
    print(body)
    if not args.no_write:
        doc_sections.write(DOC, "speculation", body)


def render(rows, stack_rows, args) -> str:
    lines = [f"Measured on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine(__import__('torch').device('cpu'))}, "
             f"{args.threads} threads. The default model (`make run`'s numerics), {args.new_tokens} new tokens at "
             f"most, chat-templated prompts, sampled rows seeded; best of {args.rounds} alternating rounds; outputs "
             "identical in both modes. `python -m bench.speculation` (part of `make bench`).", "",
             "Engine alone:", "",
             "| workload | streams | temperature | off tok/s | ngram tok/s | ratio | proposed | accepted |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, streams, temperature, off, ngram, proposed, rate in rows:
        lines.append(f"| {name} | {streams} | {temperature:g} | {off:.1f} | {ngram:.1f} | {ngram / off:.2f}x | "
                     f"{proposed} | {rate:.0%} |")
    if stack_rows:
        lines += ["", "Through the stack (`make run`, native gRPC `GenerateStream` through Envoy, one stack; "
                  "`speculative: false` against unset, requests taking turns; tok/s per stream from its first "
                  "token to its last, summed over streams):", "",
                  "| workload | streams | temperature | off tok/s | policy tok/s | ratio |", "|---|---:|---:|---:|---:|---:|"]
        for name, streams, temperature, off, on in stack_rows:
            lines.append(f"| {name} | {streams} | {temperature:g} | {off:.1f} | {on:.1f} | {on / off:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
