"""What each token id spells, read from the checkpoint: the input of grammar-constrained decoding.

The generation service never tokenizes text; structured output only needs, per token id, the
bytes it stands for, and which ids are control tokens (never text). Both come from the files the
weights come from: a GGUF's ``tokenizer.ggml.*`` metadata or an HF directory's tokenizer.json.
Tokens are kept as the file spells them, with the file's encoding named, so the grammar library
decodes them exactly the way the tokenizer does:

- ``byte_level``: GPT-2 byte-to-unicode alphabet ("Ġthe" is b" the"); GGUF "gpt2", HF ByteLevel.
- ``byte_fallback``: SentencePiece pieces ("▁the", "<0x0A>"); GGUF "llama", HF byte_fallback.
- ``raw``: the token's text is its UTF-8 bytes (synthetic test vocabularies, tiktoken-style files).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from services.generation.models.config import CheckpointError

BYTE_LEVEL = "byte_level"
BYTE_FALLBACK = "byte_fallback"
RAW = "raw"
ENCODINGS = (BYTE_LEVEL, BYTE_FALLBACK, RAW)

# GGUF token types (llama.cpp llama_token_type) that never stand for text.
_GGUF_UNKNOWN, _GGUF_CONTROL, _GGUF_UNUSED = 2, 3, 5
_GGUF_ENCODINGS = {"gpt2": BYTE_LEVEL, "llama": BYTE_FALLBACK}


@dataclass(frozen=True)
class Vocabulary:
    tokens: tuple[str, ...]  # index = token id, spelled as the tokenizer file spells it
    encoding: str  # one of ENCODINGS
    control_token_ids: frozenset[int]  # special/control/unknown/unused: masked by every grammar
    add_prefix_space: bool = False  # the tokenizer prepends a space to the text (SentencePiece)

    def __post_init__(self):
        if self.encoding not in ENCODINGS:
            raise ValueError(f"vocabulary encoding must be one of {ENCODINGS}, got {self.encoding!r}")

    def __len__(self) -> int:
        return len(self.tokens)


def vocabulary_from_gguf(fields: Mapping[str, object]) -> Vocabulary | None:
    """The vocabulary in a GGUF's metadata (weights/gguf_file.py's decoded fields); None when it has
    none or one of an unsupported kind."""
    model = fields.get("tokenizer.ggml.model")
    tokens = fields.get("tokenizer.ggml.tokens")
    if model not in _GGUF_ENCODINGS or not isinstance(tokens, list):
        return None
    encoding = _GGUF_ENCODINGS[model]
    spelled = tuple(tokens)
    types = fields.get("tokenizer.ggml.token_type")
    kinds = [int(t) for t in types] if types is not None else [1] * len(spelled)
    control = frozenset(i for i, t in enumerate(kinds) if t in (_GGUF_UNKNOWN, _GGUF_CONTROL, _GGUF_UNUSED))
    prefix = fields.get("tokenizer.ggml.add_space_prefix")
    add_prefix_space = bool(prefix) if prefix is not None else encoding == BYTE_FALLBACK
    return Vocabulary(spelled, encoding, control, add_prefix_space)


def vocabulary_from_tokenizer_json(directory: str) -> Vocabulary | None:
    """The vocabulary of an HF directory's tokenizer.json; None when there is no such file."""
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read the vocabulary ({e})") from e
    model = raw.get("model") or {}
    vocab = model.get("vocab") or {}
    by_id: dict[int, str] = {}
    if isinstance(vocab, dict):  # BPE, WordPiece: piece -> id
        by_id.update((int(i), piece) for piece, i in vocab.items())
    else:  # Unigram: [[piece, score], ...] in id order
        by_id.update((i, entry[0]) for i, entry in enumerate(vocab))
    added = raw.get("added_tokens") or []
    by_id.update((int(t["id"]), t["content"]) for t in added)
    size = max(by_id, default=-1) + 1
    spelled = tuple(by_id.get(i, "") for i in range(size))
    control = frozenset(int(t["id"]) for t in added if t.get("special")) | {i for i in range(size) if i not in by_id}
    decoder = json.dumps(raw.get("decoder"))
    if "ByteLevel" in decoder:
        encoding = BYTE_LEVEL
    elif model.get("byte_fallback") or "ByteFallback" in decoder or "Metaspace" in decoder:
        encoding = BYTE_FALLBACK
    else:
        encoding = RAW
    normalizer = json.dumps(raw.get("normalizer")) + json.dumps(raw.get("pre_tokenizer"))
    add_prefix_space = encoding == BYTE_FALLBACK and ('"prepend": "\\u2581"' in normalizer
                                                      or '"prepend_scheme": "always"' in normalizer
                                                      or '"prepend_scheme": "first"' in normalizer)
    return Vocabulary(spelled, encoding, frozenset(control), add_prefix_space)
