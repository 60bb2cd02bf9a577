"""The second real model, Gemma 3 270M (Q4_K_M GGUF from the package index), against transformers.

    python -m bench.gemma3 [--new-tokens 32] [--fixture tests/e2e/data/gemma3_270m_greedy.json] [--doc docs/benchmarks.md]

The oracle is transformers 5 loading the same GGUF (``from_pretrained(gguf_file=...)``: every
tensor dequantized to fp32, the norms' stored 1 + w turned back into w) and decoding greedily in
fp32. Its prompts are completion prompts (a base model, no chat template) tokenized by mstar's
own preprocess tokenizer, BOS first as the GGUF asks; two are longer than the 512-token window
with the answer to their last line before the window, so only the global layers (every 6th) can
see it. mstar decodes the same token ids in-process, on one ModelRunner per variant:

* ``fp32``: ``--dtype float32 --quantization none`` (the dequantized weights on the cpu kernels:
  the exact path; every continuation must equal transformers');
* ``default``: what ``MSTAR_MODEL=gemma3-270m make run`` serves (the file's Q4_K / Q5_0 / Q8_0 codes
  through the int8-activation kernels, Q6_K dequantized, bf16 KV cache): close, not identical;
* ``default, fp32 KV cache`` and ``bf16 dense`` (dequantized weights, bf16 activations): which of the
  defaults' roundings moves the continuations.

--fixture writes the prompts' ids and transformers' tokens for tests/e2e/test_gemma3_e2e.py (the
real stack must reproduce them without loading transformers: its load alone takes ~40 s here).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from bench import doc_sections
from bench.parity import common_prefix, engine_greedy

SECTION = "gemma3-parity"
_SECRET = "The password for the vault is PLUM-4417. Keep it safe.\n\n"
_TOPICS = ("assignment", "for", "while", "if")  # pydoc's reference-manual text: the same bytes per Python version


def prompts() -> dict[str, str]:
    from pydoc_data.topics import topics

    filler = "\n\n".join(topics[name] for name in _TOPICS)
    return {
        "capital": "The capital of France is",
        "code": "def fibonacci(n):\n    ",
        "story": "Once upon a time, in a small village by the sea,",
        "long-recall": _SECRET + filler[:3000] + "\n\nThe password for the vault is",
        "long-code": filler[:3500] + "\n\nIn summary, a Python for statement",
    }


def hf_tokens(path: str, ids: list[list[int]], new_tokens: int) -> list[list[int]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(Path(path).parent), gguf_file=Path(path).name, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for prompt in ids:
            x = torch.tensor([prompt])
            g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
            out.append(g[0, len(prompt):].tolist())
    return out


def mstar_tokens(checkpoint, ids: list[list[int]], new_tokens: int, **runner_kw) -> tuple[list[list[int]], float]:
    from services.generation.model_runner import ModelRunner, RunnerConfig

    blocks = sum(math.ceil((len(p) + new_tokens) / 16) for p in ids) + 1
    runner = ModelRunner(checkpoint, RunnerConfig(num_blocks=blocks, block_size=16, device="cpu", **runner_kw))
    start = time.perf_counter()
    tokens = engine_greedy(runner, ids, new_tokens)
    return tokens, time.perf_counter() - start


VARIANTS = {  # RunnerConfig fields
    "fp32": {"dtype": "float32", "quantization": "none"},
    "default": {},
    "default, fp32 KV cache": {"kv_cache_dtype": "float32"},
    "bf16 dense": {"dtype": "bfloat16", "quantization": "none"},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--fixture", type=Path, help="write the prompts' ids and transformers' tokens here (its tokens "
                   "are reused when its prompts are these, unless --recompute)")
    p.add_argument("--recompute", action="store_true", help="run transformers even when the fixture has its tokens")
    p.add_argument("--doc", type=Path, help=f"write the results into this markdown doc's {SECTION} section")
    args = p.parse_args(argv)

    from services.common.packaged_models import packaged_model_path
    from services.generation.weights.gguf import load_gguf
    from services.preprocess.model import load_model

    path = packaged_model_path("gemma3-270m")
    tokenizer = load_model("gemma3-270m").tokenizer
    texts = prompts()
    ids = {name: [tokenizer.special.bos_token_id, *tokenizer.encode(text)] for name, text in texts.items()}
    oracle = _stored(args.fixture, ids, args.new_tokens) if args.fixture and not args.recompute else None
    if oracle is None:
        start = time.perf_counter()
        oracle = hf_tokens(path, list(ids.values()), args.new_tokens)
        print(f"transformers fp32: {time.perf_counter() - start:.1f} s (load + decode)", flush=True)
    checkpoint = load_gguf(path)
    rows = []
    for variant, kw in VARIANTS.items():
        ours, seconds = mstar_tokens(checkpoint, list(ids.values()), args.new_tokens, **kw)
        prefixes = [common_prefix(a, b) for a, b in zip(oracle, ours, strict=True)]
        rows.append((variant, sum(a == b for a, b in zip(oracle, ours, strict=True)), prefixes, seconds))
        print(f"{variant}: {rows[-1][1]}/{len(ids)} equal, identical prefixes {prefixes}, {seconds:.2f} s", flush=True)
    if args.fixture:
        args.fixture.parent.mkdir(parents=True, exist_ok=True)
        args.fixture.write_text(json.dumps({"model": "gemma3-270m", "new_tokens": args.new_tokens, "prompts": [
            {"name": name, "text": texts[name], "prompt_ids": ids[name], "transformers_fp32": oracle[i]}
            for i, name in enumerate(ids)]}, indent=1) + "\n")
    if args.doc:
        lines = [f"Gemma 3 270M (`MSTAR_MODEL=gemma3-270m`, Q4_K_M GGUF) against transformers {_hf_version()} fp32 on "
                 f"the same file: greedy, {args.new_tokens} new tokens, {len(ids)} completion prompts "
                 f"({', '.join(f'{n} {len(v)} tokens' for n, v in ids.items())}; window 512). "
                 "`python -m bench.gemma3`.", "",
                 "| mstar variant | continuations equal to transformers | identical prefix per prompt | decode time |",
                 "|---|---:|---|---:|"]
        lines += [f"| {v} | {eq}/{len(ids)} | {', '.join(map(str, pre))} | {s:.2f} s |" for v, eq, pre, s in rows]
        doc_sections.write(args.doc, SECTION, "\n".join(lines))
    return 0 if rows[0][1] == len(ids) else 1


def _stored(fixture: Path, ids: dict[str, list[int]], new_tokens: int) -> list[list[int]] | None:
    """The fixture's transformers tokens when it holds exactly these prompts (tests/e2e checks them)."""
    if not fixture.exists():
        return None
    stored = json.loads(fixture.read_text())
    if stored["new_tokens"] != new_tokens or [p["prompt_ids"] for p in stored["prompts"]] != list(ids.values()):
        return None
    return [p["transformers_fp32"] for p in stored["prompts"]]


def _hf_version() -> str:
    import transformers

    return transformers.__version__


if __name__ == "__main__":
    sys.exit(main())
