"""Merge the event streams of n requests (one per OpenAI choice).

Every inner stream is closed (aclose) when the merged stream ends for any reason — including the
client disconnecting, which reaches us as GeneratorExit/CancelledError at a `yield` — so each
request's generation is aborted and its KV blocks freed, not left to the garbage collector.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any


async def _close(stream: AsyncIterator[Any]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


async def merged(streams: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Yield (choice index, event) from every stream, interleaved."""
    if len(streams) == 1:
        stream = streams[0]
        try:
            async for event in stream:
                yield 0, event
        finally:
            await _close(stream)
        return

    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()
    finished = object()

    async def pump(index: int, stream: AsyncIterator[Any]) -> None:
        try:
            async for event in stream:
                await queue.put((index, event, None))
            await queue.put((index, finished, None))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            await queue.put((index, None, exc))
        finally:
            await _close(stream)

    tasks = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, event, exc = await queue.get()
            if exc is not None:
                raise exc
            if event is finished:
                remaining -= 1
                continue
            yield index, event
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
