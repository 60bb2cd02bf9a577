"""A JSON array that arrives in pieces (a chunked upload), split into its elements' bytes as soon
as each is complete: POST /v1/session's body is a JSON array of SessionRequest, and each action
must start when it arrives, not when the upload ends.

    elements = ArrayElements(max_element_bytes)
    for chunk in upload: for raw in elements.feed(chunk): ...   # each raw element, in order
    elements.end()                                              # the array must be closed

Only the structure is read (strings, brackets, commas at the top level), by regular expressions
that jump from one structural byte to the next, so a long text or token list costs a few scans;
each element is then parsed on its own. Errors are ValueError in the client's terms; an element
that grows past `max_element_bytes` before it ends is `TooLarge`.
"""

from __future__ import annotations

import re

_IN_STRING = re.compile(rb'["\\]')
_NESTED = re.compile(rb'["\[\]{}]')  # inside an element's object or array: commas do not matter
_SCALAR_END = re.compile(rb"[,\]\s]")
_SPACE = b" \t\r\n"
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN, _CLOSE = frozenset(b"[{"), frozenset(b"]}")


class TooLarge(ValueError):
    """One element exceeds the size cap."""


class ArrayElements:
    def __init__(self, max_element_bytes: int) -> None:
        self.max_element_bytes = max_element_bytes
        self._buf = bytearray()
        self._pos = 0  # next byte of _buf to read
        self._start: int | None = None  # where the element being read starts in _buf
        self._depth = 0  # brackets open inside that element
        self._string = False
        self._escape = False
        self._opened = self._closed = False
        self._need = "element or ]"  # after "[": an element or "]"; after ",": an element; else "," or "]"
        self.count = 0  # elements returned so far

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        out: list[bytes] = []
        buf, i, n = self._buf, self._pos, len(self._buf)
        while i < n:
            if self._string:
                if self._escape:
                    self._escape, i = False, i + 1
                    continue
                m = _IN_STRING.search(buf, i)
                if m is None:
                    i = n
                    break
                i = m.end()
                if buf[m.start()] == _BACKSLASH:
                    self._escape = True
                else:
                    self._string = False
                    if self._depth == 0:  # a bare string element just ended
                        out.append(self._take(i))
                continue
            if self._start is not None:  # inside an object or array element, or a bare scalar
                if self._depth == 0:
                    m = _SCALAR_END.search(buf, i)
                    if m is None:
                        i = n
                        break
                    out.append(self._take(m.start()))
                    i = m.start()
                    continue
                m = _NESTED.search(buf, i)
                if m is None:
                    i = n
                    break
                c, i = buf[m.start()], m.end()
                if c == _QUOTE:
                    self._string = True
                elif c in _OPEN:
                    self._depth += 1
                else:
                    self._depth -= 1
                    if self._depth == 0:
                        out.append(self._take(i))
                continue
            c = buf[i]
            if c in _SPACE:
                i += 1
            elif not self._opened:
                if c != ord("["):
                    raise ValueError("must be a JSON array of messages")
                self._opened, i = True, i + 1
            elif self._closed:
                raise ValueError("holds data after the end of its array")
            elif c == ord("]") and self._need != "element":
                self._closed, i = True, i + 1
            elif c == ord(",") and self._need == ", or ]":
                self._need, i = "element", i + 1
            elif self._need == ", or ]":
                raise ValueError(f"expected , or ] between array elements, found {chr(c)!r}")
            elif c in b",]":
                raise ValueError(f"expected an array element, found {chr(c)!r}")
            else:  # an element starts
                self._start = i
                if c in _OPEN:
                    self._depth = 1
                elif c == _QUOTE:
                    self._string = True
                i += 1
        self._pos = i
        if self._start is not None and n - self._start > self.max_element_bytes:
            raise TooLarge(f"an element is larger than {self.max_element_bytes} bytes")
        self._compact()
        return out

    def end(self) -> None:
        """The upload ended: an opened array must be closed (an empty upload is an empty array)."""
        if self._opened and not self._closed:
            raise ValueError("ends inside its array (an element or the closing ] is missing)")

    def _take(self, end: int) -> bytes:
        raw = bytes(self._buf[self._start:end])
        self._start, self._depth, self._need = None, 0, ", or ]"
        self.count += 1
        return raw

    def _compact(self) -> None:
        """Drop the bytes before the element being read (or all that were read)."""
        keep = self._start if self._start is not None else self._pos
        if keep:
            del self._buf[:keep]
            self._pos -= keep
            if self._start is not None:
                self._start = 0
