"""Call the compiled step's graph directly, without Dynamo's per-call entry.

torch.compile's entry costs ~1.5 ms a step for the default model on a 2-core box (measured:
CompiledStep.__call__ 13.3 ms against 11.8 ms inside the backend's compiled function, 1 row):
Dynamo checks its guards and gathers the graph's 500 arguments (every weight is a graph input)
from the frame on every call. Within one runner those arguments never change, except the step's
own tensors and their sizes: the weights and KV-cache tensors are the same objects for the
runner's lifetime, and the one graph serves every step (every input dimension is unbacked).

    backend = RecordingBackend("inductor")       # torch.compile(..., backend=backend)
    ... warm-up through torch.compile ...
    call = DirectCall.build(backend, run_dynamo, probes)  # None if anything does not match

`DirectCall.build` records the argument list Dynamo passes for a probe step whose sizes are all
different (tokens 5, sequences 2, cu_seqlens 3, logits rows 1, block-table width 4), so every
argument is either a static object, one of the step's seven tensors (by identity) or one of its
sizes (by value). It then checks a second probe of other sizes both ways, bit for bit; any
difference (another torch, another graph layout) leaves serving on the Dynamo path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch._dynamo.backends.registry import lookup_backend

from services.generation.models.llama import StepMetadata

log = logging.getLogger(__name__)

def step_tensors(input_ids: torch.Tensor, meta: StepMetadata) -> dict[str, torch.Tensor]:
    return {"input_ids": input_ids, "positions": meta.positions, "slot_mapping": meta.slot_mapping,
            "block_tables": meta.block_tables, "cu_seqlens_q": meta.cu_seqlens_q,
            "context_lens": meta.context_lens, "logits_indices": meta.logits_indices}


def step_sizes(input_ids: torch.Tensor, meta: StepMetadata) -> dict[str, int]:
    """The sizes a step's unbacked dimensions take (tokens appear as three inputs' length, all equal)."""
    return {"tokens": input_ids.shape[0], "sequences": meta.context_lens.shape[0],
            "cu_seqlens": meta.cu_seqlens_q.shape[0], "logits_rows": meta.logits_indices.shape[0],
            "width": meta.block_tables.shape[1]}


class RecordingBackend:
    """A torch.compile backend: compiles with `backend` and keeps the compiled function, and the
    arguments of the next call after `record()`."""

    def __init__(self, backend: str | Callable) -> None:
        self.compile = lookup_backend(backend)
        self.fn: Callable | None = None
        self.graphs = 0
        self.recorded: list | None = None
        self._record = False

    def __call__(self, gm, example_inputs):
        fn = self.compile(gm, example_inputs)
        self.fn, self.graphs = fn, self.graphs + 1

        def run(*args):
            if self._record:
                self.recorded, self._record = list(args), False
            return fn(*args)

        return run

    def record(self) -> None:
        self._record, self.recorded = True, None


class DirectCall:
    """The compiled function called with the recorded argument list, the step's parts swapped in."""

    def __init__(self, fn: Callable, template: list, tensor_slots: list[tuple[int, str]],
                 size_slots: list[tuple[int, str]], kinds: dict[str, tuple]) -> None:
        self.fn, self.template = fn, template
        self.tensor_slots, self.size_slots = tensor_slots, size_slots
        self.kinds = kinds  # name -> (dtype, device, ndim) the graph was traced on

    def accepts(self, input_ids: torch.Tensor, meta: StepMetadata) -> bool:
        """What Dynamo's guards checked and the direct call does not: the step's tensors are of the
        traced dtypes, device and ranks (the runner always builds them so; a test may not)."""
        return all(_kind(t) == self.kinds[name] for name, t in step_tensors(input_ids, meta).items())

    def __call__(self, input_ids: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        args = self.template.copy()
        tensors = step_tensors(input_ids, meta)
        for i, name in self.tensor_slots:
            args[i] = tensors[name]
        if self.size_slots:
            sizes = step_sizes(input_ids, meta)
            for i, name in self.size_slots:
                args[i] = sizes[name]
        (logits,) = self.fn(*args)
        return logits

    @classmethod
    def build(cls, backend: RecordingBackend, run_dynamo: Callable, probes: Sequence[tuple]) -> DirectCall | None:
        """probes[0]: a step whose five sizes differ from each other; the others check the result.
        run_dynamo(input_ids, meta) -> logits through torch.compile. None when the graph's
        arguments cannot be told apart or a check differs (the reason is logged)."""
        try:
            call = cls._from_probe(backend, run_dynamo, *probes[0])
            for input_ids, meta in probes[1:]:
                backend.record()
                expected = run_dynamo(input_ids, meta)
                if backend.graphs != 1 or backend.recorded is None:
                    raise ValueError(f"{backend.graphs} graphs; the direct call needs exactly one")
                static = [i for i, a in enumerate(call.template) if isinstance(a, torch.Tensor)]
                if len(backend.recorded) != len(call.template) or any(
                        backend.recorded[i] is not call.template[i] for i in static):
                    raise ValueError("the graph's other arguments changed between two steps")
                got = call(input_ids, meta)
                if got.shape != expected.shape or not torch.equal(got, expected):
                    raise ValueError("the direct call's logits differ from torch.compile's")
        except (ValueError, TypeError, RuntimeError) as e:
            log.warning("compiled step stays behind Dynamo's entry", extra={"reason": str(e)[:300]})
            return None
        return call

    @classmethod
    def _from_probe(cls, backend: RecordingBackend, run_dynamo: Callable, input_ids, meta) -> DirectCall:
        sizes = step_sizes(input_ids, meta)
        if len(set(sizes.values())) != len(sizes):
            raise ValueError(f"the first probe's sizes must all differ: {sizes}")
        by_value = {v: k for k, v in sizes.items()}
        tensors = step_tensors(input_ids, meta)
        by_id = {id(t): name for name, t in tensors.items()}
        if len(by_id) != len(tensors):
            raise ValueError("the probe's step tensors must be distinct objects")
        backend.record()
        run_dynamo(input_ids, meta)
        args = backend.recorded
        if args is None or backend.fn is None:
            raise ValueError("no compiled graph was called")
        template, tensor_slots, size_slots = list(args), [], []
        for i, arg in enumerate(args):
            if id(arg) in by_id:
                tensor_slots.append((i, by_id[id(arg)]))
                template[i] = None
            elif isinstance(arg, int) and not isinstance(arg, bool):
                if arg not in by_value:
                    raise ValueError(f"graph argument {i} is the int {arg}, not one of the step's sizes {sizes}")
                size_slots.append((i, by_value[arg]))
            elif not isinstance(arg, torch.Tensor):
                raise ValueError(f"graph argument {i} is a {type(arg).__name__}")
        kinds = {name: _kind(t) for name, t in tensors.items()}
        return cls(backend.fn, template, tensor_slots, size_slots, kinds)


def _kind(t: torch.Tensor) -> tuple:
    return t.dtype, t.device, t.dim()
