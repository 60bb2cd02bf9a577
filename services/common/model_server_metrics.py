"""The Gateway API Inference Extension's "model server protocol" gauges, under vLLM's names.

GIE's endpoint picker (EPP) scrapes each model-server pod's Prometheus endpoint and picks a pod by
its queue and KV cache: it reads `vllm:num_requests_waiting`, `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc` and, optionally, `vllm:cache_config_info{block_size,num_gpu_blocks}`
(the protocol: gateway-api-inference-extension docs/proposals/003-model-server-protocol).
Serving them under exactly those names lets the EPP, and dashboards built for vLLM, read mstar's
generation service as they read vLLM. No LoRA adapters are served, so no `vllm:lora_requests_info`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge


class ModelServerGauges:
    """Same values as the mstar_generation_ gauges, in vLLM's units (kv_cache_usage_perc is a fraction
    in [0, 1]); `model_name` labels them as vLLM does."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels, self._model = ("model_name",), model_name
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled (queued or "
                             "preempted).", labels, registry=registry)
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch (prefilling or "
                             "decoding).", labels, registry=registry)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV cache usage: used blocks / all blocks, "
                              "0 to 1 (1 = full).", labels, registry=registry)
        self.cache_info = Gauge("vllm:cache_config_info", "The KV cache's configuration, in the labels "
                                "(value 1).", ("block_size", "num_gpu_blocks"), registry=registry)
        self.set(0, 0, 0, 1)

    def describe_cache(self, block_size: int, num_blocks: int) -> None:
        self.cache_info.clear()  # one configuration at a time
        self.cache_info.labels(str(block_size), str(num_blocks)).set(1)

    def set(self, running: int, waiting: int, kv_used: int, kv_free: int) -> None:
        self.running.labels(self._model).set(running)
        self.waiting.labels(self._model).set(waiting)
        self.kv_usage.labels(self._model).set(kv_used / max(1, kv_used + kv_free))
