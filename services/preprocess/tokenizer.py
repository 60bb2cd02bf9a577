"""Text <-> token ids for one model, built on the `tokenizers` library.

Two sources: the `tokenizer.ggml.*` metadata of a GGUF file (the embedded default model; for
SentencePiece vocabularies see sentencepiece.py) or a
Hugging Face `tokenizer.json`. Besides encode/decode the tokenizer exposes the raw bytes of every
token, because the streaming detokenizer works on bytes: that is the only representation in which
a multi-byte character split across tokens can be held back and invalid bytes replaced exactly
once.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers

from services.preprocess.sentencepiece import piece_bytes, sentencepiece_backend, vocabulary_pieces

# GGUF token types (llama.cpp `llama_token_type`): 3 = control (special), 4 = user-defined.
_GGUF_CONTROL = 3
_GGUF_USER_DEFINED = 4


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted (char -> byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_OF_CHAR = _byte_level_alphabet()

# How a byte-level vocabulary's text is split before its merges apply, by the GGUF's
# `tokenizer.ggml.pre` (llama.cpp's names, src/llama-vocab.cpp; the regexes are the checkpoints' own
# tokenizer.json ones, which llama.cpp quotes). None: GPT-2's (ByteLevel's built-in regex).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")  # one digit a piece
_PRE_TOKENIZER_SPLITS: dict[str, str | None] = {
    "default": None, "gpt-2": None, "phi-2": None,
    # SmolLM's tokenizer.json splits digits first; its vocabulary has no multi-digit pieces, and
    # transformers' reading of the GGUF (the oracle) applies GPT-2's regex alone.
    "smollm": None,
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
    "pixtral": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,  # Qwen2 and Qwen3 GGUFs say "qwen2"
}


def _byte_level_pre_tokenizer(fields: dict):
    pre = fields.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZER_SPLITS:
        raise TokenizerError(f"tokenizer.ggml.pre {pre!r} is not supported: one of {sorted(_PRE_TOKENIZER_SPLITS)} "
                             "(its text split decides which tokens a prompt becomes)")
    split = _PRE_TOKENIZER_SPLITS[pre]
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


class TokenizerError(ValueError):
    """The tokenizer files are missing, malformed or of an unsupported kind."""


@dataclass(frozen=True)
class SpecialTokens:
    """Control tokens the template and the engine need."""

    bos_token: str
    eos_token: str
    eos_token_ids: tuple[int, ...]
    special_ids: frozenset[int]
    bos_token_id: int | None = None


class Tokenizer:
    """Encodes prompt text and gives each token's bytes for streaming decode."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        token_bytes: list[bytes],
        special: SpecialTokens,
        split_stable: bool,
        add_bos: bool = False,
    ) -> None:
        self._backend = backend
        self._token_bytes = token_bytes
        self.special = special
        # True when encode(a + b) == encode(a) + encode(b) whenever `a` ends on a pre-token
        # boundary (byte-level BPE). Incremental tokenization of appended text relies on it.
        self.split_stable = split_stable
        # Prompts that start with text get BOS first (llama.cpp's and vLLM's completions do);
        # chat templates write it themselves.
        self.add_bos = add_bos and special.bos_token_id is not None
        # Every token encode() matches whole in text (special and user-defined): stable_prefix_length.
        self._added_texts = tuple(t.content for t in backend.get_added_tokens_decoder().values() if t.content)

    @property
    def vocab_size(self) -> int:
        return len(self._token_bytes)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token text is parsed as the special token (like HF)."""
        return self._backend.encode(text, add_special_tokens=False).ids

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The longest token in bytes: a text of B bytes is at least ceil(B / this) tokens."""
        return max(1, max(len(b) for b in self._token_bytes))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for; empty for special tokens (never shown)."""
        if token_id in self.special.special_ids:
            return b""
        return self._token_bytes[token_id]

    def decode(self, token_ids: list[int]) -> str:
        """Whole-sequence decode (special tokens skipped, invalid UTF-8 -> U+FFFD)."""
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", "replace")

    def stable_prefix_length(self, text: str) -> int:
        """Length of the longest prefix of `text` whose tokens can no longer change when more
        text is appended: it ends before the last pre-token (BPE merges never cross pre-token
        boundaries) and before any suffix that could still grow into a special token."""
        if not self.split_stable:
            return 0
        # encode() cuts the text at added tokens before the regex runs, so the last complete one
        # ends a segment the text after it cannot reach back into ("<|im_end|>'s" is the token,
        # then the contraction "'s"; the regex over the whole text would see "|>'" and "s").
        segment = max((at + len(t) for t in self._added_texts if (at := text.rfind(t)) >= 0), default=0)
        starts = [segment + offsets[0] for _, offsets in self._backend.pre_tokenizer.pre_tokenize_str(text[segment:])]
        i = len(starts) - 1
        # A committed piece must not depend on text still to come. Two regex alternatives look
        # ahead: whitespace (`\s+(?!\S)`: "\n\n\n" alone is one piece, before "x" it is
        # "\n\n" + "\n"), and contractions ("'" then "r" is two pieces, "'re" one), which
        # span at most 3 characters. So back off over trailing whitespace and the last 3 chars.
        while i > 0 and (text[starts[i] - 1].isspace() or starts[i - 1] >= len(text) - 3):
            i -= 1
        cut = starts[i] if starts else segment
        for added in self._added_texts:  # nor before a suffix that may still grow into one
            for k in range(min(len(added) - 1, len(text)), 0, -1):
                if text.endswith(added[:k]):
                    cut = min(cut, len(text) - k)
                    break
        return cut

    # -- builders -------------------------------------------------------------------------

    @classmethod
    def from_gguf_fields(cls, fields: dict) -> Tokenizer:
        """Build from decoded `tokenizer.ggml.*` metadata (see model.read_gguf_metadata)."""
        kind = fields.get("tokenizer.ggml.model")
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        types: list[int] = fields.get("tokenizer.ggml.token_type", [1] * len(tokens))
        if kind == "gpt2":
            merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
            vocab = {t: i for i, t in enumerate(tokens)}
            backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
            backend.pre_tokenizer = _byte_level_pre_tokenizer(fields)
            backend.decoder = decoders.ByteLevel()
            token_bytes = [_byte_level_bytes(t) for t in tokens]
            # transformers respells every piece into the byte alphabet: a user-defined piece
            # outside it is then not in its vocabulary, and it adds no token for it.
            spelled = [all(c in _BYTE_OF_CHAR for c in t) for t in tokens]
        elif kind == "llama":
            backend = sentencepiece_backend(fields)
            token_bytes = [piece_bytes(t) for t in tokens]
            in_vocab = set(vocabulary_pieces(fields))
            spelled = [t in in_vocab for t in tokens]
        else:
            raise TokenizerError(
                f"GGUF tokenizer model {kind!r} is not supported ('gpt2' byte-level BPE or 'llama' SentencePiece)"
            )
        special_ids = frozenset(i for i, t in enumerate(types) if t == _GGUF_CONTROL)
        backend.add_special_tokens(
            [tokenizers.AddedToken(tokens[i], special=True, normalized=False) for i in sorted(special_ids)]
        )
        # llama.cpp matches user-defined tokens (`<think>`, Gemma's "\n\n", "<table>") whole in
        # any text, like control tokens, but they are ordinary text when decoded.
        backend.add_tokens([
            tokenizers.AddedToken(t, special=False, normalized=False)
            for t, type_, ok in zip(tokens, types, spelled, strict=True)
            if type_ == _GGUF_USER_DEFINED and ok
        ])
        bos_id = fields.get("tokenizer.ggml.bos_token_id")
        eos_id = fields.get("tokenizer.ggml.eos_token_id")
        special = SpecialTokens(
            bos_token=tokens[bos_id] if bos_id is not None else "",
            eos_token=tokens[eos_id] if eos_id is not None else "",
            eos_token_ids=(eos_id,) if eos_id is not None else (),
            special_ids=special_ids,
            bos_token_id=bos_id,
        )
        # A SentencePiece file that does not say gets BOS, as in llama.cpp and transformers.
        add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", kind == "llama"))
        # SentencePiece text has no pre-token boundaries to commit at (see stable_prefix_length).
        return cls(backend, token_bytes, special, split_stable=kind == "gpt2", add_bos=add_bos)

    @classmethod
    def from_json(cls, path: Path, config: dict | None = None) -> Tokenizer:
        """Build from a Hugging Face `tokenizer.json`; `config` is its tokenizer_config.json."""
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
            backend = tokenizers.Tokenizer.from_file(str(path))
        except (OSError, ValueError, Exception) as exc:  # tokenizers raises plain Exception
            raise TokenizerError(f"cannot load {path}: {exc}") from exc
        config = config or {}
        byte_level = _mentions(raw.get("decoder"), "ByteLevel")
        byte_fallback = bool((raw.get("model") or {}).get("byte_fallback"))
        special_ids = frozenset(t["id"] for t in raw.get("added_tokens", []) if t.get("special"))
        size = backend.get_vocab_size(with_added_tokens=True)
        token_bytes = []
        for i in range(size):
            piece = backend.id_to_token(i) or ""
            if byte_level:
                token_bytes.append(_byte_level_bytes(piece))
            else:
                token_bytes.append(piece_bytes(piece, byte_fallback))
        bos = _token_text(config.get("bos_token"))
        eos = _token_text(config.get("eos_token"))
        eos_id = backend.token_to_id(eos) if eos else None
        special = SpecialTokens(
            bos_token=bos,
            eos_token=eos,
            eos_token_ids=(eos_id,) if eos_id is not None else (),
            special_ids=special_ids,
            bos_token_id=backend.token_to_id(bos) if bos else None,
        )
        pre = raw.get("pre_tokenizer") or {}
        split_stable = byte_level and _mentions(pre, "ByteLevel") and not pre.get("add_prefix_space", False)
        # transformers (5) adds BOS when the post-processor's template starts with it (Llama 2's and
        # 3's TemplateProcessing), whatever tokenizer_config's add_bos_token says, and never without.
        add_bos = bool(bos) and _template_starts_with(raw.get("post_processor"), bos)
        return cls(backend, token_bytes, special, split_stable=split_stable, add_bos=add_bos)


def _byte_level_bytes(piece: str) -> bytes:
    # Added tokens of byte-level vocabularies may hold characters outside the alphabet; keep
    # them as their UTF-8 text, which is how the ByteLevel decoder renders them too.
    if all(c in _BYTE_OF_CHAR for c in piece):
        return bytes(_BYTE_OF_CHAR[c] for c in piece)
    return piece.encode("utf-8")


def _template_starts_with(processor: object, token: str) -> bool:
    """True if a tokenizer.json post-processor (possibly a Sequence) puts `token` before a single text."""
    if not isinstance(processor, dict):
        return False
    if processor.get("type") == "Sequence":
        return any(_template_starts_with(p, token) for p in processor.get("processors") or [])
    single = processor.get("single") if processor.get("type") == "TemplateProcessing" else None
    first = single[0] if isinstance(single, list) and single else {}
    return isinstance(first, dict) and (first.get("SpecialToken") or {}).get("id") == token


def _mentions(node: object, kind: str) -> bool:
    """True if a tokenizer.json component (possibly a Sequence) contains `kind`."""
    if isinstance(node, dict):
        return node.get("type") == kind or any(_mentions(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_mentions(v, kind) for v in node)
    return False


def _token_text(value: object) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value or "")
