"""Peer 1, the engine baseline: Hugging Face transformers `generate()`, batched, on the same
weights (mstar's own GGUF loader's state dict in a transformers LlamaForCausalLM, logits
identical to transformers' GGUF loader), the same prompts, tokens and thread count.

Runs in its own process so its torch threads never share the load generator's loop:
    python -m bench.peers.hf_generate --batches 1,4,16 --prompt-words 48 --max-tokens 64 --threads 2
prints one JSON object with a row per batch size.

Static batching: a batch's prompts are left-padded to the longest, every row decodes exactly
max_tokens (ignore-eos), TTFT is the time of a 1-token generate of the same batch, and
ITL = (total - TTFT) / (max_tokens - 1), the same for every row of a batch.
"""

from __future__ import annotations

import argparse
import json
import time


def load_model(threads: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from services.generation.weights.locate import load_checkpoint

    torch.set_num_threads(threads)
    ckpt = load_checkpoint("default")
    config = LlamaConfig(**ckpt.config.to_hf_dict())
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(ckpt.state_dict, strict=False, assign=True)
    model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # buffers were on meta
    return model.eval().float()


def batch_inputs(tokenizer, prompts: list[str], pad_id: int):
    import torch

    ids = [tokenizer.encode(p) for p in prompts]
    width = max(map(len, ids))
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        input_ids[row, width - len(seq):] = torch.tensor(seq)
        mask[row, width - len(seq):] = 1
    return input_ids, mask, sum(map(len, ids))


def run(batches: list[int], prompt_words: int, max_tokens: int, threads: int) -> dict:
    import torch

    from bench.prompts import make_prompts
    from services.preprocess.model import load_model as load_spec

    t0 = time.perf_counter()
    model = load_model(threads)
    tokenizer = load_spec("default").tokenizer
    load_s = time.perf_counter() - t0
    prompts = make_prompts(max(batches), prompt_words)
    pad = 2  # <|im_end|>, the model's pad token

    def generate(input_ids, mask, n: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=pad, eos_token_id=None)
        assert out.shape[1] - input_ids.shape[1] == n
        return time.perf_counter() - start

    generate(*batch_inputs(tokenizer, prompts[:1], pad)[:2], 4)  # warm-up: first-call allocations
    rows = []
    for b in batches:
        input_ids, mask, prompt_tokens = batch_inputs(tokenizer, prompts[:b], pad)
        ttft = generate(input_ids, mask, 1)
        cpu0 = time.process_time()
        total = generate(input_ids, mask, max_tokens)
        cpu = time.process_time() - cpu0
        rows.append({
            "mode": "batch", "concurrency": b, "requests": b, "errors": 0, "prompt_tokens": prompt_tokens,
            "output_tokens": b * max_tokens, "wall_s": total, "tok_s": b * max_tokens / total,
            "ttft_p50_ms": round(ttft * 1e3, 2), "ttft_p99_ms": round(ttft * 1e3, 2),
            "itl_p50_ms": round((total - ttft) / (max_tokens - 1) * 1e3, 2),
            "itl_p99_ms": round((total - ttft) / (max_tokens - 1) * 1e3, 2),
            "e2e_p50_ms": round(total * 1e3, 2), "e2e_p99_ms": round(total * 1e3, 2),
            "server_cpu_s": cpu, "server_cpu_ms_per_token": 1e3 * cpu / (b * max_tokens),
        })
    import transformers

    return {"peer": "hf_generate", "transformers": transformers.__version__, "torch": torch.__version__,
            "threads": threads, "load_s": load_s, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    result = run([int(x) for x in a.batches.split(",")], a.prompt_words, a.max_tokens, a.threads)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
