"""A request's images on the engine side (no torch, no grpc): where their embeddings go in the
prompt, and what makes their K/V differ from another image's in the prefix cache.

An Idefics3 prompt holds, per tile of each image, ``tokens_per_tile`` copies of the image token
(framed by ``<fake_token_around_image>`` and ``<row_i_col_j>`` / ``<global-img>`` text tokens:
services/preprocess/images.py). The model runner encodes the images' tiles (models/vision.py)
and the decoder reads those embeddings in place of the image tokens' own, in order, as
transformers' ``inputs_merger`` does: image k's features fill the k-th run of its tokens.

Every image token has the same id, so two prompts with different images would otherwise hash to
the same KV blocks: a block holding any of an image's tokens is keyed by that image's content hash
too (``salt``); the blocks after it inherit it through the parent hash chain. So two requests with
the same image and prefix share KV, and two with different images never do.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ImageInput:
    """One image of a request (or one tile of it: the encoder treats tiles alike), as the image
    processor cut it: uint8 [num_tiles, 3, S, S] bytes, C order (services/preprocess/images.py);
    the model runner normalizes them with the checkpoint's processor values."""

    tiles: bytes
    num_tiles: int
    content_hash: bytes = b""  # of tiles (sha256, at admission): the encoder cache's key, the prefix-cache salt


@dataclass
class SequenceImages:
    images: list[ImageInput]
    positions: list[int]  # prompt positions of the image tokens, ascending
    spans: list[tuple[int, int]]  # per image: its first and one-past-last index into positions
    # Per image its embeddings [tokens, H] once encoded (kept for a preempted recompute); None before.
    features: list[Any] = field(default_factory=list)
    _salts: dict[int, tuple[bytes, ...]] = field(default_factory=dict)

    def __post_init__(self):
        if not self.features:
            self.features = [None] * len(self.images)

    def needed(self, start: int, end: int) -> list[int]:
        """The images with a token in prompt positions [start, end)."""
        return [k for k, (lo, hi) in enumerate(self.spans)
                if self.positions[lo] < end and self.positions[hi - 1] >= start]

    def chunk_limit(self, start: int, n: int, most_new: int) -> int:
        """How many of the n tokens from `start` a step may compute so that it needs at most
        most_new images not yet encoded: the encoder's work in a step stays bounded like a prefill
        chunk's (scheduler.py). At least the first such image always fits."""
        new = 0
        for k in self.needed(start, start + n):
            if self.features[k] is not None:
                continue
            if new == most_new:
                return self.positions[self.spans[k][0]] - start
            new += 1
        return n

    def salt(self, start: int, end: int) -> tuple[bytes, ...]:
        """The content hashes of the images with a token in prompt positions [start, end)."""
        key = start
        if key not in self._salts:
            self._salts[key] = tuple(image.content_hash for image, (lo, hi) in zip(self.images, self.spans, strict=True)
                                     if self.positions[lo] < end and self.positions[hi - 1] >= start)
        return self._salts[key]


MAX_NEW_IMAGES_PER_STEP = 1  # images (wire: tiles) a sequence may newly encode in a step shared with others


def locate_images(token_ids: list[int], images: list[ImageInput], image_token_id: int,
                  tokens_per_tile: int) -> SequenceImages | str:
    """The images' places in the prompt, or why they do not fit it (a message naming the counts)."""
    positions = [i for i, t in enumerate(token_ids) if t == image_token_id]
    want = sum(image.num_tiles for image in images) * tokens_per_tile
    if len(positions) != want:
        return (f"the prompt has {len(positions)} image tokens but its {len(images)} image(s) of "
                f"{sum(image.num_tiles for image in images)} tile(s) need {want}")
    spans, start = [], 0
    for image in images:
        if not image.content_hash:  # hashed here, on the engine thread, not on the servicer's event loop
            image.content_hash = hashlib.sha256(image.tiles).digest()
        spans.append((start, start + image.num_tiles * tokens_per_tile))
        start = spans[-1][1]
    return SequenceImages(images, positions, spans)
