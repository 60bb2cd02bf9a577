"""When the generation service ends a stream as a slow consumer (SLOW_CONSUMER, services/generation/
outbox.py): only a reader that stopped reading, not one that is merely behind a fast engine."""

from __future__ import annotations

import time

from mstar.generation.v1 import generation_service_pb2 as gen_pb2

from services.common import errors
from services.generation.outbox import Outbox


def _fill(outbox: Outbox, frames: int) -> list:
    """`frames` one-frame messages queued while the writer takes none; their frames' steps (or
    the error that replaced one)."""
    for i in range(frames):
        tokens = gen_pb2.ResultTokens(step=i)
        outbox.put(gen_pb2.StreamResponse(frames=[gen_pb2.ServerFrame(result_tokens=tokens)]))
    items = []
    while not outbox.empty():
        items.append(outbox.get_nowait())
    return [i.frames[0].result_tokens.step if isinstance(i, gen_pb2.StreamResponse) else i for i in items]


def _slow_consumer_errors(items: list) -> list:
    return [i for i in items if isinstance(i, errors.MstarError) and i.reason == "SLOW_CONSUMER"]


def test_a_deep_queue_whose_reader_is_still_reading_is_kept():
    outbox = Outbox(max_queued_frames=10, stall_s=30.0)  # last_sent: just now
    assert not _slow_consumer_errors(_fill(outbox, 50))


def test_a_deep_queue_whose_reader_took_nothing_for_stall_s_ends_the_stream():
    outbox = Outbox(max_queued_frames=10, stall_s=30.0)
    outbox.last_sent = time.monotonic() - 31
    items = _fill(outbox, 11)
    assert items[:10] == list(range(10))
    assert _slow_consumer_errors(items[10:]) == items[10:]


def test_ten_times_the_limit_ends_the_stream_even_while_it_reads():
    outbox = Outbox(max_queued_frames=10, stall_s=30.0)
    items = _fill(outbox, 101)
    assert items[:100] == list(range(100)) and _slow_consumer_errors(items[100:]) == items[100:]


def test_what_the_writer_took_no_longer_counts():
    outbox = Outbox(max_queued_frames=10, stall_s=30.0)
    outbox.last_sent = time.monotonic() - 31
    assert not _slow_consumer_errors(_fill(outbox, 10))  # taken as they came: nothing waits
    assert outbox.queued_frames == 0 and not _slow_consumer_errors(_fill(outbox, 10))
