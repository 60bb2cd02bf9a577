"""Which Step a runner serves with: ONE table over (device, numerics, mode), read in one place.

mode is what ``--step`` (default ``$MSTAR_STEP``, else auto) asks for: auto | eager | graph | fused.
For the step, the numerics (numerics.py) come in three kinds:

  reference  the reference kernels (the HF oracle: ``--dtype float32 --quantization none``, or
             ``--kernels reference``); they stay eager, so the oracle's bits are torch's
  codes      every projection a GGUF's block codes, fp32 activations, the cpu kernels: what
             KernelOps.decoder_stack runs (fused_step.fusable)
  other      anything else: dense or bf16 on the cpu kernels, Triton (CUDA, or the interpreter)

A row names the step and why (the start-up log line says both), or refuses a forced mode that
cannot be honoured, naming the fix. Whatever the row, a batch the step does not cover (its
``covers``) runs eagerly: that is the Step protocol's, not a second choice (step.py). No torch
here: the service reads MODES before it imports torch; ModelRunner builds the step a row names.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("auto", "eager", "graph", "fused")
STEP_ENV = "MSTAR_STEP"  # the service's --step default (the test suite sets eager: tests/conftest.py)


@dataclass(frozen=True)
class StepChoice:
    step: str | None  # "eager" | "graph" | "fused" | "cuda-graphs"; None: the mode is refused
    why: str


_EAGER = StepChoice("eager", "--step eager: every step op by op")
_NOT_FUSED = "--step fused needs every projection as a GGUF's block codes, fp32 activations and the cpu kernels"

TABLE: dict[tuple[str, str, str], StepChoice] = {
    ("cpu", "reference", "auto"): StepChoice("eager", "the reference kernels are the HF oracle: eager"),
    ("cpu", "reference", "eager"): _EAGER,
    ("cpu", "reference", "graph"): StepChoice(None, "--step graph needs --kernels cpu: the reference kernels "
                                                    "are the HF oracle and run eager"),
    ("cpu", "reference", "fused"): StepChoice(None, _NOT_FUSED),
    ("cpu", "codes", "auto"): StepChoice("fused", "a GGUF's codes in fp32: every layer in one C++ call, "
                                                  "nothing to compile (fused_step.py)"),
    ("cpu", "codes", "eager"): _EAGER,
    ("cpu", "codes", "graph"): StepChoice("graph", "--step graph: one Inductor graph for every step, built at warm-up"),
    ("cpu", "codes", "fused"): StepChoice("fused", "--step fused: every layer in one C++ call (fused_step.py)"),
    ("cpu", "other", "auto"): StepChoice("graph", "one Inductor graph for every step, built at warm-up "
                                                  "(compiled_step.py)"),
    ("cpu", "other", "eager"): _EAGER,
    ("cpu", "other", "graph"): StepChoice("graph", "--step graph: one Inductor graph for every step, built at warm-up"),
    ("cpu", "other", "fused"): StepChoice(None, _NOT_FUSED),
    ("cuda", "other", "auto"): StepChoice("cuda-graphs", "one CUDA graph per decode batch size, captured at "
                                                         "warm-up; prefill and mixed steps eager"),
    ("cuda", "other", "eager"): _EAGER,
    ("cuda", "other", "graph"): StepChoice("cuda-graphs", "--step graph on CUDA: one CUDA graph per decode "
                                                          "batch size; prefill and mixed steps eager"),
    ("cuda", "other", "fused"): StepChoice(None, "--step fused runs on CPU only (kernels/cpu decoder_stack)"),
}


def numerics_kind(kernels: str, fusable: bool) -> str:
    """The numerics' column of TABLE: kernels is Numerics.kernels; fusable: fused_step.fusable(...)."""
    if kernels == "reference":
        return "reference"
    return "codes" if fusable else "other"


def choose_step(device: str, numerics: str, mode: str) -> StepChoice:
    """TABLE's row for (device type, numerics_kind(...), mode); ValueError for a refused or unknown one."""
    if mode not in MODES:
        raise ValueError(f"step must be one of {', '.join(MODES)}; got {mode!r}")
    choice = TABLE.get((device, numerics, mode))
    if choice is None:
        raise ValueError(f"no step for {numerics} numerics on {device}")
    if choice.step is None:
        raise ValueError(choice.why)
    return choice

