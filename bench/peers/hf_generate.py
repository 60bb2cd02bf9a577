"""Peer 1, the engine baseline: Hugging Face transformers `generate()`, batched, on the same
weights (mstar's own GGUF loader's state dict in a transformers LlamaForCausalLM, logits
identical to transformers' GGUF loader), the same prompts, tokens and thread count.

Runs in its own process so its torch threads never share the load generator's loop. It is a
worker: it loads once, prints READY, then answers one line per batch size on stdin with
"RESULT {json}", so the bench can interleave it with the other systems level by level:
    python -m bench.peers.hf_generate --prompt-words 48 --max-tokens 64 --threads 2

Static batching: a batch's prompts are left-padded to the longest, every row decodes exactly
max_tokens (ignore-eos), TTFT is the time of a 1-token generate of the same batch, and
ITL = (total - TTFT) / (max_tokens - 1), the same for every row of a batch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def load_model(threads: int, name: str = "default"):
    import torch
    from transformers import AutoModelForCausalLM

    from services.generation.weights.locate import load_checkpoint
    from services.generation.weights.random_init import hf_tensors

    torch.set_num_threads(threads)
    ckpt = load_checkpoint(name)
    config = ckpt.config.hf_config()
    config._attn_implementation = "sdpa"
    # Built on meta (no random init to pay for) when every buffer can be rebuilt here: Llama's rotary
    # tables. Other families hold more (Gemma's embedding scale): built on the CPU.
    with torch.device("meta" if ckpt.config.family == "llama" else "cpu"):
        model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(hf_tensors(ckpt), strict=False, assign=True)  # Gemma's norms as HF stores them
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


class Worker:
    def __init__(self, prompt_words: int, max_tokens: int, threads: int, name: str = "default") -> None:
        from bench.prompts import PromptSource
        from services.preprocess.model import load_model as load_spec

        t0 = time.perf_counter()
        self.model = load_model(threads, name)
        self.tokenizer = load_spec(name).tokenizer
        self.PAD = self.tokenizer.special.eos_token_ids[0]  # left padding, masked out: any id will do
        self.load_s = time.perf_counter() - t0
        self.prompts = PromptSource(prompt_words)  # the same sequence the servers get
        self.max_tokens, self.threads = max_tokens, threads
        self._generate(*batch_inputs(self.tokenizer, ["Warm up."], self.PAD)[:2], 4)  # first-call allocations

    def _generate(self, input_ids, mask, n: int) -> float:
        import torch

        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, pad_token_id=self.PAD, eos_token_id=None)
        assert out.shape[1] - input_ids.shape[1] == n
        return time.perf_counter() - start

    def batch(self, b: int) -> dict:
        n = self.max_tokens
        input_ids, mask, prompt_tokens = batch_inputs(self.tokenizer, [self.prompts.next() for _ in range(b)], self.PAD)
        ttft = self._generate(input_ids, mask, 1)
        cpu0 = time.process_time()
        total = self._generate(input_ids, mask, n)
        cpu = time.process_time() - cpu0
        itl = round((total - ttft) / (n - 1) * 1e3, 2)
        return {
            "mode": "batch", "concurrency": b, "requests": b, "errors": 0, "prompt_tokens": prompt_tokens,
            "output_tokens": b * n, "wall_s": total, "tok_s": b * n / total,
            "ttft_p50_ms": round(ttft * 1e3, 2), "ttft_p99_ms": round(ttft * 1e3, 2),
            "itl_p50_ms": itl, "itl_p99_ms": itl, "e2e_p50_ms": round(total * 1e3, 2),
            "e2e_p99_ms": round(total * 1e3, 2), "server_cpu_s": cpu, "server_cpu_ms_per_token": 1e3 * cpu / (b * n),
        }

    def info(self) -> dict:
        import torch
        import transformers

        return {"transformers": transformers.__version__, "torch": torch.__version__, "threads": self.threads,
                "load_s": self.load_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="default", help="a packaged model's name")
    a = ap.parse_args()
    worker = Worker(a.prompt_words, a.max_tokens, a.threads, a.model)
    print("READY " + json.dumps(worker.info()), flush=True)
    for line in sys.stdin:
        if line.strip():
            print("RESULT " + json.dumps(worker.batch(int(line))), flush=True)


if __name__ == "__main__":
    main()


class HFProcess:
    """The parent's handle on the worker: `start()`, `batch(b)` -> row, `stop()`."""

    def __init__(self, prompt_words: int, max_tokens: int, threads: int, model: str = "default") -> None:
        self.argv = ["--prompt-words", str(prompt_words), "--max-tokens", str(max_tokens), "--threads", str(threads),
                     "--model", model]
        self.proc = None
        self.info: dict = {}
        self._launched = 0.0

    def start(self) -> HFProcess:
        import subprocess

        from bench import procs

        procs.LOG_DIR.mkdir(parents=True, exist_ok=True)
        self._launched = time.monotonic()
        self.proc = subprocess.Popen(procs.python("bench.peers.hf_generate", *self.argv), cwd=procs.ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(procs.LOG_DIR / "hf.log", "wb"),  # noqa: SIM115
                                     text=True, preexec_fn=procs._child_setup)
        return self

    def _read(self, tag: str) -> dict:
        for line in self.proc.stdout:
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1:])
        raise RuntimeError(f"HF worker exited ({self.proc.wait()}); see bench/out/logs/hf.log")

    def wait_ready(self) -> dict:
        """The worker's info, with startup_s: launch until READY (interpreter, imports, model load and
        a 4-token warm-up; load_s is the model load alone)."""
        self.info = {**self._read("READY"), "startup_s": time.monotonic() - self._launched}
        return self.info

    @property
    def pid(self) -> int:
        return self.proc.pid

    def batch(self, b: int) -> dict:
        self.proc.stdin.write(f"{b}\n")
        self.proc.stdin.flush()
        return self._read("RESULT")

    def stop(self) -> None:
        from bench import procs

        if self.proc is not None:
            self.proc.stdin.close()
            procs.stop(self.proc)
