"""The one step chooser (step_choice.py): every row of its table, forced modes included, the refusals
naming their fix, the runner building what a row names, and the service's --step flag."""

from __future__ import annotations

import pytest

from services.generation import step_choice
from services.generation.__main__ import parse_args
from services.generation.compiled_step import CompiledStep
from services.generation.fused_step import FusedStep
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.step import EagerStep
from services.generation.step_choice import MODES, StepChoice, choose_step, numerics_kind
from services.generation.weights.gguf import load_gguf
from services.generation.weights.random_init import TINY, random_checkpoint, save_gguf

# (device, numerics, mode) -> the step, or the words a refusal must contain. Written out here, not
# derived from TABLE: a changed row fails this test until the change is meant.
EXPECTED = {
    ("cpu", "reference", "auto"): "eager",
    ("cpu", "reference", "eager"): "eager",
    ("cpu", "reference", "graph"): "refused: --step graph needs --kernels cpu",
    ("cpu", "reference", "fused"): "refused: --step fused needs every projection",
    ("cpu", "codes", "auto"): "fused",
    ("cpu", "codes", "eager"): "eager",
    ("cpu", "codes", "graph"): "graph",
    ("cpu", "codes", "fused"): "fused",
    ("cpu", "other", "auto"): "graph",
    ("cpu", "other", "eager"): "eager",
    ("cpu", "other", "graph"): "graph",
    ("cpu", "other", "fused"): "refused: --step fused needs every projection",
    ("cuda", "other", "auto"): "cuda-graphs",
    ("cuda", "other", "eager"): "eager",
    ("cuda", "other", "graph"): "cuda-graphs",
    ("cuda", "other", "fused"): "refused: --step fused runs on CPU only",
}


def test_the_table_has_exactly_the_expected_rows():
    assert set(step_choice.TABLE) == set(EXPECTED)
    assert {mode for _, _, mode in step_choice.TABLE} == set(MODES)


@pytest.mark.parametrize(("row", "expected"), EXPECTED.items(), ids=["/".join(k) for k in EXPECTED])
def test_each_row_chooses_its_step_or_refuses_naming_the_fix(row, expected):
    device, numerics, mode = row
    if expected.startswith("refused: "):
        with pytest.raises(ValueError, match=expected.removeprefix("refused: ")):
            choose_step(device, numerics, mode)
        return
    choice = choose_step(device, numerics, mode)
    assert isinstance(choice, StepChoice) and choice.step == expected
    assert choice.why  # the start-up log line says why
    if mode != "auto":
        assert f"--step {mode}" in choice.why  # a forced mode says it was forced


def test_unknown_modes_and_numerics_are_refused():
    with pytest.raises(ValueError, match="auto, eager, graph, fused; got 'compiled'"):
        choose_step("cpu", "other", "compiled")
    with pytest.raises(ValueError, match="no step for codes numerics on cuda"):
        choose_step("cuda", "codes", "auto")


def test_the_numerics_kind_is_the_kernels_and_whether_the_stack_fuses():
    assert numerics_kind("reference", fusable=False) == "reference"
    assert numerics_kind("cpu", fusable=True) == "codes"
    assert numerics_kind("cpu", fusable=False) == "other"
    assert numerics_kind("triton", fusable=False) == "other"


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    checkpoint = random_checkpoint(TINY, seed=4, std=0.3)
    return load_gguf(save_gguf(checkpoint, str(tmp_path_factory.mktemp("gguf") / "tiny-Q8_0.gguf"), "Q8_0"))


@pytest.mark.parametrize(("checkpoint", "config", "built"), [
    ("gguf", {}, FusedStep),
    ("gguf", {"step": "fused"}, FusedStep),
    ("gguf", {"step": "graph"}, CompiledStep),
    ("gguf", {"step": "eager"}, EagerStep),
    ("gguf", {"dtype": "bfloat16"}, CompiledStep),  # codes, but bf16 activations: not the stack's
    ("tiny_checkpoint", {}, CompiledStep),
    ("tiny_checkpoint", {"dtype": "float32", "quantization": "none"}, EagerStep),  # the oracle
    ("tiny_checkpoint", {"kernels": "reference"}, EagerStep),
])
def test_the_runner_builds_the_step_its_row_names(request, checkpoint, config, built):
    runner = ModelRunner(request.getfixturevalue(checkpoint), RunnerConfig(16, 4, "cpu", num_threads=1, **config))
    assert type(runner.step) is built and runner.step.name == runner.step_choice.step
    assert not runner.step.is_warm or built is EagerStep  # built at warm-up, never inside a step


@pytest.mark.parametrize(("checkpoint", "config", "error"), [
    ("tiny_checkpoint", {"step": "fused"}, "--step fused needs every projection"),
    ("tiny_checkpoint", {"kernels": "reference", "step": "graph"}, "--step graph needs --kernels cpu"),
    ("gguf", {"step": "turbo"}, "got 'turbo'"),
])
def test_the_runner_refuses_a_forced_step_it_cannot_serve(request, checkpoint, config, error):
    with pytest.raises(ValueError, match=error):
        ModelRunner(request.getfixturevalue(checkpoint), RunnerConfig(16, 4, "cpu", num_threads=1, **config))


def test_the_service_flag_defaults_to_the_environment(monkeypatch):
    monkeypatch.delenv(step_choice.STEP_ENV, raising=False)
    assert parse_args([]).step == "auto"
    monkeypatch.setenv(step_choice.STEP_ENV, "eager")  # what tests/conftest.py sets for the suite
    assert parse_args([]).step == "eager"
    assert parse_args(["--step", "fused"]).step == "fused"
    with pytest.raises(SystemExit):
        parse_args(["--step", "compiled"])
    monkeypatch.setenv(step_choice.STEP_ENV, "0")  # e.g. a stale MSTAR_COMPILE=0 renamed by hand
    with pytest.raises(SystemExit):
        parse_args([])
