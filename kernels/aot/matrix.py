"""Every launch the engine can make for the supported models: the model's op calls, planned per GPU.

The model lives above kernels/ (services/generation/models), so the gate does not run it: the
generation side runs one step per engine step shape through the model on meta tensors and writes
every KernelOps call it makes (op, argument shapes, strides, view offsets, dtypes, scalars) to
kernel_calls.json (``python -m services.generation.kernel_calls``; a test keeps it current). Here
each call is replayed through the launchers' ``plan_*`` functions for a GPU target instead of
launching, so the matrix follows whatever the model calls and the launchers pick (views into the
fused qkv output, residual or not, decode or prefill tiles, split-KV from the SM count) without
restating either's rules. Meta tensors carry shapes, strides and dtypes but no memory: a
70B-shaped layer costs nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.launch import Launch, Target
from kernels.shapes import BLOCK_SIZES, DTYPES, SUPPORTED, ModelShape

META = torch.device("meta")
CALLS_PATH = Path(__file__).with_name("kernel_calls.json")


@dataclass(frozen=True)
class Recorded:
    launch: Launch
    model: ModelShape
    dtype: torch.dtype
    step: str  # the engine step shape's name, e.g. "decode B=16 ctx=16k"


def engine_launches(target: Target, models=SUPPORTED, dtypes=DTYPES, block_sizes=BLOCK_SIZES,
                    path: Path = CALLS_PATH) -> list[Recorded]:
    """The launches of every recorded step of ``models`` x ``dtypes`` x ``block_sizes`` on ``target``."""
    document = json.loads(path.read_text())
    calls, by_name = document["calls"], {m.name: m for m in models}
    dtype_names = {_dtype_name(d) for d in dtypes}
    steps = [s for s in document["steps"]
             if s["model"] in by_name and s["dtype"] in dtype_names and s["block_size"] in block_sizes]
    absent = set(by_name) - {s["model"] for s in steps}
    if absent:
        raise LookupError(f"{path.name} has no calls for {', '.join(sorted(absent))}: "
                          "run `python -m services.generation.kernel_calls`")
    ops = PlanningOps(target)
    out: list[Recorded] = []
    for step in steps:
        for index in step["calls"]:
            ops.launches = []
            ops.replay(calls[index])
            out += [Recorded(launch, by_name[step["model"]], getattr(torch, step["dtype"]), step["step"])
                    for launch in ops.launches]
    return out


def describe(op: str, args: tuple) -> dict:
    """One op call as data: tensors by shape, stride, view offset and dtype; scalars as they are."""
    return {"op": op, "args": [_describe_arg(a) for a in args]}


def _describe_arg(arg):
    if isinstance(arg, torch.Tensor):
        return {"shape": list(arg.shape), "stride": list(arg.stride()), "offset": arg.storage_offset(),
                "dtype": _dtype_name(arg.dtype)}
    if arg is None or isinstance(arg, (bool, int, float)):
        return arg
    raise TypeError(f"a kernel op argument the launch matrix cannot record: {type(arg).__name__}")


def _materialize(arg):
    """A meta view with the recorded layout (its offset is what the binder sees as the pointer)."""
    if not isinstance(arg, dict):
        return arg
    extent = arg["offset"] + sum((n - 1) * s for n, s in zip(arg["shape"], arg["stride"], strict=True)) + 1
    base = torch.empty(extent, dtype=getattr(torch, arg["dtype"]), device=META)
    return base.as_strided(arg["shape"], arg["stride"], arg["offset"])


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class PlanningOps:
    """KernelOps' op table, each op planned for ``target`` and recorded instead of launched."""

    def __init__(self, target: Target):
        self.target = target
        self.launches: list[Launch] = []

    def table(self) -> dict:
        """The op table KernelOps(META, "aot", table) calls (the generation side records through it)."""
        return {"rms_norm": self.rms_norm, "apply_rotary": self.apply_rotary, "silu_and_mul": self.silu_and_mul,
                "gelu_tanh_and_mul": self.gelu_tanh_and_mul, "store_kv": self.store_kv, "paged_attention": self.paged_attention, "sample": self.sample}

    def replay(self, call: dict) -> None:
        self.table()[call["op"]](*(_materialize(a) for a in call["args"]))

    def _keep(self, planned):
        result, launches = planned
        self.launches += launches
        return result

    def rms_norm(self, x, weight, eps, residual=None):
        from kernels.rms_norm import plan_rms_norm

        return self._keep(plan_rms_norm(x, weight, eps, residual, self.target))

    def apply_rotary(self, q, k, positions, cos_sin):
        from kernels.rotary import plan_apply_rotary

        self.launches += plan_apply_rotary(q, k, positions, cos_sin, self.target)

    def silu_and_mul(self, x):
        from kernels.swiglu import plan_silu_and_mul

        return self._keep(plan_silu_and_mul(x, self.target))

    def gelu_tanh_and_mul(self, x):
        from kernels.swiglu import plan_silu_and_mul

        return self._keep(plan_silu_and_mul(x, self.target, gelu=True))

    def store_kv(self, k, v, k_cache, v_cache, slots):
        from kernels.kv_cache import plan_store_kv

        self.launches += plan_store_kv(k, v, k_cache, v_cache, slots, self.target)

    def paged_attention(self, q, k_cache, v_cache, tables, cu_seqlens_q, context_lens, scale, window=0):
        from kernels.paged_attention import plan_paged_attention

        return self._keep(plan_paged_attention(q, k_cache, v_cache, tables, cu_seqlens_q, context_lens, scale,
                                               self.target, window=window))

    def sample(self, logits, temperature, top_k, top_p, min_p, seeds, offsets):
        # The filters (top-k/p, min-p) are torch ops; the Triton draw runs for every row.
        from kernels.sampling import plan_draw

        return self._keep(plan_draw(logits, temperature, seeds, offsets, self.target))
