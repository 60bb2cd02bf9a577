"""Stored responses belong to whoever stored them: the store's owner column (and its migration
from databases written before it), the Responses endpoints under two principals, and how a
call's principal is read from its identity (services/preprocess/client.py).

The stack-level version (two real API keys through Envoy) is tests/reliability/test_tenancy.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import threading

import pytest
from surface_harness import EchoBackend, http, make_runner

from services.common.errors import Code, MstarError
from services.preprocess import client
from services.preprocess.surfaces.http import HttpRequest
from services.preprocess.surfaces.responses.endpoints import ResponsesApi
from services.preprocess.surfaces.responses.store import ResponseStore, StoredResponse

A, B = "key-aaaaaaaaaaaaaaaa", "key-bbbbbbbbbbbbbbbb"


def record(response_id: str, owner: str) -> StoredResponse:
    return StoredResponse(response_id, 1e12, "completed", {"id": response_id, "status": "completed"},
                          [("user", "hi"), ("assistant", "x")], owner)


def run_with_store(path, fn):
    async def go():
        store = await ResponseStore(path, ttl_s=1e13).open()
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(go())


# ---- the store


def test_a_row_is_visible_and_deletable_only_by_its_owner(tmp_path):
    async def go(store):
        await store.put(record("resp_a", A))
        await store.put(record("resp_anon", client.ANONYMOUS))
        assert await store.get("resp_a", B) is None and await store.get("resp_a", client.ANONYMOUS) is None
        assert not await store.delete("resp_a", B)
        assert (await store.get("resp_a", A)).owner == A  # B's failed delete left it alone
        assert await store.get("resp_anon", A) is None and await store.get("resp_anon", "") is not None
        with pytest.raises(ValueError):  # the same id again under another owner never takes the row over
            await store.put(record("resp_a", B))
        assert (await store.get("resp_a", A)).response["id"] == "resp_a"
        assert await store.delete("resp_a", A) and await store.get("resp_a", A) is None

    run_with_store(tmp_path / "db.sqlite3", go)


LEGACY_SCHEMA = """
CREATE TABLE responses (id TEXT PRIMARY KEY, created_at REAL NOT NULL, status TEXT NOT NULL,
                        size INTEGER NOT NULL, response TEXT NOT NULL, conversation TEXT NOT NULL);
CREATE INDEX responses_by_age ON responses (created_at);
"""


def _legacy_db(path) -> None:
    db = sqlite3.connect(path)
    db.executescript(LEGACY_SCHEMA)
    db.execute("INSERT INTO responses VALUES ('resp_old', 1e12, 'completed', 10, ?, '[[\"user\", \"hi\"]]')",
               (json.dumps({"id": "resp_old"}),))
    db.commit()
    db.close()


def test_rows_from_before_owners_belong_to_the_anonymous_principal(tmp_path):
    path = tmp_path / "old.sqlite3"
    _legacy_db(path)

    async def go(store):
        assert await store.get("resp_old", A) is None  # with keys on, nobody can claim it
        assert not await store.delete("resp_old", A)
        old = await store.get("resp_old", client.ANONYMOUS)  # with keys off, as readable as before
        assert old.response == {"id": "resp_old"} and old.owner == ""
        await store.put(record("resp_new", A))
        assert (await store.get("resp_new", A)).owner == A

    run_with_store(path, go)
    run_with_store(path, go)  # opening a migrated database again changes nothing


def test_replicas_opening_one_legacy_database_at_once_all_migrate_it(tmp_path):
    # Every preprocess replica of `make run` opens the same file; two ALTER TABLEs would collide.
    path = tmp_path / "shared.sqlite3"
    _legacy_db(path)
    results, errors = [], []

    def open_one():
        try:
            results.append(run_with_store(path, lambda store: store.get("resp_old", "")))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(results) == 4 and all(r is not None for r in results), errors


# ---- the endpoints under two principals


@pytest.fixture
def api(tmp_path):
    store = asyncio.run(ResponseStore(tmp_path / "responses.sqlite3").open())
    yield ResponsesApi(store)
    asyncio.run(store.close())


def as_principal(endpoint, runner, principal: str, req: HttpRequest):
    """Run an endpoint as a call with `principal` (its admission key, as client.py makes it)."""

    async def go():
        scope = runner.scope(client.client_key([(client.CLIENT_HEADER, principal)] if principal else [], "ipv4:1.2.3.4:5"))
        try:
            return [frame async for frame in endpoint(req, scope)]
        finally:
            scope.close()

    return asyncio.run(go())


def by_id(response_id: str) -> HttpRequest:
    return HttpRequest(params={"response_id": response_id})


def refusal(fn) -> dict:
    with pytest.raises(MstarError) as info:
        fn()
    return dataclasses.asdict(info.value)


def test_another_principal_gets_exactly_the_404_of_an_id_that_never_existed(api, runner):
    created = json.loads(as_principal(api.create, runner, A, http({"input": "Hi", "max_output_tokens": 4}))[0].data)
    rid = created["id"]
    for endpoint in (api.retrieve, api.delete, api.cancel):
        for other in (B, client.ANONYMOUS):
            theirs = refusal(lambda e=endpoint, o=other: as_principal(e, runner, o, by_id(rid)))
            never = refusal(lambda e=endpoint, o=other: as_principal(e, runner, o, by_id("resp_never")))
            assert theirs == never and theirs["code"] == Code.NOT_FOUND, (endpoint.__name__, theirs)
    cont = {"input": "More", "max_output_tokens": 4}
    theirs = refusal(lambda: as_principal(api.create, runner, B, http({**cont, "previous_response_id": rid})))
    never = refusal(lambda: as_principal(api.create, runner, B, http({**cont, "previous_response_id": "resp_never"})))
    assert theirs == never and theirs["reason"] == "PREVIOUS_RESPONSE_NOT_FOUND"
    # The owner still has all of it.
    assert json.loads(as_principal(api.retrieve, runner, A, by_id(rid))[0].data) == created
    again = json.loads(as_principal(api.create, runner, A, http({**cont, "previous_response_id": rid}))[0].data)
    assert again["previous_response_id"] == rid and again["status"] in ("completed", "incomplete")
    assert json.loads(as_principal(api.cancel, runner, A, by_id(rid))[0].data)["id"] == rid
    assert json.loads(as_principal(api.delete, runner, A, by_id(rid))[0].data)["deleted"] is True


def test_another_principal_cannot_cancel_a_running_response(api, model):
    runner = make_runner(model, EchoBackend(step_s=0.01, hold=True))

    async def go():
        owner = runner.scope(client.client_key([(client.CLIENT_HEADER, A)], None))
        other = runner.scope(client.client_key([(client.CLIENT_HEADER, B)], None))
        stream = api.create(http({"input": "Hi", "max_output_tokens": 1000, "stream": True}), owner)
        rid = json.loads((await anext(stream)).data.split(b"data: ")[1])["response"]["id"]
        reader = asyncio.create_task(_drain(stream))
        await asyncio.sleep(0.05)
        with pytest.raises(MstarError) as info:
            [f async for f in api.cancel(by_id(rid), other)]
        assert info.value.code == Code.NOT_FOUND and not reader.done() and runner.num_running == 1
        cancelled = [f async for f in api.cancel(by_id(rid), owner)]
        await reader
        owner.close()
        other.close()
        return json.loads(cancelled[0].data)

    assert asyncio.run(go())["status"] == "cancelled"


async def _drain(stream):
    return [f async for f in stream]


def test_store_false_responses_are_nobodys_to_read(api, runner):
    rid = json.loads(as_principal(api.create, runner, A, http({"input": "Hi", "store": False}))[0].data)["id"]
    assert refusal(lambda: as_principal(api.retrieve, runner, A, by_id(rid)))["code"] == Code.NOT_FOUND


# ---- a call's principal


def test_the_principal_is_the_authenticated_identity_never_an_address():
    assert client.principal(client.client_key([("x-mstar-client", A)], "ipv4:1.2.3.4:5")) == A
    assert client.principal(client.client_key([("x-mstar-client-address", "10.0.0.1")], None)) == client.ANONYMOUS
    assert client.principal(client.client_key([], "ipv4:10.0.0.1:5")) == client.ANONYMOUS
    assert client.principal(client.client_key([("x-mstar-client", "")], "ipv4:10.0.0.1:5")) == client.ANONYMOUS


def test_long_or_digest_like_identities_are_digested_never_truncated():
    shared = "u" * 128
    first = client.principal(client.client_key([("x-mstar-client", shared + "-alice")], None))
    second = client.principal(client.client_key([("x-mstar-client", shared + "-bob")], None))
    assert first != second and first.startswith("sha256:") and len(first) <= 128
    posing = client.principal(client.client_key([("x-mstar-client", first)], None))
    assert posing != first  # an identity spelled like a digest cannot pose as the one it names
