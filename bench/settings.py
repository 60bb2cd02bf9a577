"""What one benchmark run measures. `make bench` uses QUICK (about 10 minutes on a quiet 2-core
box, up to 20 on a loaded one); `python -m bench.run --full` the whole sweep."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Settings:
    model: str = "default"  # a packaged model's name (services/common/packaged_models.py): every peer serves its GGUF
    prompt_words: int = 48
    max_tokens: int = 64
    dtype: str = "auto"  # mstar generation --dtype (HF stays fp32; llama-server reads the Q4_1 GGUF)
    quantization: str = "auto"  # mstar generation --quantization (auto: the GGUF's own block codes)
    threads: int = 2  # torch threads (mstar, HF) and llama.cpp -t/-tb: the same for every peer
    # mstar's own: None = `threads` too; "auto" = what mstar picks without --threads (the usable CPUs
    # minus a reserve for Envoy and preprocess: 1 of 2 cores here), the same 2-core budget.
    mstar_threads: str | None = None
    slots: int = 16  # llama-server -np
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    grpc_concurrency: list[int] = field(default_factory=lambda: [16])  # mstar over gRPC through Envoy
    hf_batches: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    # mstar with other numerics, as extra rows next to the defaults: same run, same turns, at the
    # levels listed (the intersection with `concurrency`). Each is a stack of its own.
    variants: list[dict] = field(default_factory=lambda: [
        {"name": "fp32", "dtype": "float32", "quantization": "none", "levels": [1, 16]},  # the HF oracle, eager
        {"name": "bf16", "dtype": "bfloat16", "quantization": "none", "levels": [1, 16]},  # dense bf16
    ])
    # Start mstar's defaults on an empty Inductor cache (the compiled step built from scratch: ~40 s
    # on a quiet 2-core box, ~70 s loaded), then again warm on that cache. False: one start on the
    # service's own cache as the box has it (a smoke run's shortcut).
    cold_start: bool = True
    poisson_rates: list[float] = field(default_factory=lambda: [1.0])
    poisson_requests: int = 12
    poisson_peers: bool = False  # also run the Poisson mode against llama-server
    transport_streams: list[int] = field(default_factory=lambda: [1, 8, 64])
    transport_tokens: int = 512
    streamed_input_trials: int = 1
    profile_s: float = 12.0
    rounds: int = 2  # the comparison's turns; each system's best round is reported

    def requests_at(self, concurrency: int) -> int:
        # Two requests per worker (three at 1): enough for p50s without blowing the time budget.
        # From 32 workers on, one each: 64 requests of 64 tokens are already 4k tokens a round.
        return concurrency if concurrency >= 32 else max(3, 2 * concurrency)

    def variant_levels(self, variant: dict) -> list[int]:
        return [c for c in self.concurrency if c in variant["levels"]]

    def transport_requests_at(self, streams: int) -> int:
        # Messages are cheap: more requests per level keep each level above a second of wall time.
        return max(8, 2 * streams)

    def as_dict(self) -> dict:
        return asdict(self)


QUICK = Settings()

FULL = Settings(
    concurrency=[1, 2, 4, 8, 16, 32, 64],
    grpc_concurrency=[1, 2, 4, 8, 16, 32, 64],
    hf_batches=[1, 2, 4, 8, 16, 32, 64],
    poisson_rates=[0.5, 1.0, 2.0],
    poisson_requests=24,
    poisson_peers=True,
    transport_streams=[1, 2, 4, 8, 16, 32, 64],
    transport_tokens=512,
    streamed_input_trials=3,
    profile_s=20.0,
    rounds=3,
    variants=[{"name": "fp32", "dtype": "float32", "quantization": "none", "levels": [1, 4, 16, 64]},
              {"name": "bf16", "dtype": "bfloat16", "quantization": "none", "levels": [1, 4, 16, 64]}],
)
