"""SentencePiece vocabularies from GGUF metadata (`tokenizer.ggml.model` == "llama"), as BPE.

A GGUF holds a SentencePiece model as pieces, scores and token types, but no merges, and the
`tokenizers` BPE model runs on merges. They are recovered from the vocabulary exactly as
transformers does it (integrations/gguf/gguf_tokenizer_mapping.py and
tokenization_utils_base.generate_merges), so that transformers' own GGUF loader is the oracle the
tests compare against: every split of a piece into two pieces of the vocabulary is a merge, ranked
best piece first, then longer left half, then longer right half, then vocabulary order.

Gemma files need transformers' two fixes: their scores do not follow the merge order (control,
user-defined and byte tokens all carry -1000 or 0), the order of the pieces in the file does; and
runs of spaces are stored as real spaces where the pieces around them spell a space "▁".
"""

from __future__ import annotations

import re

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

_SPACE = "\u2581"
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_GEMMA = frozenset({"gemma", "gemma2", "gemma3"})
# Phi-3 prepends its space with a normalizer (so after every special token too), not Metaspace.
_PHI3 = "phi3"


def piece_bytes(piece: str, byte_fallback: bool = True) -> bytes:
    """The bytes a piece stands for: `<0xNN>` byte-fallback tokens are that one byte."""
    match = _BYTE_TOKEN.match(piece) if byte_fallback and piece.startswith("<0x") else None
    if match:
        return bytes([int(match.group(1), 16)])
    return piece.replace(_SPACE, " ").encode("utf-8")


def vocabulary_pieces(fields: dict) -> list[str]:
    """The pieces by id, as the BPE model spells them (Gemma's space runs respelled)."""
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    if fields.get("general.architecture") not in _GEMMA:
        return list(tokens)
    return [_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]


def sentencepiece_backend(fields: dict) -> tokenizers.Tokenizer:
    """The BPE tokenizer (no added tokens yet) for a SentencePiece GGUF's metadata."""
    arch = fields.get("general.architecture")
    pieces = vocabulary_pieces(fields)
    if arch in _GEMMA:
        ranks: list[float] = [-i for i in range(len(pieces))]
    else:
        scores = fields.get("tokenizer.ggml.scores")  # a numpy array as read from the file
        ranks = [float(x) for x in scores] if scores is not None else [-i for i in range(len(pieces))]
    unk_id = fields.get("tokenizer.ggml.unknown_token_id")
    vocab = {piece: i for i, piece in enumerate(pieces)}
    model = models.BPE(
        vocab=vocab,
        merges=_merges(pieces, ranks, vocab),
        unk_token=pieces[unk_id] if unk_id is not None else None,
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = tokenizers.Tokenizer(model)
    # llama.cpp prepends the space unless the file says not to; Gemma's converter always says not.
    prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", arch not in _GEMMA))
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if arch in _GEMMA or arch == _PHI3:
        # No pre-tokenizer: transformers' Gemma one splits on " ", which the normalizer has
        # already replaced, so it never fires.
        replace = normalizers.Replace(" ", _SPACE)
        backend.normalizer = (
            normalizers.Sequence([normalizers.Prepend(_SPACE), replace]) if prefix else replace
        )
    else:
        scheme = "first" if prefix else "never"
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme=scheme, split=False)
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _merges(pieces: list[str], ranks: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    # Dicts as transformers builds them: a repeated piece keeps its first place and its last rank.
    rank_of = dict(zip(pieces, ranks, strict=True))
    found: list[tuple[str, str, float]] = []
    for piece, rank in rank_of.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                found.append((left, right, rank))
    # Stable: equal keys keep vocabulary order, as in transformers' reverse=True sort.
    found.sort(key=lambda m: (-m[2], -len(m[0]), -len(m[1])))
    return [(left, right) for left, right, _ in found]
