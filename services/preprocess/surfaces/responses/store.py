"""Stored responses (`store: true`): an embedded SQLite database, bounded by age and size.

One row per response: the response object as the API returns it (for GET /v1/responses/{id})
and the conversation it ends (the messages that led to it plus its own output), which is what
`previous_response_id` continues. The file survives restarts of the preprocess service, and every
preprocess replica may share it: a row records which replica runs it (`runner`, the replica's
advertised address), and when a replica starts, the rows it left `in_progress` are marked
`failed` (their streams died with it); other replicas' running responses are not touched.

Every row belongs to the principal that stored it (`owner`: services/preprocess/client.py
`principal`, "" for the anonymous one). Reads and deletes name the owner, and a row of another
owner is exactly as absent as one that never existed: nobody can tell the two apart. Databases
written before rows had owners gain the column on open, their rows owned by the anonymous
principal: with API keys off they stay readable as before; with keys on no key reads them (whose
they were is unknown), and they age out with the TTL.

Bounds: a row older than `ttl_s` is gone; when the stored bytes exceed `max_bytes` the oldest rows
go first. Every database call runs on one dedicated thread (sqlite3 connections are
single-threaded), so the event loop never waits on disk.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    status TEXT NOT NULL,
    size INTEGER NOT NULL,
    response TEXT NOT NULL,      -- the response object (JSON)
    conversation TEXT NOT NULL,  -- [[role, content(, [[offset, base64 image], ...])], ...] up to and including this response's output
    owner TEXT NOT NULL DEFAULT '',  -- the principal that stored it ('' = anonymous)
    runner TEXT NOT NULL DEFAULT ''  -- the preprocess replica running it ('' = before runners were kept)
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at);
"""


@dataclass(frozen=True)
class StoredResponse:
    id: str
    created_at: float
    status: str
    response: dict
    conversation: list[tuple]  # (role, text) or (role, text, images): surfaces/responses/endpoints.py
    owner: str = ""  # the principal that stored it ("" = anonymous)


class ResponseStore:
    def __init__(self, path: Path, ttl_s: float = 30 * 24 * 3600.0, max_bytes: int = 256 * 1024 * 1024,
                 runner: str = "") -> None:
        self.path = path
        self.runner = runner  # this replica's name (its advertised address): recorded with each row
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="responses-db")
        self._db: sqlite3.Connection | None = None
        self._bytes = 0

    async def open(self) -> ResponseStore:
        await self._call(self._open)
        return self

    async def close(self) -> None:
        await self._call(self._close)
        self._thread.shutdown(wait=True)

    async def recover(self, runner: str) -> int:
        """This replica, starting as `runner`: its rows still in_progress (and those from before
        runners were kept) become failed. Returns how many."""
        self.runner = runner
        return await self._call(self._interrupted)

    async def put(self, record: StoredResponse) -> None:
        await self._call(self._put, record)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The row, if it exists, has not expired and belongs to `owner`; else None."""
        return await self._call(self._get, response_id, owner)

    async def delete(self, response_id: str, owner: str) -> bool:
        """Delete `owner`'s row; False when there is none (never stored, expired, or another's)."""
        return await self._call(self._delete, response_id, owner)

    @property
    def stored_bytes(self) -> int:
        return self._bytes

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._opened, fn, *args)

    def _opened(self, fn, *args):
        """Opens the database on first use (so a store built outside a running loop works)."""
        if self._db is None and fn not in (self._open, self._close):
            self._open()
        return fn(*args)

    # ---- on the database thread

    def _open(self) -> None:
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        db = self._db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        self._add_columns()
        self._bytes = db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]
        self._evict()

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _add_columns(self) -> None:
        """A database from before owners or runners: add the columns (its rows become the
        anonymous principal's, run by no known replica). In a transaction, since every preprocess
        replica opens the same file."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            columns = {row[1] for row in db.execute("PRAGMA table_info(responses)")}
            for name in ("owner", "runner"):
                if name not in columns:
                    db.execute(f"ALTER TABLE responses ADD COLUMN {name} TEXT NOT NULL DEFAULT ''")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _interrupted(self) -> int:
        rows = self._db.execute("SELECT id, response FROM responses WHERE status = 'in_progress' "
                                "AND runner IN (?, '')", (self.runner,)).fetchall()
        for response_id, text in rows:
            obj = json.loads(text)
            obj["status"] = "failed"
            obj["error"] = {"code": "server_error", "message": "the server restarted while this response ran"}
            self._db.execute("UPDATE responses SET status = 'failed', response = ? WHERE id = ? AND status = 'in_progress'",
                             (json.dumps(obj), response_id))
        return len(rows)

    def _put(self, r: StoredResponse) -> None:
        response = json.dumps(r.response, ensure_ascii=False)
        conversation = json.dumps(r.conversation, ensure_ascii=False)
        size = len(response.encode()) + len(conversation.encode())
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            old = db.execute("SELECT size, owner FROM responses WHERE id = ?", (r.id,)).fetchone()
            if old is not None and old[1] != r.owner:  # ids are server-made: a clash is a bug, never a takeover
                raise ValueError(f"response {r.id} belongs to another principal")
            db.execute(
                "INSERT OR REPLACE INTO responses (id, created_at, status, size, response, conversation, owner, "
                "runner) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (r.id, r.created_at, r.status, size, response, conversation, r.owner, self.runner),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._bytes += size - (old[0] if old else 0)
        self._evict()

    def _get(self, response_id: str, owner: str) -> StoredResponse | None:
        row = self._db.execute(
            "SELECT id, created_at, status, response, conversation, owner FROM responses "
            "WHERE id = ? AND owner = ? AND created_at >= ?",
            (response_id, owner, time.time() - self.ttl_s),
        ).fetchone()
        if row is None:
            return None
        conversation = [tuple(turn) for turn in json.loads(row[4])]  # (role, text[, images]): endpoints._message
        return StoredResponse(row[0], row[1], row[2], json.loads(row[3]), conversation, row[5])

    def _delete(self, response_id: str, owner: str) -> bool:
        row = self._db.execute("DELETE FROM responses WHERE id = ? AND owner = ? RETURNING size",
                               (response_id, owner)).fetchone()
        if row is None:
            return False
        self._bytes -= row[0]
        return True

    def _evict(self) -> None:
        """Expired rows, then the oldest rows until the stored bytes fit `max_bytes`."""
        db = self._db
        for (size,) in db.execute("DELETE FROM responses WHERE created_at < ? RETURNING size",
                                  (time.time() - self.ttl_s,)).fetchall():
            self._bytes -= size
        while self._bytes > self.max_bytes:
            rows = db.execute("SELECT id, size FROM responses ORDER BY created_at LIMIT 64").fetchall()
            if not rows:
                break
            for response_id, size in rows:
                if self._bytes <= self.max_bytes:
                    break
                db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
                self._bytes -= size
