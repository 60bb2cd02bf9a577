"""A GGUF file's metadata and tensor directory, read with struct over one memory map.

gguf.GGUFReader parses every metadata array element through a numpy memmap view; for the default
model's tokenizer arrays (49,152 tokens, 48,900 merges) that took 3.6 s of a loaded 2-core box's
start-up, for fields the generation service never reads. This reader walks the same layout
(https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) in ~0.1 s: scalars and strings are
decoded, arrays of strings are skipped (their element count is kept) except those the caller names
(``strings``: by default the token spellings structured output needs, tokenizer.ggml.tokens: ~50 ms
for 49,152; preprocess adds the merges), tensor data are zero-copy uint8 views of the memory map.
Both services read GGUFs with it (preprocess its tokenizer: Gemma 3's 262,144 tokens took
gguf.GGUFReader 11-14 s).

    header:  b"GGUF", version u32 (2 or 3), tensor count u64, metadata count u64
    metadata: key (u64 length + UTF-8), value type u32, value   (arrays: element type u32, count u64, elements)
    tensors:  name, n_dims u32, dims u64[n_dims] (fastest first), ggml type u32, data offset u64
    data:     from the first multiple of general.alignment (default 32) after the directory
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
TOKENS = frozenset({"tokenizer.ggml.tokens"})  # what generation's weights/vocabulary.py reads
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
          10: np.uint64, 11: np.int64, 12: np.float64}


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF file this reader understands."""


@dataclass
class GGUFTensor:
    name: str
    dims: tuple[int, ...]  # fastest-varying first, as the file lists them (torch shape = reversed)
    kind: str  # ggml type name, e.g. "Q4_1", "F32"
    data: np.ndarray  # uint8 view of the tensor's bytes


@dataclass
class SkippedArray:
    """A metadata array of strings this reader did not decode."""

    count: int


class GGUFFile:
    def __init__(self, path: str, strings: frozenset[str] = TOKENS):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = path
        self._buf = np.memmap(path, dtype=np.uint8, mode="r")
        self._mv = memoryview(self._buf)
        self._pos = 0
        if bytes(self._mv[:4]) != b"GGUF":
            raise GGUFFormatError("missing the GGUF magic number")
        self._pos = 4
        version = self._scalar(4)
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_fields = self._scalar(10), self._scalar(10)
        self.fields: dict[str, object] = {}
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(self._scalar(4), decode_strings=key in strings)
        directory = []
        for _ in range(n_tensors):
            name = self._string()
            dims = tuple(self._scalar(10) for _ in range(self._scalar(4)))
            directory.append((name, dims, self._scalar(4), self._scalar(10)))
        alignment = int(self.fields.get("general.alignment", 32))  # type: ignore[arg-type]
        start = -(-self._pos // alignment) * alignment
        self.tensors: list[GGUFTensor] = []
        for name, dims, type_id, offset in directory:
            kind = GGMLQuantizationType(type_id)
            block, size = GGML_QUANT_SIZES[kind]
            n = int(np.prod(dims))
            nbytes = n // block * size
            begin = start + offset
            if n % block or begin + nbytes > len(self._buf):
                raise GGUFFormatError(f"tensor {name} ({kind.name}, dims {list(dims)}) runs past the end of the file")
            self.tensors.append(GGUFTensor(name, dims, kind.name, self._buf[begin : begin + nbytes]))

    def _scalar(self, type_id: int):
        fmt = _SCALARS.get(type_id)
        if fmt is None:
            raise GGUFFormatError(f"unknown metadata value type {type_id}")
        try:
            (value,) = struct.unpack_from(fmt, self._mv, self._pos)
        except struct.error as e:
            raise GGUFFormatError("the file ends inside its metadata") from e
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._scalar(10)
        if self._pos + n > len(self._buf):
            raise GGUFFormatError("the file ends inside a metadata string")
        text = bytes(self._mv[self._pos : self._pos + n]).decode("utf-8", errors="replace")
        self._pos += n
        return text

    def _value(self, type_id: int, decode_strings: bool = False):
        if type_id == _STRING:
            return self._string()
        if type_id != _ARRAY:
            return self._scalar(type_id)
        elem, count = self._scalar(4), self._scalar(10)
        if elem == _STRING and decode_strings:
            return [self._string() for _ in range(count)]
        if elem == _STRING:
            for _ in range(count):  # skip: only lengths are read
                self._pos += 8 + struct.unpack_from("<Q", self._mv, self._pos)[0]
            return SkippedArray(count)
        if elem not in _NUMPY:
            raise GGUFFormatError(f"unsupported metadata array element type {elem}")
        dtype = np.dtype(_NUMPY[elem])
        values = np.frombuffer(self._mv, dtype=dtype, count=count, offset=self._pos).copy()
        self._pos += count * dtype.itemsize
        return values
