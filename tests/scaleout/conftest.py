"""Real processes for the scale-out suite: several generation replicas (a tiny random-weight Llama
with SmolLM2's vocabulary, so the real tokenizer's ids fit), several preprocess replicas, one real
Envoy, all started by services.stack.Stack exactly as `make run` does with
MSTAR_GENERATION_REPLICAS / MSTAR_PREPROCESS_REPLICAS.

    def test_x(scaleout):
        rig = scaleout(generation=3, preprocess=2, preprocess_args=("--routing-load-margin", "1"))
        rig.generate(...); rig.routed(); rig.kill("generation-1"); rig.restart("generation-1")
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.generation.weights.random_init import TINY, random_checkpoint, save_hf_dir
from services.stack import readiness
from services.stack.stack import Stack, StackConfig

# SmolLM2's vocabulary and context, so preprocess's real tokenizer and limits apply unchanged.
TINY_SMOL = dataclasses.replace(TINY, vocab_size=49152, max_position_embeddings=8192, eos_token_ids=(2,))
BLOCK = 16  # the generation service's default --block-size (and preprocess's --routing-block-size)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return save_hf_dir(random_checkpoint(TINY_SMOL, seed=0), str(tmp_path_factory.mktemp("tiny") / "model"))


class Rig:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    @property
    def http(self) -> str:
        return self.stack.http_url

    def address(self, child: str) -> str:
        """The HOST:PORT a generation child listens on (the `replica` label of the metrics)."""
        i = 0 if child == "generation" else int(child.rsplit("-", 1)[1])
        return self.stack.generation_targets[i]

    def generate(self, ids: list[int], max_tokens: int = 4, timeout_s: float = 60, **extra) -> httpx.Response:
        body = {"prompt_parts": [{"modality": "MODALITY_TOKENS", "token_ids": {"ids": ids}}],
                "model_kwargs": {"sampling": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}},
                **extra}
        return httpx.post(self.http + "/v1/generate", json=body, timeout=timeout_s)

    def metrics(self, child: str) -> dict[tuple[str, tuple], float]:
        samples = {}
        for family in text_string_to_metric_families(httpx.get(self.stack.metrics_urls[child], timeout=5).text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return samples

    def preprocess_total(self, name: str, **labels: str) -> float:
        """A preprocess metric summed over every preprocess replica (and other labels)."""
        want = set(labels.items())
        return sum(v for child in self.stack.metrics_urls if child.startswith("preprocess")
                   for (n, ls), v in self.metrics(child).items() if n == name and want <= set(ls))

    def routed(self, reason: str | None = None) -> dict[str, float]:
        """Requests routed to each generation replica (by address), over every preprocess."""
        labels = {"reason": reason} if reason else {}
        return {a: self.preprocess_total("mstar_preprocess_routed_requests_total", replica=a, **labels)
                for a in self.stack.generation_targets}

    def in_flight(self) -> dict[str, float]:
        return {a: self.preprocess_total("mstar_preprocess_replica_in_flight", replica=a)
                for a in self.stack.generation_targets}

    def kill(self, child: str, sig: int = signal.SIGKILL) -> None:
        self.stack.children[child].signal(sig)

    def wait_exit(self, child: str, timeout_s: float = 30) -> int | None:
        proc = self.stack.children[child].proc
        return proc.wait(timeout_s)

    def restart(self, child: str) -> None:
        """Start a stopped child again with the same command line (same port), as make run's
        supervisor does, and wait until it serves."""
        new = self.stack.restart(child)
        readiness.poll(child, self.stack.ready_check(child), 120, alive=new.alive)

    def wait_serving(self, address: str, timeout_s: float = 30) -> float:
        """Seconds until every preprocess says the generation replica `address` takes requests."""
        start = time.monotonic()
        preprocess = [c for c in self.stack.metrics_urls if c.startswith("preprocess")]
        readiness.poll(f"{address} serving", lambda: all(
            self.metrics(c).get(("mstar_preprocess_replica_serving", (("replica", address),))) == 1.0
            for c in preprocess), timeout_s)
        return time.monotonic() - start


@pytest.fixture
def scaleout(tmp_path, tiny_model):
    """Factory for private multi-replica stacks; all stopped when the test ends."""
    with contextlib.ExitStack() as stacks:
        def make(generation: int = 2, preprocess: int = 1, generation_args: tuple[str, ...] = (),
                 preprocess_args: tuple[str, ...] = ()) -> Rig:
            n = len(list(tmp_path.glob("stack*")))
            config = StackConfig.with_free_ports(
                generation_replicas=generation, preprocess_replicas=preprocess, generation_model=tiny_model,
                log_dir=tmp_path / f"stack{n}", ready_timeout_s=300.0,
                generation_args=list(generation_args), preprocess_args=list(preprocess_args))
            stack = Stack(config)
            stacks.enter_context(_started(stack))
            return Rig(stack)

        yield make


@contextlib.contextmanager
def _started(stack: Stack) -> Iterator[Stack]:
    stack.start()
    try:
        yield stack
    finally:
        stack.stop(grace_s=5.0)


def shared_prefix(tag: int, blocks: int = 6) -> list[int]:
    """A prompt of whole KV blocks unique to `tag` (token ids well inside the vocabulary)."""
    return [1000 + (tag * 131 + i) % 40000 for i in range(blocks * BLOCK)]


def log_of(stack: Stack, child: str) -> Path:
    return stack.children[child].log_path


@pytest.fixture(scope="session")
def figures():
    """Measured figures (seconds) for docs/reliability.md, written to build/scaleout-figures.json."""
    import json

    values: dict[str, float] = {}
    yield values
    if values:
        out = Path(__file__).resolve().parents[2] / "build" / "scaleout-figures.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**old, **values}, indent=2, sort_keys=True))
