"""The other preprocess replicas: where an Append or Cancel goes when this replica does not run the request.

Envoy balances every call over the preprocess replicas (least request), so an Append or Cancel by
request id usually lands on a replica that does not own the request. We forward internally rather
than make Envoy route on the id (docs/design.md, "Preprocess replicas behind Envoy", says why):

- Server-assigned ids carry the owner's tag, `<32 hex>-<8 hex>`: the tag is a hash of the owner's
  advertised address (`--advertise`, the address its peers resolve it to), so a peer maps it back
  with no shared state and forwards straight there.
- Client-chosen ids (and a tag no peer matches) are asked of every peer at once; the owner
  answers, the others say NOT_FOUND. The answer is remembered (small LRU), so the next Append
  for the same id goes straight to its owner.
- A forwarded call carries `mstar-forwarded: 1` and is never forwarded again (no loops, at most
  one hop). A replica that restarted lost its requests: it and every other peer answer NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections import OrderedDict

import grpc
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc

from services.common.errors import Code, MstarError, not_found
from services.common.grpc_errors import from_grpc_error
from services.common.server import channel_options
from services.preprocess import client
from services.preprocess.resolver import Resolver

log = logging.getLogger(__name__)

FORWARDED = "mstar-forwarded"  # metadata key: this call was forwarded by a peer, answer locally
_OWNERS = 10_000  # remembered id -> peer answers


def owner_tag(address: str) -> str:
    return hashlib.blake2b(address.encode(), digest_size=4).hexdigest()


def is_forwarded(context: grpc.aio.ServicerContext) -> bool:
    return any(key == FORWARDED for key, _ in context.invocation_metadata() or ())


class Peers:
    def __init__(self, resolver: Resolver | None, advertise: str, *, resolve_interval_s: float = 5.0,
                 timeout_s: float = 5.0) -> None:
        self.advertise = advertise
        self.tag = owner_tag(advertise)
        self._resolver = resolver
        self._interval_s = resolve_interval_s
        self._timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._task: asyncio.Task | None = None

    def new_request_id(self) -> str:
        return f"{uuid.uuid4().hex}-{self.tag}"

    @property
    def addresses(self) -> list[str]:
        return list(self._channels)

    # ---- membership

    def start(self) -> None:
        if self._resolver is not None:
            self._task = asyncio.create_task(self._maintain(), name="preprocess-peers")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*(c.close(grace=None) for c in self._channels.values()))
        self._channels.clear()

    async def refresh(self) -> None:
        found = set(await self._resolver.resolve()) - {self.advertise}
        for address in found - set(self._channels):
            self._channels[address] = grpc.aio.insecure_channel(address, options=channel_options())
        for address in set(self._channels) - found:
            await self._channels.pop(address).close(grace=None)

    async def _maintain(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - keep the last peers; try again next period
                log.exception("peer resolution failed")
            await asyncio.sleep(self._interval_s)

    # ---- forwarding

    async def append(self, request: api.AppendRequest, principal: str = client.ANONYMOUS) -> api.AppendResponse:
        """The owner's answer to this Append by `principal`; NOT_FOUND when no peer runs the
        request, or runs it for another principal."""
        return await self._forward("Append", request, request.append.request_id, principal)

    async def cancel(self, request: api.CancelRequest, principal: str = client.ANONYMOUS) -> api.CancelResponse:
        try:
            return await self._forward("Cancel", request, request.request_id, principal)
        except MstarError as err:
            if err.code != Code.NOT_FOUND:
                raise
            return api.CancelResponse(request_id=request.request_id, cancelled=False)

    def _candidates(self, request_id: str) -> list[str]:
        """Where to ask first: the remembered owner, else the peer the id's tag names."""
        remembered = self._owners.get(request_id)
        if remembered in self._channels:
            return [remembered]
        _, _, tag = request_id.rpartition("-")
        return [a for a in self._channels if owner_tag(a) == tag][:1]

    async def _forward(self, method: str, message, request_id: str, principal: str):
        direct = self._candidates(request_id)
        if direct:
            answer = await self._ask(direct, method, message, principal)
            if answer is not None:
                return answer
        rest = [a for a in self._channels if a not in direct]
        answer = await self._ask(rest, method, message, principal, request_id)
        if answer is None:
            raise not_found(f"request {request_id!r} is not running", reason="REQUEST_NOT_FOUND")
        return answer

    async def _ask(self, addresses: list[str], method: str, message, principal: str, request_id: str | None = None):
        """Every address at once; the first that is not NOT_FOUND (or UNAVAILABLE: a peer that is
        down runs nothing) is the owner. Its answer is returned, its error raised."""
        if not addresses:
            return None
        calls = [self._call(address, method, message, principal) for address in addresses]
        owner_answer = None
        for address, result in zip(addresses, await asyncio.gather(*calls), strict=True):
            if isinstance(result, MstarError) and result.code in (Code.NOT_FOUND, Code.UNAVAILABLE):
                continue
            if owner_answer is None:
                owner_answer = result
                if request_id is not None:
                    self._remember(request_id, address)
        if isinstance(owner_answer, MstarError):
            raise owner_answer
        return owner_answer

    async def _call(self, address: str, method: str, message, principal: str):
        stub = api_grpc.InferenceServiceStub(self._channels[address])
        # The caller's principal goes along: the owner answers only for that principal's request.
        who = ((client.CLIENT_HEADER, principal),) if principal != client.ANONYMOUS else ()
        try:
            return await getattr(stub, method)(message, timeout=self._timeout_s, metadata=((FORWARDED, "1"), *who))
        except grpc.RpcError as exc:
            return from_grpc_error(exc)

    def _remember(self, request_id: str, address: str) -> None:
        self._owners[request_id] = address
        self._owners.move_to_end(request_id)
        while len(self._owners) > _OWNERS:
            self._owners.popitem(last=False)
