"""A kernel launch as data, planned for a target: how every launcher in kernels/ runs its kernel.

    out, launches = plan_rms_norm(x, w, eps, None, Target.of(x.device))   # decide, allocate
    run(out, launches)                                                     # launch, return out

Each launcher splits into a ``plan_*`` function (checks, output allocation, grid, meta-parameters,
``num_warps``/``num_stages``) and the launch. The split exists for the ahead-of-time compile gate
(``kernels/aot``): it calls the same plan functions with ``meta`` tensors for a GPU this machine
does not have, so what it compiles is what the launchers pick, not a copy of their rules.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """Where launches run: compiled for a GPU (with its SM count), or the interpreter on CPU."""

    compiled: bool  # False: Triton's interpreter (TRITON_INTERPRET=1), programs run one by one
    num_sms: int = 0  # streaming multiprocessors: sizes the split-KV grid

    @staticmethod
    def of(device: torch.device) -> Target:
        return _cuda_target(device.index if device.index is not None else torch.cuda.current_device()) \
            if device.type == "cuda" else INTERPRETER


INTERPRETER = Target(compiled=False)
H200 = Target(compiled=True, num_sms=132)  # H100 SXM has 132 too
A100 = Target(compiled=True, num_sms=108)


@functools.cache
def _cuda_target(index: int) -> Target:
    return Target(compiled=True, num_sms=torch.cuda.get_device_properties(index).multi_processor_count)


@dataclass(frozen=True)
class Launch:
    """One ``kernel[grid](*args, **meta, num_warps=, num_stages=)`` call, not yet made."""

    kernel: Any  # a triton JITFunction (an InterpretedFunction under TRITON_INTERPRET=1)
    grid: tuple[int, ...]
    args: tuple  # runtime arguments in the kernel's order (tensors, ints, floats)
    meta: dict[str, Any] = field(default_factory=dict)  # tl.constexpr arguments by name
    num_warps: int = 4
    num_stages: int = 3

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.meta, num_warps=self.num_warps, num_stages=self.num_stages)


def warps_for(elements: int, per_thread: int) -> int:
    """Warps for a one-tile program of ``elements``: ~per_thread elements each, 4 to 16 warps.

    A single-tile kernel holds its tile in registers; with a fixed 4 warps a large tile (RoPE on 64
    heads x 64, a 32 x 128 fp32 KV row) needs 80-120 registers a thread and halves occupancy.
    """
    return min(16, max(4, elements // (32 * per_thread)))


def run(result: T, launches: Sequence[Launch]) -> T:
    for launch in launches:
        launch()
    return result
