"""How long a sequence a checkpoint is served at: one rule for both services (each reads the checkpoint).

A model trained with sliding-window attention (Mistral's ``sliding_window``; Qwen2/Qwen3's when
``use_sliding_window`` is set) attends to at most the last ``sliding_window`` tokens. Up to that many
tokens, windowed and full causal attention are the same computation, so serving every sequence
within the window is exact with the full-attention kernels, at the price of a shorter context (as
vLLM did before its kernels had windows). Sliding-window kernels, with the KV blocks that leave every
layer's window freed, are issue 32's item 2; until then the window is the context length, and the
preprocess service refuses a longer prompt with the usual 400 naming the field.
"""

from __future__ import annotations


def sliding_window_of(hf_config: dict) -> int | None:
    """The window a config.json declares that applies to its layers, else None."""
    window = hf_config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if hf_config.get("model_type") in ("qwen2", "qwen3") and not hf_config.get("use_sliding_window", False):
        return None  # Qwen configs carry a window that only use_sliding_window switches on
    return window


def gguf_sliding_window(fields: dict, arch: str) -> int | None:
    """A GGUF's `{arch}.attention.sliding_window`, when it declares one."""
    window = fields.get(f"{arch}.attention.sliding_window")
    return int(window) if isinstance(window, int) and window > 0 else None


def gguf_served_context_length(fields: dict, arch: str, default: int = 2048) -> int:
    """A GGUF's `{arch}.context_length`, or its sliding window when that is shorter."""
    length = int(fields.get(f"{arch}.context_length", default))
    window = gguf_sliding_window(fields, arch)
    return min(length, window) if window else length


def served_context_length(hf_config: dict, default: int = 2048) -> int:
    """max_position_embeddings, or the sliding window when that is shorter."""
    length = int(hf_config.get("max_position_embeddings", default))
    window = sliding_window_of(hf_config)
    return min(length, window) if window else length
