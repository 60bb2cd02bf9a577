"""Building one request's prompt token ids, possibly from input that keeps streaming in.

Incremental tokenization (the ClientAppend contract): BPE merges never cross pre-token
boundaries, so text is committed (tokenized and sent to the generation service, which prefills
it at once) up to the last boundary that more text cannot move; the tail (the last pre-token,
trailing whitespace, a possible contraction or partial special token: see
Tokenizer.stable_prefix_length) is held until the next chunk or the end of input. The tokens sent
are therefore exactly those of tokenizing the whole text in one go. Tokenizers without that
property (e.g. Metaspace with a prepended "▁") hold ALL text until the input ends: still
correct, only without early prefill.

Chat requests whose text input stays open stream into the LAST message's content: the template
is rendered once around a sentinel (ChatTemplate.render_open), the head is committed now and the
tail (end of message, assistant header) is added when the input ends.

Work per request is linear in its input, however it is cut (issue 13, finding 11: 10k one-char
parts or appends used to cost quadratic time on the event loop): held text is a list of pieces
with running character and byte counts, and a commit attempt that finds no stable boundary is not
repeated until the held text has doubled, so the pre-tokenizer scans O(total) characters in all.
"""

from __future__ import annotations

from services.common.errors import invalid_argument
from services.common.prompt_fit import check_prompt_fits
from services.common.server import INTERNAL_MAX_MESSAGE_BYTES
from services.preprocess.chat_template import ChatTemplateError
from services.preprocess.images import IMAGE_TOKEN, ImageError, ImageLimits, decode_image
from services.preprocess.input_names import InputNames, input_names
from services.preprocess.limits import check_token_ids
from services.preprocess.media import FileReader
from services.preprocess.model import ModelSpec
from services.preprocess.request import IMAGE, TEXT, TOKENS, InputInfo, Part, RequestSpec

_STREAMABLE = frozenset({TEXT, TOKENS})
# Images (a vision-language model's): at most this many per request, decoded within IMAGE_LIMITS
# (an inline part is at most 8 MiB by the contract; a file_path part is read up to --max-file-bytes).
MAX_IMAGES = 8
IMAGE_LIMITS = ImageLimits()


def max_tiles(side: int) -> int:
    """The most uint8 tiles of side² pixels one request's start frame carries to the generation
    service, a MiB of headroom left for its tokens under the stream's message limit."""
    return (INTERNAL_MAX_MESSAGE_BYTES - (1 << 20)) // (3 * side * side)
# Appended chunks exist on the native API only.
_APPEND = InputNames("append.text", "append.text", "append.chunks", "append.ends")


def min_prompt_tokens(parts: tuple[Part, ...], max_token_bytes: int, *texts: str) -> int:
    """A lower bound on the tokens `texts` and `parts` become, in O(number of parts): a token spans
    at most max_token_bytes bytes and a str has at most as many characters as UTF-8 bytes. Lets a
    prompt (or appended chunk) that cannot fit be refused before the template, the tokenizer or
    per-token validation run."""
    chars = sum(len(t) for t in texts)
    ids = 0
    for part in parts:
        if part.token_ids is not None:
            ids += len(part.token_ids)
        elif part.modality == IMAGE:
            continue  # compressed pixels say nothing of its tokens (tiles x 64 once decoded)
        else:
            chars += len(part.text or "") + len(part.data or b"")
    return ids + chars // max_token_bytes


class PromptBuilder:
    """Per-request prompt state. Every method returns the token ids newly committed."""

    def __init__(self, model: ModelSpec, files: FileReader) -> None:
        self._model = model
        self._tokenizer = model.tokenizer
        self._files = files
        self._pending: list[str] = []  # held text, in pieces (joined only when scanned)
        self._pending_chars = 0
        self._pending_bytes = 0
        self._next_scan_chars = 0  # no commit attempt below this much held text (see docstring)
        self._tail = ""
        self._open: set[str] = set()
        # BOS goes before the first text of a prompt that is not a chat (templates render
        # {{ bos_token }} themselves) and does not start with token ids (the client chose them),
        # as llama.cpp's server tokenizes a completion prompt.
        self._bos_pending = False
        self.num_tokens = 0
        self.input_infos: list[InputInfo] = []
        self.image_tiles: list[bytes] = []  # uint8 [3, S, S] each, in prompt order (a VLM's images)
        self._num_images = 0

    @property
    def input_done(self) -> bool:
        return not self._open

    def start(self, spec: RequestSpec) -> list[int]:
        names = input_names(spec.surface)
        if spec.text and spec.messages:
            raise invalid_argument(names.text, "text and messages are exclusive")
        for modality in spec.open_inputs:
            self._check_modality(modality, names.modalities)
            if modality not in _STREAMABLE:
                raise invalid_argument(names.modalities, f"modality {modality} cannot be streamed")
        self._open = set(spec.open_inputs)
        self._bos_pending = self._tokenizer.add_bos and not spec.messages
        committed: list[int] = []
        if spec.messages:
            template = self._model.chat_template
            if template is None:
                raise invalid_argument(names.messages, "this model has no chat template; send text")
            images = [image for m in spec.messages for image in m.images]
            if images:
                self._check_modality(IMAGE, images[0].where)
                if TEXT in self._open:
                    raise invalid_argument(names.modalities, "a conversation with images cannot stream its text")
            try:
                parts = self._model.images is not None  # a VLM's template reads content as parts
                if TEXT in self._open:
                    head, self._tail = template.render_open(list(spec.messages), spec.tools, content_parts=parts)
                    rendered = head
                else:
                    rendered = template.render(list(spec.messages), tools=spec.tools, content_parts=parts)
            except ChatTemplateError as exc:
                # A bad role or an unrenderable conversation is the client's mistake: 400, not
                # the 500 it escaped as before (found by tests/reliability/test_fuzz.py).
                raise invalid_argument(names.messages, str(exc), reason="INVALID_MESSAGES") from exc
            if images:
                rendered = self._expand_images(rendered, images, names.messages)
            committed += self._add_text(rendered, names.messages)
        elif spec.text:
            committed += self._add_text(spec.text, names.text)
        elif not spec.parts and not self._open:
            raise invalid_argument(names.text, "a prompt is required (text, messages or prompt_parts)")
        committed += self._add_parts(spec.parts, names)
        return committed + self._maybe_finish(frozenset())

    def append(self, parts: tuple[Part, ...], ends: frozenset[str]) -> list[int]:
        for part in parts:
            if part.modality not in self._open:
                self._check_modality(part.modality, "append.chunks")
                raise invalid_argument("append.chunks", f"the {part.modality} input stream is not open")
        return self._add_parts(parts, _APPEND) + self._maybe_finish(ends)

    def _maybe_finish(self, ends: frozenset[str]) -> list[int]:
        self._open -= ends
        if self._open:
            return self._commit(final=False)
        self._hold(self._tail)
        self._tail = ""
        return self._commit(final=True)

    def _hold(self, text: str) -> None:
        if text:
            self._pending.append(text)
            self._pending_chars += len(text)
            self._pending_bytes += len(text.encode("utf-8"))

    def _held_text(self) -> str:
        if len(self._pending) > 1:
            self._pending = ["".join(self._pending)]
        return self._pending[0] if self._pending else ""

    def _add_parts(self, parts: tuple[Part, ...], names: InputNames) -> list[int]:
        committed: list[int] = []
        for i, part in enumerate(parts):
            where = names.part(i)
            self._check_modality(part.modality, names.part_field(i, "modality"))
            if part.modality == TOKENS:
                ids = part.token_ids or ()
                check_token_ids(ids, self._tokenizer.vocab_size, names.part_field(i, "token_ids"))
                self._bos_pending = False
                # Pre-tokenized input is a hard boundary: everything before it is final.
                committed += self._commit(final=True) + list(ids)
                self.num_tokens += len(ids)
                self.input_infos.append(InputInfo(TOKENS, 4 * len(ids), len(ids), part.mime_type))
                continue
            if part.modality == IMAGE:
                committed += self._add_image(part, where)
                continue
            committed += self._add_text(self._part_text(part, where), where, part.mime_type)
        return committed

    def _add_image(self, part: Part, where: str) -> list[int]:
        """An image part: its tiles for the generation service, and the text that stands for them
        tokenized in place, as transformers' processor expands the prompt."""
        if part.text is not None or part.token_ids is not None:
            raise invalid_argument(where, "an image part carries data or a file_path")
        raw = self._files.read(part.file_path) if part.file_path is not None else part.data or b""
        text = self._image_text(raw, where, part.mime_type)
        committed = self._take_bos()
        self._hold(text)
        self._reject_hopeless_length(where)
        return committed + self._commit(final=False)

    def _expand_images(self, rendered: str, images: list, where: str) -> str:
        """A rendered conversation with each "<image>" its template wrote replaced by that image's
        text, in order (Idefics3Processor's replace_image_token after apply_chat_template)."""
        pieces = rendered.split(IMAGE_TOKEN)
        if len(pieces) != len(images) + 1:
            raise invalid_argument(where, f"the rendered conversation holds {len(pieces) - 1} {IMAGE_TOKEN} for "
                                   f"{len(images)} image(s): only an image part may spell {IMAGE_TOKEN}",
                                   reason="INVALID_MESSAGES")
        out = [pieces[0]]
        for image, piece in zip(images, pieces[1:], strict=True):
            out += [self._image_text(image.data, image.where), piece]
        return "".join(out)

    def _image_text(self, raw: bytes, where: str, mime_type: str = "") -> str:
        """Decode and tile one image (its tiles join the request's); the text that stands for it
        (Idefics3Processor's <fake_token_around_image> <row_i_col_j> <image> x 64 ... per tile)."""
        images = self._model.images
        if self._num_images >= MAX_IMAGES:
            raise invalid_argument(where, f"a request takes at most {MAX_IMAGES} images", reason="TOO_MANY_IMAGES")
        try:
            processed = images.process([decode_image(raw, IMAGE_LIMITS)])
        except ImageError as exc:
            raise invalid_argument(where, str(exc), reason="INVALID_IMAGE") from None
        tiles, (rows, cols) = processed.tiles[0], processed.grids[0]
        most = max_tiles(tiles.shape[-1])
        if len(self.image_tiles) + len(tiles) > most:
            raise invalid_argument(where, f"the request's images make more than {most} tiles of "
                                   f"{tiles.shape[-1]} pixels (this one: {len(tiles)})", reason="TOO_MANY_IMAGES")
        self._num_images += 1
        self.image_tiles.extend(tile.tobytes() for tile in tiles)
        image_tokens = len(tiles) * images.config.image_seq_len
        self.input_infos.append(InputInfo(IMAGE, len(raw), image_tokens, mime_type))
        return images.prompt_for_image(rows, cols)

    def _part_text(self, part: Part, where: str) -> str:
        if part.text is not None:
            return part.text
        raw = self._files.read(part.file_path) if part.file_path is not None else part.data or b""
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid_argument(where, "text input must be valid UTF-8") from None

    def _add_text(self, text: str, where: str, mime_type: str = "") -> list[int]:
        before = self.num_tokens
        committed = self._take_bos()
        self._hold(text)
        self._reject_hopeless_length(where)
        committed += self._commit(final=False)
        # Tokens are attributed to the part that completed them (held text moves on).
        self.input_infos.append(
            InputInfo(TEXT, len(text.encode("utf-8")), self.num_tokens - before, mime_type)
        )
        return committed

    def _take_bos(self) -> list[int]:
        if not self._bos_pending:
            return []
        self._bos_pending = False
        self.num_tokens += 1  # counted before the fit checks, which must see it
        return [self._tokenizer.special.bos_token_id]

    def _reject_hopeless_length(self, where: str) -> None:
        # Tokenizing runs on the event loop (~0.8 s per MB here): a text that cannot fit whatever
        # it tokenizes to (every token is at most max_token_bytes long) is refused without it.
        min_tokens = -(-self._pending_bytes // self._tokenizer.max_token_bytes)
        check_prompt_fits(self.num_tokens + min_tokens, self._model.context_length, where, at_least=True)

    def _commit(self, final: bool) -> list[int]:
        if not final and self._pending_chars < self._next_scan_chars:
            return []  # a scan found nothing to commit at half this length: wait for more text
        text = self._held_text()
        cut = len(text) if final else self._tokenizer.stable_prefix_length(text)
        if cut == 0:
            self._next_scan_chars = 2 * len(text)
            return []
        ids = self._tokenizer.encode(text[:cut])
        rest = text[cut:]
        self._pending, self._pending_chars, self._next_scan_chars = ([rest] if rest else []), len(rest), 0
        self._pending_bytes = len(rest.encode("utf-8"))
        self.num_tokens += len(ids)
        return ids

    def _check_modality(self, modality: str, where: str) -> None:
        if modality != TOKENS and modality not in self._model.input_modalities:
            raise invalid_argument(
                where,
                f"modality {modality} is not accepted by model {self._model.name} "
                f"(accepts: {', '.join(sorted(self._model.input_modalities | {TOKENS}))})",
                reason="UNSUPPORTED_MODALITY",
            )
