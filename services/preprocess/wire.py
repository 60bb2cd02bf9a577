"""Protobuf <-> domain for the public InferenceService (the only module besides the servicer and
the backend that touches generated types), and the domain's requests as the generation contract's
ModelKwargs and the generation stream's numerics metadata, which the backend sends and reads."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import replace

from google.protobuf import timestamp_pb2
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import messages_pb2 as pb

from services.common import sampling_wire
from services.common.errors import invalid_argument
from services.common.finish_wire import WIRE as FINISH_WIRE
from services.common.sampling_fields import FIELDS
from services.common.structured_output_wire import structured_output_of, structured_output_pb
from services.preprocess.chat_template import ChatMessage
from services.preprocess.request import (
    TEXT,
    TOKENS,
    Accepted,
    AppendSpec,
    Chunk,
    Complete,
    EmbeddingSpec,
    Failed,
    KeepAlive,
    Part,
    Profile,
    RequestSpec,
    Sampling,
    Tensor,
)
from services.preprocess.surfaces.sampling_names import native_prefix

MODALITY_NAMES = {
    pb.MODALITY_UNSPECIFIED: TEXT,
    pb.MODALITY_TEXT: TEXT,
    pb.MODALITY_TOKENS: TOKENS,
    pb.MODALITY_IMAGE: "image",
    pb.MODALITY_AUDIO: "audio",
    pb.MODALITY_VIDEO: "video",
}
MODALITY_ENUMS = {name: value for value, name in MODALITY_NAMES.items() if value != pb.MODALITY_UNSPECIFIED}


def modality(value: int, field: str) -> str:
    name = MODALITY_NAMES.get(value)
    if name is None:
        raise invalid_argument(field, f"unknown modality {value}")
    return name


def model_numerics(numerics: dict) -> api.ModelNumerics | None:
    """The generation backend's numerics metadata (JSON fields) -> ModelNumerics; None before one connected."""
    if not numerics:
        return None
    return api.ModelNumerics(**numerics)  # numerics_of: exactly its fields and types


def sampling_pb(s: Sampling) -> pb.SamplingParams:
    """The inverse of the sampling part of request_spec: unset (None) fields stay unset."""
    params = sampling_wire.message_of({name: getattr(s, name) for name in FIELDS}, FIELDS.values())
    if s.structured_output is not None:
        params.structured_output.CopyFrom(structured_output_pb(s.structured_output))
    return params


def request_spec(msg: pb.PreprocessInput, surface: str,
                 new_id: Callable[[], str] = lambda: uuid.uuid4().hex) -> RequestSpec:
    """`surface`: the RPC it came through (Generate, GenerateStream, Session): metrics label and
    the root of error field paths (input. / start.). `new_id` names a request whose client chose
    no id (a preprocess replica tags it with its owner: services/preprocess/peers.py)."""
    sampling_pb = msg.model_kwargs.sampling
    sampling = Sampling(
        **sampling_wire.values_of(sampling_pb, FIELDS.values()),
        structured_output=(structured_output_of(sampling_pb.structured_output)
                           if sampling_pb.HasField("structured_output") else None),
    )
    root = "start" if surface == "Session" else "input"
    opened = {modality(m, "input.input_modalities") for m in msg.input_modalities}
    ended = {modality(m, "input.ends") for m in msg.ends}
    return RequestSpec(
        request_id=msg.request_id or new_id(),
        client_request_id=msg.client_request_id,
        model=msg.model,
        text=msg.text,
        messages=tuple(ChatMessage(m.role, m.content) for m in msg.messages),
        parts=tuple(_part(p, f"input.prompt_parts[{i}]") for i, p in enumerate(msg.prompt_parts)),
        open_inputs=frozenset(opened - ended),
        sampling=sampling,
        field_renames=(("structured_output", native_prefix(surface) + "structured_output"),),
        extra_keys=tuple(msg.model_kwargs.extra.fields.keys()),
        upload_bytes=msg.ByteSize(),
        embedding=_embedding(msg, root),
        surface=surface,
    )


# What a request may ask back: the served models are language models, which produce text (its
# token ids come with it) or, prefill only, an embedding. Anything else would be answered with
# text the caller did not ask for.
_OUTPUTS = (pb.MODALITY_UNSPECIFIED, pb.MODALITY_TEXT, pb.MODALITY_TOKENS, pb.MODALITY_EMBEDDING)


def _embedding(msg: pb.PreprocessInput, root: str) -> EmbeddingSpec | None:
    """output_modalities [MODALITY_EMBEDDING]: an embedding request (ModelKwargs.embedding)."""
    for i, value in enumerate(msg.output_modalities):
        if value not in _OUTPUTS:
            name = pb.Modality.Name(value) if value in pb.Modality.values() else str(value)
            raise invalid_argument(f"{root}.output_modalities[{i}]", f"the model cannot produce {name}; it "
                                   "produces MODALITY_TEXT (with its MODALITY_TOKENS) or MODALITY_EMBEDDING")
    outputs = set(msg.output_modalities)
    if pb.MODALITY_EMBEDDING not in outputs:
        return None
    if outputs != {pb.MODALITY_EMBEDDING}:
        raise invalid_argument(f"{root}.output_modalities", "MODALITY_EMBEDDING cannot be combined with other outputs")
    if msg.model_kwargs.HasField("sampling"):
        raise invalid_argument(f"{root}.model_kwargs.sampling", "an embedding request samples nothing; leave it unset")
    e = msg.model_kwargs.embedding
    return EmbeddingSpec(e.dimensions if e.HasField("dimensions") else None)


def append_spec(msg: pb.ClientAppend) -> AppendSpec:
    parts = [_part(p, f"append.chunks[{i}]") for i, p in enumerate(msg.chunks)]
    if msg.text:
        parts.insert(0, Part(TEXT, text=msg.text))
    return AppendSpec(
        request_id=msg.request_id,
        parts=tuple(parts),
        ends=frozenset(modality(m, "append.ends") for m in msg.ends),
        upload_bytes=msg.ByteSize(),
    )


def _part(p: pb.PromptPart, field: str) -> Part:
    source = p.WhichOneof("source")
    kind = modality(p.modality, field + ".modality")
    if kind == TEXT and p.modality == pb.MODALITY_UNSPECIFIED and source == "token_ids":
        kind = TOKENS
    if source == "text":
        return Part(kind, text=p.text, mime_type=p.mime_type)
    if source == "data":
        return Part(kind, data=p.data, mime_type=p.mime_type)
    if source == "file_path":
        return Part(kind, file_path=p.file_path, mime_type=p.mime_type)
    if source == "token_ids":
        return Part(TOKENS if kind == TEXT else kind, token_ids=tuple(p.token_ids.ids), mime_type=p.mime_type)
    raise invalid_argument(field, "empty prompt part (set text, data, file_path or token_ids)")


# ---- domain -> protobuf


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _logprobs(items) -> list[pb.TokenLogprobs]:
    return [
        pb.TokenLogprobs(logprob=i.logprob, top_token_ids=i.top_token_ids, top_logprobs=i.top_logprobs)
        for i in items
    ]


def accepted(e: Accepted) -> api.RequestAccepted:
    return api.RequestAccepted(
        request_id=e.request_id,
        client_request_id=e.client_request_id,
        prompt_tokens=e.prompt_tokens,
        max_tokens=e.max_tokens,
        warnings=e.warnings,
    )


def chunk(e: Chunk) -> pb.ResultChunk:
    return pb.ResultChunk(
        request_id=e.request_id,
        modality=pb.MODALITY_TEXT,
        text=e.text,
        index=e.index,
        token_ids=e.token_ids,
        logprobs=_logprobs(e.logprobs),
    )


_DTYPES = {"float32": pb.D_TYPE_FLOAT32}


def tensors(e: Tensor) -> pb.ResultTensors:
    return pb.ResultTensors(
        request_id=e.request_id,
        modality=pb.MODALITY_EMBEDDING,
        tensor=pb.Tensor(dtype=_DTYPES[e.dtype], shape=e.shape, data=e.data),
        edge=pb.GraphEdge(from_node="model.norm", to_node="pooler"),
    )


def profile(e: Profile) -> pb.DataWorkerProfile:
    infos = [
        pb.InputInfo(
            modality=MODALITY_ENUMS[i.modality],
            size_bytes=i.size_bytes,
            num_tokens=i.num_tokens,
            mime_type=i.mime_type,
        )
        for i in e.input_infos
    ]
    modalities = sorted({MODALITY_ENUMS[i.modality] for i in e.input_infos})
    return pb.DataWorkerProfile(
        request_id=e.request_id,
        dequeue_time=_timestamp(e.dequeue_time),
        preprocess_finish_time=_timestamp(e.preprocess_finish_time),
        input_infos=infos,
        modalities=modalities,
        upload_sizes_bytes=e.upload_sizes_bytes,
        failed=e.failed,
    )


def complete(e: Complete, tx: pb.TransferInfo | None = None) -> pb.RequestComplete:
    """The terminal event; `tx` counts what was sent to the client for the request before it."""
    done = pb.RequestComplete(
        request_id=e.request_id,
        output_chunk_counts=[pb.ModalityCount(modality=pb.MODALITY_EMBEDDING, chunks=e.tensors)] if e.tensors
        else [pb.ModalityCount(modality=pb.MODALITY_TEXT, chunks=e.chunks)],
        usage=pb.Usage(
            prompt_tokens=e.prompt_tokens,
            cached_prompt_tokens=e.cached_prompt_tokens,
            completion_tokens=e.completion_tokens,
            total_tokens=e.prompt_tokens + e.completion_tokens,
        ),
        timings=pb.Timings(**e.timings_ms),
        finish_reason=FINISH_WIRE[e.finish_reason],
        stop_reason=e.stop_reason,
        warnings=e.warnings,
        node_timings=[pb.NodeTiming(node=node, duration_ms=ms) for node, ms in e.node_timings_ms.items()],
        rx=pb.TransferInfo(messages=e.rx_messages, bytes=e.rx_bytes),
        tx=tx or pb.TransferInfo(),
    )
    for name, seconds in e.conductor_times.items():
        getattr(done, name).CopyFrom(_timestamp(seconds))
    return done


def failed(e: Failed) -> pb.RequestFailed:
    err = e.error
    return pb.RequestFailed(
        request_id=e.request_id,
        message=err.message,
        code=int(err.code),
        http_status=err.http_status,
        reason=err.reason,
        client_request_id=e.client_request_id,
        field=err.field_violations[0].field if err.field_violations else "",
    )


class Sent:
    """What went to the client for one request so far (RequestComplete.tx)."""

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0

    def count(self, msg):
        self.messages += 1
        self.bytes += msg.ByteSize()
        return msg

    def info(self) -> pb.TransferInfo:
        return pb.TransferInfo(messages=self.messages, bytes=self.bytes)


def stream_event(e, sent: Sent | None = None) -> api.GenerateStreamResponse:
    """A request event as a GenerateStream message (Session uses the same oneof names), counted
    in `sent` (whose totals the terminal RequestComplete reports)."""
    msg = api.GenerateStreamResponse(**_event_fields(e, sent))
    return sent.count(msg) if sent is not None else msg


def session_event(e, sent: Sent | None = None) -> api.SessionResponse:
    msg = api.SessionResponse(**_event_fields(e, sent))
    return sent.count(msg) if sent is not None else msg


def _event_fields(e, sent: Sent | None = None) -> dict:
    if isinstance(e, Accepted):
        return {"accepted": accepted(e)}
    if isinstance(e, Chunk):
        return {"chunk": chunk(e)}
    if isinstance(e, Tensor):
        return {"tensors": tensors(e)}
    if isinstance(e, KeepAlive):
        return {"keep_alive": api.KeepAlive(request_id=e.request_id)}
    if isinstance(e, Profile):
        return {"profile": profile(e)}
    if isinstance(e, Complete):
        return {"complete": complete(e, sent.info() if sent is not None else None)}
    if isinstance(e, Failed):
        return {"failed": failed(e)}
    raise TypeError(f"not a request event: {e!r}")


NUMERICS_KEY = "mstar-numerics"  # the generation servicer's initial metadata (services/generation/servicer.py)


def numerics_of(metadata) -> dict:
    """The metadata's JSON as exactly Model.numerics' fields and types ({} if absent or malformed):
    both ListModels (protobuf) and GET /v1/models (JSON as built) report it as is."""
    for key, value in metadata or ():
        if key == NUMERICS_KEY:
            try:
                parsed = json.loads(value)
            except ValueError:
                return {}
            if not isinstance(parsed, dict):
                return {}
            text = {name: str(parsed.get(name, "")) for name in ("device", "weights", "activations", "kernels", "kv_cache")}
            return {**text, "compiled_decode": bool(parsed.get("compiled_decode", False))}
    return {}


def engine_kwargs(s: Sampling, max_tokens: int) -> pb.ModelKwargs:
    """What the engine is told about sampling. Stop strings are matched here on text; the engine
    only sees token-level stops, the effective max_tokens and one completion (n > 1 fans out
    above this layer)."""
    engine_side = replace(s, stop=(), include_stop=False, max_tokens=max_tokens, n=1)
    return pb.ModelKwargs(sampling=sampling_pb(engine_side))


def embedding_kwargs(e: EmbeddingSpec) -> pb.ModelKwargs:
    """What the engine is told about an embedding request (output_modalities [MODALITY_EMBEDDING])."""
    params = pb.EmbeddingParams()
    if e.dimensions is not None:
        params.dimensions = e.dimensions
    return pb.ModelKwargs(embedding=params)

