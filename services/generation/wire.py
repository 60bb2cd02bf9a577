"""Protobuf <-> engine domain objects for GenerationService.Stream (protobuf stops here)."""

from __future__ import annotations

import time

from google.protobuf import timestamp_pb2
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.v1 import messages_pb2 as pb

from services.common import errors, sampling_wire
from services.common.finish_wire import WIRE as FINISH_WIRE
from services.common.pixel_normalization import TILE_MIME_TYPE
from services.common.sampling_fields import ENGINE_FIELDS
from services.common.structured_output_wire import structured_output_of
from services.generation.image_inputs import ImageInput
from services.generation.outputs import (
    Completion,
    Failure,
    TensorEvent,
    TokenEvent,
    TokenLogprobs,
)
from services.generation.sampling_params import Embedding, SamplingParams
from services.generation.stats import COUNTER, KINDS


def _timestamp(unix_s: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(unix_s * 1e9))
    return ts




def token_ids_of(parts, where: str, tile_bytes: int | None = None) -> tuple[list[int], list[ImageInput]]:
    """Token ids of MODALITY_TOKENS parts, and the image tiles of MODALITY_IMAGE parts (inline
    data of TILE_MIME_TYPE, tile_bytes each: a vision-language model's; None refuses images)."""
    ids: list[int] = []
    tiles: list[ImageInput] = []
    for i, part in enumerate(parts):
        source = part.WhichOneof("source")
        if part.modality == pb.MODALITY_IMAGE and source == "data":
            if tile_bytes is None:
                raise errors.invalid_argument(f"{where}[{i}]", "this model takes text only, not images")
            if part.mime_type != TILE_MIME_TYPE or len(part.data) != tile_bytes:
                raise errors.invalid_argument(f"{where}[{i}]", f"an image part here is one {TILE_MIME_TYPE} tile "
                                              f"of {tile_bytes} bytes, got {part.mime_type!r} of {len(part.data)}")
            tiles.append(ImageInput(part.data, 1))
            continue
        if part.modality != pb.MODALITY_TOKENS or source not in (None, "token_ids"):
            raise errors.invalid_argument(f"{where}[{i}]", "the generation service accepts MODALITY_TOKENS token_ids "
                                          "and MODALITY_IMAGE tiles only")
        ids.extend(part.token_ids.ids)
    return ids, tiles


def sampling_params_of(kwargs: pb.ModelKwargs) -> SamplingParams:
    s = kwargs.sampling
    if kwargs.HasField("extra") and kwargs.extra.fields:
        name = min(kwargs.extra.fields)
        raise errors.invalid_argument(f"model_kwargs.extra[{errors.quote(name, 32)}]", "unknown model keyword argument")
    if s.HasField("n") and s.n != 1:
        raise errors.invalid_argument("model_kwargs.sampling.n", "only n = 1 is supported by the engine")
    p = SamplingParams(**sampling_wire.values_of(s, ENGINE_FIELDS))
    if s.HasField("structured_output"):
        p.structured_output = structured_output_of(s.structured_output)
    return p


def embedding_of(msg: pb.PreprocessInput) -> Embedding | None:
    """output_modalities [MODALITY_EMBEDDING]: a prefill-only request that returns its embedding."""
    if pb.MODALITY_EMBEDDING not in msg.output_modalities:
        return None
    if any(m != pb.MODALITY_EMBEDDING for m in msg.output_modalities):
        raise errors.invalid_argument("output_modalities", "MODALITY_EMBEDDING cannot be combined with other outputs")
    e = msg.model_kwargs.embedding
    return Embedding(dimensions=e.dimensions if e.HasField("dimensions") else None)


def request_of(msg: pb.PreprocessInput, tile_bytes: int | None = None):
    """(prompt token ids, sampling params, input_done, image tiles) of a PreprocessInput."""
    if msg.text or msg.messages:
        raise errors.invalid_argument("text", "the generation service takes token ids, not text")
    ids, tiles = token_ids_of(msg.prompt_parts, "prompt_parts", tile_bytes)
    params = sampling_params_of(msg.model_kwargs)
    params.embedding = embedding_of(msg)
    input_done = pb.MODALITY_TOKENS not in msg.input_modalities or pb.MODALITY_TOKENS in msg.ends
    return ids, params, input_done, tiles


def append_of(frame: gen_pb2.ClientFrame) -> tuple[list[int], bool, int | None]:
    """A client_append frame's token ids, whether they end the input, and the max_tokens resolved
    with them (only an input's last append may carry one)."""
    msg = frame.client_append
    if msg.text:
        raise errors.invalid_argument("text", "the generation service takes token ids, not text")
    input_done = pb.MODALITY_TOKENS in msg.ends
    if frame.HasField("max_tokens") and not input_done:
        raise errors.invalid_argument("max_tokens", "only the append that ends the input carries max_tokens")
    for i, part in enumerate(msg.chunks):
        if part.modality == pb.MODALITY_IMAGE:
            raise errors.invalid_argument(f"chunks[{i}]", "image tiles come with the request's start, not in an append")
    ids, _ = token_ids_of(msg.chunks, "chunks")
    return ids, input_done, frame.max_tokens if frame.HasField("max_tokens") else None


def logprobs_entry(lp: TokenLogprobs | None) -> pb.TokenLogprobs:
    """One row's ResultTokens.logprobs entry (empty where the row did not ask for logprobs)."""
    entry = pb.TokenLogprobs()
    if lp is not None:
        entry.logprob = lp.logprob
        entry.top_token_ids.extend(lp.top_token_ids)
        entry.top_logprobs.extend(lp.top_logprobs)
    return entry


def add_result_tokens(response: gen_pb2.StreamResponse, step: int, rows: list[TokenEvent],
                      num_batched_tokens: int, logprobs: list[pb.TokenLogprobs] | None = None) -> None:
    """One step's ResultTokens, appended to `response` and filled in place (building a frame and
    then adding it would copy it: at a fast step, that copy was a tenth of the writer's time).
    logprobs: one entry per row (logprobs_entry), or None when no row asked for logprobs."""
    frame = response.frames.add().result_tokens
    frame.step = step
    frame.request_ids.extend([r.key[1] for r in rows])
    frame.token_ids.extend([r.token_id for r in rows])
    frame.loop_indices.extend([r.index for r in rows])
    frame.signal = gen_pb2.SIGNAL_STEP
    frame.modality = pb.MODALITY_TOKENS
    frame.metadata["batch_tokens"] = str(num_batched_tokens)
    if logprobs is None and any(r.logprobs is not None for r in rows):
        logprobs = [logprobs_entry(r.logprobs) for r in rows]
    if logprobs:
        frame.logprobs.extend(logprobs)


def heartbeat(step: int, request_ids: list[str], num_batched_tokens: int) -> gen_pb2.ServerFrame:
    """Requests that only prefilled in this step: alive and progressing, no token yet."""
    return gen_pb2.ServerFrame(result_tokens=gen_pb2.ResultTokens(
        step=step,
        request_ids=request_ids,
        signal=gen_pb2.SIGNAL_HEARTBEAT,
        modality=pb.MODALITY_TOKENS,
        metadata={"batch_tokens": str(num_batched_tokens)},
    ))


def result_tensors(t: TensorEvent) -> gen_pb2.ServerFrame:
    """An embedding: float32, little-endian, row-major (the Tensor contract), from the final norm."""
    return gen_pb2.ServerFrame(result_tensors=pb.ResultTensors(
        request_id=t.key[1],
        modality=pb.MODALITY_EMBEDDING,
        tensor=pb.Tensor(dtype=pb.D_TYPE_FLOAT32, shape=list(t.shape), data=t.data),
        edge=pb.GraphEdge(from_node="model.norm", to_node="pooler"),
    ))


def request_complete(c: Completion) -> gen_pb2.ServerFrame:
    return gen_pb2.ServerFrame(request_complete=pb.RequestComplete(
        request_id=c.key[1],
        output_chunk_counts=[pb.ModalityCount(modality=pb.MODALITY_TOKENS, chunks=c.num_output_tokens)],
        conductor_arrival_time=_timestamp(c.arrival_time),
        conductor_ingest_time=_timestamp(c.ingest_time),
        conductor_finish_time=_timestamp(c.finish_time),
        usage=pb.Usage(
            prompt_tokens=c.num_prompt_tokens,
            cached_prompt_tokens=c.num_cached_tokens,
            completion_tokens=c.num_output_tokens,
            total_tokens=c.num_prompt_tokens + c.num_output_tokens,
        ),
        timings=pb.Timings(
            queue_ms=c.queue_ms, prefill_ms=c.prefill_ms, time_to_first_token_ms=c.ttft_ms,
            decode_ms=c.decode_ms, e2e_ms=c.e2e_ms, preempted_ms=c.preempted_ms,
        ),
        finish_reason=FINISH_WIRE[c.finish_reason],
    ))


def request_failed(request_id: str, error: errors.MstarError) -> gen_pb2.ServerFrame:
    return gen_pb2.ServerFrame(request_failed=pb.RequestFailed(
        request_id=request_id, message=error.message, code=int(error.code),
        http_status=error.http_status, reason=error.reason,
        field=error.field_violations[0].field if error.field_violations else "",
    ))


def failure(f: Failure) -> gen_pb2.ServerFrame:
    return request_failed(f.key[1], f.error)


def conductor_status(snapshot: dict[str, float]) -> gen_pb2.StreamResponse:
    metrics = [
        gen_pb2.MetricSnapshot(
            family="mstar_generation", name=name, value=float(value),
            kind=gen_pb2.METRIC_KIND_COUNTER if KINDS.get(name) == COUNTER else gen_pb2.METRIC_KIND_GAUGE,
        )
        for name, value in snapshot.items()
    ]
    status = gen_pb2.ConductorStatus(time=_timestamp(time.time()), metrics=metrics)
    return gen_pb2.StreamResponse(frames=[gen_pb2.ServerFrame(conductor_status=status)])
