"""Run n requests (one per OpenAI choice) and merge their event streams.

Every inner stream is closed (aclose) when the merged stream ends for any reason — including the
client disconnecting, which reaches us as GeneratorExit/CancelledError at a `yield` — so each
request's generation is aborted and its KV blocks freed, not left to the garbage collector.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

Run = Callable[[Any, Any], AsyncIterator[Any]]


async def _close(stream: AsyncIterator[Any]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


async def merged(run: Run, inputs: list[Any], context: Any) -> AsyncIterator[tuple[int, Any]]:
    """Yield (choice index, event) from run(input, context) for every input, interleaved."""
    if len(inputs) == 1:
        stream = run(inputs[0], context)
        try:
            async for event in stream:
                yield 0, event
        finally:
            await _close(stream)
        return

    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()
    finished = object()

    async def pump(index: int, item: Any) -> None:
        stream = run(item, context)
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

    tasks = [asyncio.create_task(pump(i, item)) for i, item in enumerate(inputs)]
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
