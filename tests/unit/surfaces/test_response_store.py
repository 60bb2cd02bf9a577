"""The SQLite response store: round trip, size and age bounds, restart (in_progress rows become
failed), and that database work happens off the event loop's thread."""

from __future__ import annotations

import asyncio
import threading

from services.preprocess.surfaces.responses.store import ResponseStore, StoredResponse


def record(i: int, status: str = "completed", created_at: float | None = None, text: str = "x") -> StoredResponse:
    import time

    return StoredResponse(f"resp_{i}", time.time() if created_at is None else created_at, status,
                          {"id": f"resp_{i}", "status": status, "output": text}, [("user", "hi"), ("assistant", text)])


async def _with_store(path, fn, **kw):
    store = await ResponseStore(path, **kw).open()
    try:
        return await fn(store)
    finally:
        await store.close()


def test_round_trip_delete_and_restart(tmp_path):
    path = tmp_path / "db.sqlite3"

    async def first(store):
        await store.put(record(1))
        await store.put(record(2, status="in_progress"))
        got = await store.get("resp_1", "")
        assert got.response == {"id": "resp_1", "status": "completed", "output": "x"}
        assert got.conversation == [("user", "hi"), ("assistant", "x")]
        assert await store.delete("resp_1", "") and not await store.delete("resp_1", "")
        assert await store.get("resp_1", "") is None

    async def after_restart(store):
        assert await store.recover("replica-a") == 1
        interrupted = await store.get("resp_2", "")
        assert interrupted.status == "failed" and interrupted.response["status"] == "failed"
        assert interrupted.response["error"]["code"] == "server_error"

    asyncio.run(_with_store(path, first, runner="replica-a"))
    asyncio.run(_with_store(path, after_restart))


def test_a_replica_restarting_fails_only_the_responses_it_ran(tmp_path):
    """Replicas share the file: one restarting must not fail what another is still running."""
    path = tmp_path / "db.sqlite3"

    async def two_replicas():
        a = await ResponseStore(path, runner="10.0.0.1:50051").open()
        b = await ResponseStore(path, runner="10.0.0.2:50051").open()
        await a.put(record(1, status="in_progress"))
        await b.put(record(2, status="in_progress"))
        await a.close()
        restarted = await ResponseStore(path).open()
        assert await restarted.recover("10.0.0.1:50051") == 1
        assert (await b.get("resp_1", "")).status == "failed"
        assert (await b.get("resp_2", "")).status == "in_progress"  # still running on b
        await b.put(record(2, status="completed"))
        assert (await restarted.get("resp_2", "")).status == "completed"
        await restarted.close()
        await b.close()

    asyncio.run(two_replicas())


def test_oldest_rows_go_first_past_max_bytes(tmp_path):
    async def go(store):
        for i in range(20):
            await store.put(record(i, created_at=1000.0 + i, text="y" * 100))
        assert store.stored_bytes <= 2000
        assert await store.get("resp_0", "") is None and await store.get("resp_19", "") is not None
        replaced = store.stored_bytes
        await store.put(record(19, created_at=1019.0, text="y" * 100))  # same id again: no double count
        assert store.stored_bytes == replaced

    asyncio.run(_with_store(tmp_path / "db.sqlite3", go, max_bytes=2000, ttl_s=1e12))


def test_expired_rows_are_invisible_and_evicted(tmp_path):
    async def go(store):
        await store.put(record(1, created_at=1.0))
        assert await store.get("resp_1", "") is None and store.stored_bytes == 0

    asyncio.run(_with_store(tmp_path / "db.sqlite3", go, ttl_s=60.0))


def test_database_calls_run_off_the_loop_thread(tmp_path, monkeypatch):
    threads = set()
    original = ResponseStore._get

    def spy(self, *args):
        threads.add(threading.get_ident())
        return original(self, *args)

    monkeypatch.setattr(ResponseStore, "_get", spy)

    async def go(store):
        await store.get("resp_1", "")
        return threading.get_ident()

    loop_thread = asyncio.run(_with_store(tmp_path / "db.sqlite3", go))
    assert threads and loop_thread not in threads
