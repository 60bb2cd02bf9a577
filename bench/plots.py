"""PNG plots for docs/benchmarks.md (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [  # (label, path into results, style)
    ("mstar (HTTP/SSE via Envoy)", ("mstar", "http"), "o-"),
    ("mstar (gRPC via Envoy)", ("mstar", "grpc"), "o--"),
    ("llama.cpp llama-server -np 16", ("llama_server", "http"), "s-"),
    ("HF transformers generate (batch)", ("hf_generate", "rows"), "^-"),
]


def _rows(results: dict, path: tuple[str, str]) -> list[dict]:
    node = results.get(path[0]) or {}
    return [r for r in node.get(path[1]) or [] if r.get("errors", 0) == 0]


def _line(ax, results, key: str, log_y: bool = False) -> None:
    for label, path, style in SERIES:
        rows = [r for r in _rows(results, path) if r.get(key) is not None]
        if rows:
            ax.plot([r["concurrency"] for r in rows], [r[key] for r in rows], style, label=label)
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)


def plot_all(results: dict, out_dir: Path, prefix: str = "bench") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.2))
    _line(ax, results, "tok_s")
    ax.set(xlabel="concurrent streams (HF: batch size)", ylabel="output tokens/s",
           title="Throughput, SmolLM2-135M Q4_1, 2 threads, 48-word prompts, 64 tokens")
    _legend(ax, 8)
    paths.append(_save(fig, out_dir / f"{prefix}_throughput.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    _line(axes[0], results, "ttft_p50_ms", log_y=True)
    axes[0].set(xlabel="concurrent streams", ylabel="ms", title="TTFT p50")
    _line(axes[1], results, "itl_p50_ms")
    axes[1].set(xlabel="concurrent streams", ylabel="ms", title="Inter-token latency p50")
    _legend(axes[0], 7)
    paths.append(_save(fig, out_dir / f"{prefix}_latency.png"))

    t = results.get("transport") or {}
    if t.get("bare") or t.get("stack"):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for key, label, style in (("bare", "bare grpc.aio ceiling", "k--"),
                                  ("stack", "Envoy + preprocess + generation --null-engine", "o-")):
            rows = t.get(key) or []
            ax.plot([r["concurrency"] for r in rows], [r["tok_s"] for r in rows], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="concurrent streams", ylabel="tokens (messages)/s", title="Transport: streamed tokens/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(_save(fig, out_dir / f"{prefix}_transport.png"))
    return paths


def _legend(ax, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:  # an empty legend warns; a run may have measured nothing here
        ax.legend(fontsize=size)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
