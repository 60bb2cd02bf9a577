"""The compile gate: distinct configurations from the matrix, resources from the ledger or ptxas, limits.

    configs = collect()                       # every distinct compile, both GPUs
    outcomes = evaluate(configs, ledger.load(), jobs=2)
    failed = [o for o in outcomes if o.problems]

A configuration is one distinct ``triton.compile`` (its hash): the same compiled kernel serves
many (model, dtype, page size, step) launches, which are kept as ``models``/``steps`` for the table.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from dataclasses import dataclass, field

import torch

from kernels.aot import build, limits
from kernels.aot.build import Resources, Spec
from kernels.aot.limits import GPUS, Gpu
from kernels.shapes import DEFAULT

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass
class Config:
    spec: Spec
    gpu: Gpu
    meta: dict  # the launch's constexpr arguments
    models: set[str] = field(default_factory=set)
    dtypes: set[str] = field(default_factory=set)  # the models' activation dtypes that launch it
    steps: set[str] = field(default_factory=set)

    @property
    def kernel(self) -> str:
        return self.spec.kernel

    @property
    def dtype(self) -> str:
        return ", ".join(d for d in _DTYPE_NAMES.values() if d in self.dtypes)


@dataclass
class Outcome:
    config: Config
    resources: Resources
    compiled: bool  # compiled in this run (else read from the ledger)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)  # the kernel fails the limits (or to compile)
    disagreements: list[str] = field(default_factory=list)  # the ledger or the key is wrong

    def to_json(self) -> dict:
        """The report entry (``python -m kernels.aot --report``; bench/kernel_doc.py renders these)."""
        c = self.config
        return {
            "key": c.spec.key, "kernel": c.kernel, "arch": c.gpu.arch, "dtype": c.dtype, "meta": c.meta,
            "num_warps": c.spec.num_warps, "num_stages": c.spec.num_stages, "models": sorted(c.models),
            "steps": sorted(c.steps), "compiled": self.compiled, "seconds": round(self.seconds, 3),
            "resources": self.resources.to_json(), "problems": self.problems, "disagreements": self.disagreements,
        }


def collect(gpus: tuple[Gpu, ...] = GPUS, **matrix_filters) -> list[Config]:
    """matrix_filters: models=, dtypes=, block_sizes= (kernels/aot/matrix.py's engine_launches)."""
    from kernels.aot.matrix import engine_launches

    configs: dict[str, Config] = {}
    for gpu in gpus:
        for rec in engine_launches(gpu.target, **matrix_filters):
            spec = build.spec_for(rec.launch, gpu.arch)
            config = configs.setdefault(spec.key, Config(spec, gpu, dict(rec.launch.meta)))
            config.models.add(rec.model.name)
            config.dtypes.add(_DTYPE_NAMES[rec.dtype])
            config.steps.add(rec.step)
    return list(configs.values())


def is_spot_check(config: Config) -> bool:
    """Recompiled on every run and compared with the ledger: the default model's bf16 kernels on sm_90."""
    return DEFAULT.name in config.models and "bf16" in config.dtypes and config.gpu.arch == "sm_90"


def from_ledger(configs: list[Config], stored: dict[str, Resources]) -> list[Outcome]:
    """Outcomes straight from the ledger, no compiling (every config must be in it)."""
    return [Outcome(c, stored[c.spec.key], False) for c in configs]


def evaluate(configs: list[Config], stored: dict[str, Resources], jobs: int, recompile: bool = False) -> list[Outcome]:
    """Resources for every config (compiling what the ledger lacks, and the spot checks), then limits."""
    todo = [c for c in configs if recompile or c.spec.key not in stored or is_spot_check(c)]
    fresh = _compile_all([c.spec for c in todo], jobs)
    outcomes = []
    for config in configs:
        key = config.spec.key
        if key in fresh:
            resources, seconds, triton_hash = fresh[key]
            outcome = Outcome(config, resources, True, seconds)
            if not resources.error and triton_hash != key:
                outcome.disagreements.append(f"Triton filed the compile under {triton_hash[:12]}, not the key "
                                        f"{key[:12]} the gate computed: build.spec_for no longer matches Triton's JIT")
            if key in stored and stored[key] != resources:
                outcome.disagreements.append(f"the ledger says {stored[key]}, the compiler {resources}")
        else:
            outcome = Outcome(config, stored[key], False)
        outcome.problems += limits.violations(config.kernel, config.meta, config.spec.num_warps, outcome.resources, config.gpu)
        outcomes.append(outcome)
    return outcomes


def _compile_all(specs: list[Spec], jobs: int) -> dict[str, tuple[Resources, float, str]]:
    if not specs:
        return {}
    # The slow ones first, so the pool does not end on one long compile.
    specs = sorted(specs, key=lambda s: (s.kernel != "_paged_attention_kernel", s.key))
    if jobs <= 1:
        return {s.key: build.compile_spec(s) for s in specs}
    # spawn: a forked child would inherit Triton's MLIR state from the parent's imports.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        return dict(zip((s.key for s in specs), pool.map(build.compile_spec, specs, chunksize=1), strict=True))


def ledger_diff(configs: list[Config], stored: dict[str, Resources]) -> tuple[list[Config], set[str]]:
    """(configs the ledger lacks, ledger keys no config produces any more)."""
    keys = {c.spec.key for c in configs}
    return [c for c in configs if c.spec.key not in stored], set(stored) - keys

