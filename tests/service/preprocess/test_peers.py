"""Append/Cancel forwarding between preprocess replicas (services/preprocess/peers.py), against
in-process InferenceService stand-ins that own a few request ids each."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc

from services.common import errors, grpc_errors
from services.common.errors import Code, MstarError
from services.preprocess.peers import Peers, is_forwarded, owner_tag
from services.preprocess.resolver import Resolver


class Owner(api_grpc.InferenceServiceServicer):
    """Runs `ids`; `ended` ids answer FAILED_PRECONDITION like a request whose input ended."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.ended: set[str] = set()
        self.calls: list[tuple[str, str, bool]] = []
        self.principals: list[str] = []  # the x-mstar-client each forwarded call carried ("" none)

    async def Append(self, request, context):
        rid = request.append.request_id
        self.calls.append(("Append", rid, is_forwarded(context)))
        if rid in self.ended:
            await grpc_errors.abort(context, errors.failed_precondition("input ended", "INPUT_ENDED"))
        if rid not in self.ids:
            await grpc_errors.abort(context, errors.not_found("no such request", "REQUEST_NOT_FOUND"))
        return api.AppendResponse(request_id=rid, prompt_tokens=7)

    async def Cancel(self, request, context):
        self.calls.append(("Cancel", request.request_id, is_forwarded(context)))
        self.principals.append(dict(context.invocation_metadata()).get("x-mstar-client", ""))
        return api.CancelResponse(request_id=request.request_id, cancelled=request.request_id in self.ids)


async def start_owners(n: int):
    servers, owners, addresses = [], [], []
    for _ in range(n):
        server = grpc.aio.server()
        owner = Owner()
        api_grpc.add_InferenceServiceServicer_to_server(owner, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        owners.append(owner)
        addresses.append(f"127.0.0.1:{port}")
    return servers, owners, addresses


def append(rid: str) -> api.AppendRequest:
    return api.AppendRequest(append={"request_id": rid, "text": "more"})


@pytest.fixture
def peers_world(loop):
    """Three owners; a Peers object as seen from a fourth replica ("self")."""
    servers, owners, addresses = loop.run(start_owners(3))
    me = "127.0.0.1:1"

    async def make():
        peers = Peers(Resolver(",".join([*addresses, me])), advertise=me)
        await peers.refresh()
        return peers

    peers = loop.run(make())
    yield peers, owners, addresses
    loop.run(peers.close())
    for server in servers:
        loop.run(server.stop(None))


def test_a_server_assigned_id_goes_straight_to_its_owner(loop, peers_world):
    peers, owners, addresses = peers_world
    assert sorted(peers.addresses) == sorted(addresses)  # self is not a peer
    rid = f"{'a' * 32}-{owner_tag(addresses[1])}"
    owners[1].ids.add(rid)
    reply = loop.run(peers.append(append(rid)))
    assert reply.prompt_tokens == 7
    assert owners[1].calls == [("Append", rid, True)]  # forwarded once, marked as forwarded
    assert not owners[0].calls and not owners[2].calls  # nobody else was asked


def test_a_client_chosen_id_is_asked_of_every_peer_then_remembered(loop, peers_world):
    peers, owners, _ = peers_world
    owners[2].ids.add("my-request")
    assert loop.run(peers.append(append("my-request"))).request_id == "my-request"
    assert [len(o.calls) for o in owners] == [1, 1, 1]
    loop.run(peers.append(append("my-request")))
    assert [len(o.calls) for o in owners] == [1, 1, 2]  # the second time: straight to the owner
    assert loop.run(peers.cancel(api.CancelRequest(request_id="my-request"))).cancelled


def test_the_owners_error_is_the_answer_and_no_owner_is_not_found(loop, peers_world):
    peers, owners, _ = peers_world
    owners[0].ids.add("done")
    owners[0].ended.add("done")
    with pytest.raises(MstarError) as err:
        loop.run(peers.append(append("done")))
    assert (err.value.code, err.value.reason) == (Code.FAILED_PRECONDITION, "INPUT_ENDED")
    with pytest.raises(MstarError) as err:
        loop.run(peers.append(append("nobody-has-it")))
    assert (err.value.code, err.value.reason) == (Code.NOT_FOUND, "REQUEST_NOT_FOUND")
    assert not loop.run(peers.cancel(api.CancelRequest(request_id="nobody-has-it"))).cancelled


def test_a_tag_whose_owner_no_longer_runs_it_falls_back_to_asking_everyone(loop, peers_world):
    peers, owners, addresses = peers_world
    rid = f"{'b' * 32}-{owner_tag(addresses[0])}"  # looks like owner 0's, runs on owner 2
    owners[2].ids.add(rid)
    assert loop.run(peers.append(append(rid))).request_id == rid
    assert [len(o.calls) for o in owners] == [1, 1, 1]  # direct (NOT_FOUND), then the other two


def test_a_peer_that_is_down_does_not_stop_the_others(loop, peers_world):
    peers, owners, addresses = peers_world

    async def add_dead_peer():
        peers._resolver = Resolver(",".join([*addresses, "127.0.0.1:9"]))  # nothing listens on 9
        await peers.refresh()

    loop.run(add_dead_peer())
    owners[1].ids.add("x")
    assert loop.run(asyncio.wait_for(peers.append(append("x")), 10)).request_id == "x"


def test_a_forwarded_call_carries_its_callers_principal(loop, peers_world):
    """The owner answers only for the principal's own request (runner.find), so it must know it."""
    peers, owners, addresses = peers_world
    rid = f"{'b' * 32}-{owner_tag(addresses[0])}"
    owners[0].ids.add(rid)
    loop.run(peers.cancel(api.CancelRequest(request_id=rid), "key-0123456789abcdef"))
    loop.run(peers.cancel(api.CancelRequest(request_id=rid)))  # anonymous: no identity sent
    assert owners[0].principals == ["key-0123456789abcdef", ""]
