"""How faithful mstar's numerics are to the fp32 oracle (issue 30, item 3), variant by variant.

    python -m bench.faithfulness [--variants default default-f32kv] [--windows 12] [--doc docs/benchmarks.md]

The oracle is HF transformers in fp32 on the same file's weights (dequantized): exactly what
`--dtype float32 --quantization none` serves. For each mstar variant, on one runner as the
service builds it (warm-up included, so the defaults run their fused C++ step):

* **teacher-forced**: consecutive windows of real text (the Python reference manual's topics as
  pydoc ships them, prose and code, the same bytes for a given Python version) are read one token per step, as
  decode reads them — every earlier token's K/V from the variant's KV cache — and the variant's
  next-token distribution at every position is compared with the oracle's: KL(oracle || variant)
  in nats (mean, p99, max) and top-1 agreement;
* **greedy**: bench/parity.py's 8 held chat prompts decoded greedily by the engine, 64 new tokens:
  how many continuations equal the oracle's and the mean identical prefix.

The time each variant's passes take (the same decode steps for every variant) is its cost, side by
side in the same run.

Left out: llama.cpp's side of the same table (llama-perplexity --kl-divergence needs a llama.cpp
build and base logits from an f32 GGUF of this model; not built on this box).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from bench import doc_sections
from bench.parity import PROMPTS, common_prefix, engine_greedy, hf_greedy

VARIANTS = {  # RunnerConfig fields; "default" is what `make run` serves
    "default": {},
    "default-f32kv": {"kv_cache_dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16", "quantization": "none"},
}
TOPICS = ("assignment", "class", "exceptions", "for", "import", "function", "lambda", "with", "try", "if",
          "while", "numbers", "strings", "types", "calls", "comparisons")
WINDOW = 256
SECTION = "faithfulness"


def text_windows(tokenizer, windows: int, width: int = WINDOW) -> list[list[int]]:
    """`windows` consecutive runs of `width` tokens of the reference manual's TOPICS, in order."""
    from pydoc_data.topics import topics

    ids = tokenizer.encode("\n\n".join(topics[name] for name in TOPICS))
    if len(ids) < windows * width:
        raise ValueError(f"the topics hold {len(ids)} tokens, fewer than {windows} windows of {width}")
    return [ids[i * width:(i + 1) * width] for i in range(windows)]


def oracle_log_probs(model, window: list[int]) -> torch.Tensor:
    """[width - 1, V] fp32 log-probabilities of tokens 1.. given their prefixes."""
    with torch.inference_mode():
        logits = model(torch.tensor([window])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def teacher_forced_logits(runner, windows: list[list[int]]) -> list[torch.Tensor]:
    """Each window's [width - 1, V] logits, one token per sequence per step (decode-shaped steps:
    every row reads its earlier K/V from the runner's KV cache), all windows as one batch."""
    from services.generation.models.llama import StepMetadata

    bs, dev, width = runner.block_size, runner.device, len(windows[0])
    blocks = math.ceil(width / bs)
    rows: list[list[torch.Tensor]] = [[] for _ in windows]

    def t(values, dtype):
        return torch.tensor(values, dtype=dtype, device=dev)

    tables = t([[w * blocks + b for b in range(blocks)] for w in range(len(windows))], torch.int32)
    for pos in range(width - 1):
        meta = StepMetadata(
            positions=t([pos] * len(windows), torch.int64),
            slot_mapping=t([(w * blocks + pos // bs) * bs + pos % bs for w in range(len(windows))], torch.int64),
            block_tables=tables, cu_seqlens_q=t(list(range(len(windows) + 1)), torch.int32),
            context_lens=t([pos + 1] * len(windows), torch.int32), logits_indices=t(list(range(len(windows))), torch.int64))
        with torch.inference_mode():
            logits = runner.forward(t([w[pos] for w in windows], torch.int64), meta)
        for w in range(len(windows)):
            rows[w].append(logits[w].float().clone())
    return [torch.stack(r) for r in rows]


def compare(oracle: list[torch.Tensor], ours: list[torch.Tensor]) -> dict:
    kls, agree, n = [], 0, 0
    for p_log, q_logits in zip(oracle, ours, strict=True):
        q_log = torch.log_softmax(q_logits, dim=-1)
        kls.append((p_log.exp() * (p_log - q_log)).sum(dim=-1))
        agree += int((p_log.argmax(-1) == q_log.argmax(-1)).sum())
        n += p_log.shape[0]
    kl = torch.cat(kls).clamp_min(0)
    return {"positions": n, "kl_mean": float(kl.mean()), "kl_p99": float(kl.quantile(0.99)), "kl_max": float(kl.max()),
            "top1_agreement": agree / n}


def measure(variants: list[str], windows: int, new_tokens: int, threads: int) -> dict:
    from bench.engine import hf_model
    from services.generation.model_runner import ModelRunner, RunnerConfig
    from services.generation.weights.locate import load_checkpoint
    from services.preprocess.model import load_model

    torch.set_num_threads(threads)
    checkpoint = load_checkpoint("default")
    texts = text_windows(load_model("default").tokenizer, windows)
    model = hf_model(checkpoint, torch.device("cpu"), torch.float32)
    model.tie_weights()
    oracle = [oracle_log_probs(model, w) for w in texts]
    del model
    oracle_greedy, _ = hf_greedy(checkpoint, "cpu", "float32", PROMPTS, new_tokens)
    from bench.run import run_meta

    out: dict = {"meta": run_meta(), "python": sys.version.split()[0], "windows": len(texts), "window_tokens": WINDOW,
                 "greedy_prompts": len(PROMPTS), "new_tokens": new_tokens, "variants": {}}
    for name in variants:
        blocks = len(texts) * math.ceil(WINDOW / 16) + len(PROMPTS) * math.ceil((32 + new_tokens) / 16) + 8
        runner = ModelRunner(checkpoint, RunnerConfig(num_blocks=blocks, block_size=16, device="cpu", num_threads=threads,
                                                      max_num_seqs=max(len(texts), len(PROMPTS)), **VARIANTS[name]))
        runner.warm_up()
        t0 = time.perf_counter()
        row = compare(oracle, teacher_forced_logits(runner, texts))
        greedy = engine_greedy(runner, PROMPTS, new_tokens)
        prefixes = [common_prefix(a, b) for a, b in zip(oracle_greedy, greedy, strict=True)]
        row |= {"greedy_identical": sum(p == new_tokens for p in prefixes), "greedy_mean_prefix": sum(prefixes) / len(prefixes),
                "numerics": json.loads(runner.numerics_metadata()), "seconds": time.perf_counter() - t0}
        out["variants"][name] = row
        print(f"{name}: KL mean {row['kl_mean']:.5f} p99 {row['kl_p99']:.4f} max {row['kl_max']:.3f} nats, top-1 "
              f"{100 * row['top1_agreement']:.2f} % of {row['positions']}; greedy {row['greedy_identical']}/{len(PROMPTS)} "
              f"identical, mean prefix {row['greedy_mean_prefix']:.1f}/{new_tokens}", flush=True)
    return out


def render(result: dict) -> str:
    meta = result.get("meta", {})
    lines = ["## Faithfulness to the fp32 oracle (issue 30 item 3; `python -m bench.faithfulness`)", "",
             f"Measured on {meta.get('date', '?')}, commit `{meta.get('commit', '?')}`, {meta.get('cpu', '?')}, "
             f"{meta.get('cores', '?')} cores (load average {meta.get('loadavg', '?')} at start). "
             f"Teacher-forced over {result['windows']} windows of {result['window_tokens']} tokens (the Python "
             f"{result['python']} reference manual's topics, read one token per step as decode reads them) against "
             "HF transformers fp32 on the same weights; greedy: bench/parity.py's "
             f"{result['greedy_prompts']} chat prompts, {result['new_tokens']} new tokens each.", "",
             "| variant | weights / KV cache | KL mean (nats) | KL p99 | KL max | top-1 agreement | greedy identical "
             "| greedy mean identical prefix | time of its passes (s) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in result["variants"].items():
        n = r["numerics"]
        lines.append(f"| {name} | {n.get('weights', '?')} / {n.get('kv_cache', '?')} | {r['kl_mean']:.5f} | "
                     f"{r['kl_p99']:.4f} | {r['kl_max']:.3f} | {100 * r['top1_agreement']:.2f} % | "
                     f"{r['greedy_identical']}/{result['greedy_prompts']} | {r['greedy_mean_prefix']:.1f} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.faithfulness", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=["default", "default-f32kv"], choices=list(VARIANTS))
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--doc", help="write the table into this markdown doc's faithfulness section")
    args = ap.parse_args(argv)
    result = measure(args.variants, args.windows, args.new_tokens, args.threads)
    doc_sections.save(result, args.json, args.doc, SECTION, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
