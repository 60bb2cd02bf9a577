"""One stream's outgoing messages, from the event loop to the stream's grpc writer.

A queue of StreamResponses (or an MstarError that ends the stream, or None: the end), with two
rules the servicer relies on:

* A backlog leaves as one message. The newest queued StreamResponse stays *open* while the
  writer has not taken it: the next steps' frames ``join`` it, in step order, so a writer slower
  than the engine sends one message (one write, one read, one wake-up) instead of one per step.
  Only what the queue still holds grows; nothing waits to be merged. A message, an error or the
  end queued behind it closes it, so no later step's frames reach the client ahead of them.
* A reader that stopped reading cannot grow the server's memory. When ``max_queued_frames`` are
  waiting and grpc took none of them for ``stall_s``, or in any case at ten times that many, the
  next message is replaced by RESOURCE_EXHAUSTED (SLOW_CONSUMER), which ends the stream. Depth
  alone is not a stall: an engine that steps faster than a busy preprocess reads (the null engine
  at 64 streams: ~10k frames in a second) must not lose every request of a reader still reading.
"""

from __future__ import annotations

import asyncio
import time

from mstar.generation.v1 import generation_service_pb2 as gen_pb2

from services.common import errors

# An open message takes at most this many frames / about this many bytes, far below the
# contract's 16,384 frames and the 16 MB message limit (like preprocess's StreamRequest
# batches, backend._frames).
MAX_JOINED_FRAMES = 1024
MAX_JOINED_BYTES = 1 << 20


class Outbox:
    def __init__(self, max_queued_frames: int = 10_000, stall_s: float = 30.0):
        self.max_queued_frames = max_queued_frames
        self.stall_s = stall_s
        self._queue: asyncio.Queue = asyncio.Queue()  # StreamResponse | MstarError | None
        self.last_sent = time.monotonic()  # when grpc last took a message from the writer
        self.open: gen_pb2.StreamResponse | None = None  # the queued message later frames join
        self.open_bytes = 0  # an estimate of open's size
        self.queued_frames = 0  # frames queued that the writer has not taken

    def join(self, size: int, frames: int) -> gen_pb2.StreamResponse:
        """The queued message the caller adds `frames` frames (about `size` bytes) to: the open
        one while it has room, else a new one, queued now (the writer may take it at once)."""
        response = self.open
        if (response is None or len(response.frames) >= MAX_JOINED_FRAMES
                or self.open_bytes + size > MAX_JOINED_BYTES):
            response = gen_pb2.StreamResponse()
            self.put(response)
            self.open = response  # after put, which closes any open one
            self.open_bytes = 0
        self.open_bytes += size
        self.queued_frames += frames
        return response

    def put(self, item) -> None:
        """Queue a message behind everything queued (or SLOW_CONSUMER in its place, see above)."""
        self.open = None
        if self.is_stalled():
            item = errors.resource_exhausted("the client stopped reading its stream", "SLOW_CONSUMER", None)
        self._queue.put_nowait(item)
        if isinstance(item, gen_pb2.StreamResponse):
            self.queued_frames += len(item.frames)

    def put_last(self, item: errors.MstarError | None) -> None:
        """Queue an error or the end of the stream (None), whatever the queue's depth."""
        self.open = None
        self._queue.put_nowait(item)

    async def get(self):
        """The next item for the writer; from now on it is neither open nor counted as waiting."""
        return self._taken(await self._queue.get())

    def get_nowait(self):
        return self._taken(self._queue.get_nowait())

    def _taken(self, item):
        if item is self.open:
            self.open = None
        if isinstance(item, gen_pb2.StreamResponse):
            self.queued_frames -= len(item.frames)
        return item

    def sent(self) -> None:
        """grpc took the last message from the writer (the reader is reading)."""
        self.last_sent = time.monotonic()

    def empty(self) -> bool:
        return self._queue.empty()

    def is_stalled(self) -> bool:
        queued = self.queued_frames
        if queued >= 10 * self.max_queued_frames:
            return True
        return queued >= self.max_queued_frames and time.monotonic() - self.last_sent > self.stall_s
