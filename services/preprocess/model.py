"""The served model as the preprocess service sees it: name, context, tokenizer, template.

`--model default` (the SmolLM2 GGUF) and the other packaged names (services/common/packaged_models.py:
gemma3-270m) resolve to the file the package installed. A path may be a `.gguf` file or a Hugging
Face directory holding tokenizer.json (+ tokenizer_config.json, config.json).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from services.common.packaged_models import PackagedModelError, packaged, packaged_model_path
from services.preprocess.chat_template import ChatTemplate
from services.preprocess.request import IMAGE, TEXT
from services.preprocess.tokenizer import Tokenizer, TokenizerError

_HF_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


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
    # A vision-language checkpoint's image processor (images.ImageProcessor; Idefics3): "image" is
    # then among input_modalities. None for a text-only model.
    images: Any = None

    def answers_to(self, model: str) -> bool:
        """`model` names this model: its id, "default" or an alias (exactly, as vLLM matches)."""
        return model in (self.name, "default", *self.aliases)


def default_model_path() -> Path:
    return _packaged_path("default")


def _packaged_path(name: str) -> Path:
    try:
        return Path(packaged_model_path(name))
    except PackagedModelError as e:
        raise TokenizerError(str(e)) from e


def read_gguf_metadata(path: Path) -> dict:
    """Decoded key/value metadata of a GGUF file (tensor data is not touched): scalars and strings as
    Python values, numeric arrays as numpy arrays, the token and merge spellings as lists of str."""
    from services.common.gguf_file import GGUFFile  # imports gguf: only when a GGUF is actually loaded

    reader = GGUFFile(str(path), strings=_TOKENIZER_STRINGS)
    return {key: value for key, value in reader.fields.items()
            if key.startswith(("tokenizer.", "general.")) or key.endswith((".context_length", ".embedding_length"))}


_TOKENIZER_STRINGS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.merges"})


def load_model(model: str) -> ModelSpec:
    """Resolve `default` (or another packaged name), a .gguf file or a Hugging Face directory into a ModelSpec."""
    entry = packaged(model)
    if entry is not None:  # the packaged file's metadata does not name its HF repo: the table does
        named = () if model == "default" else (model,)
        return replace(_from_gguf(_packaged_path(model)), aliases=(*entry.aliases, *named))
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
    images = None
    if model_config.get("model_type") == "idefics3":  # a VLM: its decoder's config, its image processor
        from services.preprocess.images import ImageProcessor, ImageProcessorConfig

        images = ImageProcessor(ImageProcessorConfig.from_dir(path))
        model_config = {**(model_config.get("text_config") or {}), "model_type": "idefics3",
                        "_name_or_path": model_config.get("_name_or_path")}
    tokenizer = Tokenizer.from_json(path / "tokenizer.json", config)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: HF uses the one called "default"
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return ModelSpec(
        aliases=_hf_repo(model_config.get("_name_or_path")),  # the repo it was saved from, if not a local path
        name=path.name,
        path=path,
        context_length=int(model_config.get("max_position_embeddings", 2048)),
        # transformers names a multimodal family's text-only config "<family>_text" (gemma3_text)
        family=str(model_config.get("model_type", "")).removesuffix("_text"),
        hidden_size=int(model_config.get("hidden_size", 0)),
        tokenizer=tokenizer,
        chat_template=ChatTemplate(template, tokenizer.special) if template else None,
        images=images,
        input_modalities=frozenset({TEXT, IMAGE} if images else {TEXT}),
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
