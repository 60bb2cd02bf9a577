"""Engine metrics for ConductorStatus: current gauges and cumulative counters, never per request.

The loop thread writes the counters and publishes an immutable snapshot after every step; other
threads only read the snapshot (one reference swap, so they never see a half-updated set).
"""

from __future__ import annotations

GAUGE = "gauge"
COUNTER = "counter"

KINDS = {
    "requests_running": GAUGE,
    "requests_waiting": GAUGE,
    "kv_blocks_used": GAUGE,
    "kv_blocks_free": GAUGE,
    "tokens_per_step": GAUGE,  # mean batched tokens per step since start
    "prefix_cache_hit_rate": GAUGE,  # cached / looked-up prompt tokens since start
    "steps": COUNTER,
    "preemptions": COUNTER,
    "rejections": COUNTER,
    "requests_finished": COUNTER,
    "requests_failed": COUNTER,
    "request_faults": COUNTER,  # requests failed by a fault in their own work (the fault boundary)
    "generated_tokens": COUNTER,
    "batched_tokens": COUNTER,
    "grammar_compiles_in_flight": GAUGE,  # structured-output grammars being compiled now
    "grammar_compiles": COUNTER,  # compiles done (cache misses), failed ones included
    "grammar_cache_hits": COUNTER,  # constraints served by an already compiled grammar
}


class EngineStats:
    def __init__(self):
        self.num_rejections = 0
        self.num_finished = 0
        self.num_failed = 0
        self.num_generated_tokens = 0
        self.num_batched_tokens_total = 0
        self.num_spec_proposed = 0  # speculative decoding (speculation.py): tokens proposed
        self.num_spec_accepted = 0  # and accepted by verify steps
        self._snapshot: dict[str, float] = {}

    def update(self, engine) -> None:
        bm, sched = engine.block_manager, engine.scheduler
        steps = engine.num_steps
        self._snapshot = {
            "requests_running": len(sched.running),
            "requests_waiting": len(sched.waiting),
            "kv_blocks_used": bm.num_used_blocks,
            "kv_blocks_free": bm.num_free_blocks,
            "tokens_per_step": self.num_batched_tokens_total / steps if steps else 0.0,
            "prefix_cache_hit_rate": (
                bm.num_prefix_hit_tokens / bm.num_prefix_query_tokens if bm.num_prefix_query_tokens else 0.0
            ),
            "steps": steps,
            "preemptions": sched.num_preemptions,
            "rejections": self.num_rejections,
            "requests_finished": self.num_finished,
            "requests_failed": self.num_failed,
            "request_faults": sum(engine.boundary.num_faults.values()),
            "generated_tokens": self.num_generated_tokens,
            "batched_tokens": self.num_batched_tokens_total,
            "spec_proposed_tokens": self.num_spec_proposed,
            "spec_accepted_tokens": self.num_spec_accepted,
            "spec_acceptance_rate": self.num_spec_accepted / self.num_spec_proposed if self.num_spec_proposed else 0.0,
        }
        if getattr(engine.runner, "vision", None) is not None:  # a vision-language model's encoder
            self._snapshot["images_encoded"] = engine.runner.num_images_encoded
            self._snapshot["encoder_cache_images"] = len(engine.runner.encoder_cache)
        draft = engine.speculator.draft
        if draft is not None:  # the draft model's runs (each batches every drafting sequence)
            self._snapshot["spec_draft_passes"] = draft.num_passes
        compiler = engine.grammars.compiler
        if compiler is not None:
            self._snapshot |= {"grammar_compiles_in_flight": compiler.num_in_flight,
                               "grammar_compiles": compiler.num_compiles,
                               "grammar_cache_hits": compiler.cache.num_hits}

    def snapshot(self) -> dict[str, float]:
        return self._snapshot
