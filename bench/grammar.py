"""Structured output's cost in the engine: JSON-schema-constrained vs free decoding, same batch.

    .venv/bin/python -m bench.grammar [--models tiny default] [--batch 16] [--new-tokens 64]
                                      [--rounds 3] [--threads 1] [--no-write]

Per model (the tiny random Llama with its synthetic 347-token vocabulary, and the default
SmolLM2-135M with its 49,152-token byte-level vocabulary), in one process, two engines on two
runners of the same weights, stepped in lockstep (one step each in turn, who goes first
alternating) so that the shared box's changing load hits both alike:

- free: B requests, seeded sampling (temperature 1), EOS ignored, N new tokens each;
- json: the same prompts and seeds, each constrained by one JSON schema (a cache hit after the
  first round) whose strings have minimum lengths, so every request is still inside its document
  after N tokens and both runs decode the same number of steps.

Decode tok/s counts only the steps in which all B requests decoded one token (prefill excluded),
and the ratio json / free is taken within a round. The mask overhead per step is what
grammar/bitmask.py spent filling (xgrammar matchers) and applying (-inf on disallowed logits) in
those steps. Then: compile latency (cold: first compile, which builds xgrammar's TokenizerInfo;
warm: another schema; a cache hit), and the apply kernels side by side on a [B, V] batch: the
[256, 8] lookup table used here, xgrammar's CPU kernel, and xgrammar's torch path.
Writes the results section of docs/benchmarks-grammar.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time

import torch

from bench.engine import machine, prompts
from services.common.structured_output import StructuredOutput
from services.generation.engine import Engine, EngineConfig
from services.generation.grammar.bitmask import apply_bitmask, apply_bitmask_by_table
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.sampling_params import SamplingParams

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "benchmarks-grammar.md")
START, END = "<!-- results:start -->", "<!-- results:end -->"
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 60},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "summary": {"type": "string", "minLength": 200},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
    "required": ["title", "year", "summary", "tags"],
}


def load(model: str):
    if model == "tiny":
        from services.generation.weights.random_init import TINY, random_checkpoint

        return random_checkpoint(TINY, seed=0)
    from services.generation.weights.locate import load_checkpoint

    return load_checkpoint(model)


class Run:
    """One engine on its own runner, stepped by the caller; counts its pure decode steps."""

    def __init__(self, runner: ModelRunner, batch: int, new_tokens: int, constrained: bool):
        self.runner, self.batch, self.new_tokens = runner, batch, new_tokens
        config = EngineConfig(num_blocks=runner.config.num_blocks, block_size=runner.config.block_size,
                              max_num_seqs=batch, max_num_batched_tokens=2048)
        self.engine = Engine(runner, config, on_step=lambda out: None)
        so = StructuredOutput.from_json_schema(SCHEMA) if constrained else None
        for i, prompt in enumerate(prompts(batch, 32)):
            params = SamplingParams(temperature=1.0, seed=i, max_tokens=new_tokens, ignore_eos=True,
                                    structured_output=so)
            self.engine.add_request(i, [t % runner.vocab_size for t in prompt], params)
        self.steps, self.seconds, self.fill, self.apply, self.accept, self.produced = 0, 0.0, 0.0, 0.0, 0.0, 0

    @property
    def is_done(self) -> bool:
        return not self.engine.seqs and self.engine._commands.empty()

    def step(self) -> None:
        masks = self.runner.sampler.token_masks
        before = (masks.fill_seconds, masks.apply_seconds, self.engine.grammars.advance_seconds)
        start = time.perf_counter()
        out = self.engine.run_once(0.01)
        dt = time.perf_counter() - start
        assert not out.failed, out.failed
        self.produced += len(out.tokens)
        if out.num_batched_tokens == self.batch and len(out.tokens) == self.batch:  # a pure decode step
            self.steps, self.seconds = self.steps + 1, self.seconds + dt
            self.fill += masks.fill_seconds - before[0]
            self.apply += masks.apply_seconds - before[1]
            self.accept += self.engine.grammars.advance_seconds - before[2]

    def result(self) -> tuple[float, float, float, float]:
        """(decode tok/s, then ms per decode step: mask fill, mask apply, matchers accepting)."""
        assert self.produced == self.batch * self.new_tokens, "every request must run its N tokens"
        self.engine.grammars.close()
        per_step = [1000 * x / self.steps for x in (self.fill, self.apply, self.accept)]
        return (self.batch * self.steps / self.seconds, *per_step)


def decode_round(runners: tuple[ModelRunner, ModelRunner], batch: int, new_tokens: int):
    """Free and JSON runs in lockstep, one step each in turn (who goes first alternates), so a change
    in the box's load hits both alike. Returns (free tok/s, json tok/s, fill, apply, accept ms/step)."""
    free = Run(runners[0], batch, new_tokens, constrained=False)
    constrained = Run(runners[1], batch, new_tokens, constrained=True)
    turn = 0
    while not (free.is_done and constrained.is_done):
        for run in ((free, constrained) if turn % 2 == 0 else (constrained, free)):
            if not run.is_done:
                run.step()
        turn += 1
    return (free.result()[0], *constrained.result())


def compile_latency(runner: ModelRunner) -> dict[str, float]:
    engine = Engine(runner, EngineConfig(), on_step=lambda out: None)
    out = {}
    for name, so in (("first in the process (imports xgrammar, builds TokenizerInfo)",
                      StructuredOutput.from_json_schema(SCHEMA)),
                     ("warm (another schema)", StructuredOutput.from_json_schema(SCHEMA | {"required": ["title"]})),
                     ("cache hit", StructuredOutput.from_json_schema(SCHEMA))):
        start = time.perf_counter()
        engine.grammars.compiler.submit(so).result()
        out[name] = 1000 * (time.perf_counter() - start)
    engine.grammars.close()
    return out


def apply_kernels(batch: int, vocab: int, repeats: int = 30) -> dict[tuple[str, str], float]:
    """ms per call of each way of applying a [batch, vocab] bitmask, for each kind of mask."""
    import xgrammar as xgr

    g = torch.Generator().manual_seed(0)
    words = (vocab + 31) // 32
    allowed = torch.full((batch, words), -1, dtype=torch.int32)  # inside a JSON string: a few tokens out
    allowed[:, :2] = 0
    blocked = torch.zeros((batch, words), dtype=torch.int32)  # between JSON tokens: a few tokens in
    blocked[:, 5] = 12345
    masks = {"mostly allowed": allowed, "mostly blocked": blocked,
             "random bits": torch.randint(-(2**31), 2**31 - 1, (batch, words), dtype=torch.int32, generator=g)}
    logits = torch.randn(batch, vocab, generator=g)
    rows = list(range(batch))
    out = {}
    for mask_name, bitmask in masks.items():
        ways = {
            "mstar (per row: xgrammar kernel or table)": lambda b=bitmask: apply_bitmask(logits, b, rows),
            "[256, 8] table only": lambda b=bitmask: apply_bitmask_by_table(logits, b, rows),
            "xgrammar cpu kernel only": lambda b=bitmask: xgr.apply_token_bitmask_inplace(logits, b, indices=rows,
                                                                                          backend="cpu"),
        }
        for name, fn in ways.items():
            fn()
            best = []
            for _ in range(3):  # best of 3 batches of calls: interference only ever slows a run
                start = time.perf_counter()
                for _ in range(repeats):
                    fn()
                best.append((time.perf_counter() - start) / repeats)
            out[(mask_name, name)] = 1000 * min(best)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny", "default"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for model in args.models:
        checkpoint = load(model)
        runners = tuple(ModelRunner(checkpoint, RunnerConfig(num_blocks=1024, block_size=16, device="cpu",
                                                             num_threads=args.threads)) for _ in range(2))
        vocab = runners[0].vocab_size
        compiles = compile_latency(runners[1])
        decode_round(runners, 4, 4)  # warm-up: both paths once
        rounds = []
        for r in range(args.rounds):
            free, json_tps, fill, apply, accept = decode_round(runners, args.batch, args.new_tokens)
            rounds.append((free, json_tps, fill, apply, accept))
            print(f"{model} round {r}: free {free:.1f} tok/s, json {json_tps:.1f} tok/s ({json_tps / free:.2f}x), "
                  f"mask fill {fill:.2f} ms + apply {apply:.2f} ms + accept {accept:.2f} ms per step", flush=True)
        kernels = apply_kernels(args.batch, vocab)
        results.append((model, len(runners[0].vocabulary), vocab, rounds, compiles, kernels))
        del runners
    section = render(args, results)
    print(section)
    if not args.no_write:
        write(section)


def render(args, results) -> str:
    lines = [f"Run {time.strftime('%Y-%m-%d %H:%M')}: `python -m bench.grammar --batch {args.batch} --new-tokens "
             f"{args.new_tokens} --rounds {args.rounds} --threads {args.threads}`.", "",
             f"Machine: {machine(torch.device('cpu'))}.", "",
             f"### Decode, {args.batch} concurrent requests, seeded sampling", "",
             "| model (vocabulary / logits) | round | free tok/s | JSON-schema tok/s | ratio | free step ms "
             "| mask fill ms/step | mask apply ms/step | accept ms/step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for model, vocab, width, rounds, _, _ in results:
        for r, (free, json_tps, fill, apply, accept) in enumerate(rounds):
            lines.append(f"| {model} ({vocab:,} / {width:,}) | {r} | {free:.1f} | {json_tps:.1f} | "
                         f"{json_tps / free:.2f}x | {1000 * args.batch / free:.1f} | {fill:.2f} | {apply:.2f} | "
                         f"{accept:.2f} |")
        ratio = statistics.median(row[1] / row[0] for row in rounds)
        lines.append(f"| **{model}** | median | | | **{ratio:.2f}x** | | | | |")
    lines += ["", "### Compile latency (ms, one compile thread, xgrammar max_threads=1)", "",
              "| model | " + " | ".join(results[0][4]) + " |", "|---|" + "---:|" * len(results[0][4])]
    for model, _, _, _, compiles, _ in results:
        lines.append(f"| {model} | " + " | ".join(f"{v:.1f}" for v in compiles.values()) + " |")
    ways = list(dict.fromkeys(way for _, way in results[0][5]))
    lines += ["", f"### Applying a [{args.batch}, V] bitmask (ms per call, best of 3)", "",
              "| model (V) | mask | " + " | ".join(ways) + " |", "|---|---|" + "---:|" * len(ways)]
    for model, _, width, _, _, kernels in results:
        for mask in dict.fromkeys(m for m, _ in kernels):
            lines.append(f"| {model} ({width:,}) | {mask} | " + " | ".join(f"{kernels[(mask, w)]:.2f}" for w in ways) + " |")
    return "\n".join(lines)


def write(section: str) -> None:
    with open(DOC) as f:
        text = f.read()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    with open(DOC, "w") as f:
        f.write(pattern.sub(lambda _: f"{START}\n{section}\n{END}", text))


if __name__ == "__main__":
    main()
