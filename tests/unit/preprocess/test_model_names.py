"""Which `model` names select the served model (services/preprocess/model.py): its id, "default"
and the Hugging Face repo id it comes from — never a local path that only looks like one, never a
near miss."""

from __future__ import annotations

import json

import pytest

from services.preprocess.model import _hf_repo, load_model

DEFAULT_HF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_the_default_model_answers_to_its_hub_name():
    model = load_model("default")
    assert model.aliases == (DEFAULT_HF_REPO,) == ("HuggingFaceTB/SmolLM2-135M-Instruct",)
    for name in (model.name, "default", DEFAULT_HF_REPO):
        assert model.answers_to(name)
    for name in ("", "huggingfacetb/smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-360M-Instruct", "gpt-4o"):
        assert not model.answers_to(name)


@pytest.mark.parametrize(("value", "alias"), [
    ("Qwen/Qwen3-0.6B", ("Qwen/Qwen3-0.6B",)),
    ("/home/me/ckpt/smollm", ()),  # saved from a local directory: not a repo id
    ("./ckpt/x", ()),
    ("smollm", ()),
    ("a/b/c", ()),
    (None, ()),
    (7, ()),
])
def test_a_checkpoint_names_its_repo_only_as_org_slash_name(value, alias):
    assert _hf_repo(value) == alias


def test_an_hf_directory_takes_its_name_or_path(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"hello": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"_name_or_path": "HuggingFaceTB/SmolLM2-135M"}))
    model = load_model(str(tmp_path))
    assert model.name == tmp_path.name and model.answers_to("HuggingFaceTB/SmolLM2-135M")
    (tmp_path / "config.json").write_text(json.dumps({"_name_or_path": str(tmp_path)}))
    assert load_model(str(tmp_path)).aliases == ()
