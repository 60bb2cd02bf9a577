"""The transport ceiling: a bare grpc.aio server that speaks InferenceService.GenerateStream and
streams `max_tokens` one-token chunks as fast as it can, with no model, no tokenizer, no second
hop and no Envoy. The same GrpcClient drives it and the full stack, so the ratio between the two
is what preprocess + the internal stream + Envoy cost.

    python -m bench.bare_server --port 0      # prints "PORT <n>" once listening
"""

from __future__ import annotations

import argparse
import asyncio

import grpc
from mstar.v1 import inference_service_pb2 as isvc
from mstar.v1 import inference_service_pb2_grpc as isvc_grpc
from mstar.v1 import messages_pb2 as msg


class BareInference(isvc_grpc.InferenceServiceServicer):
    async def GenerateStream(self, request, context):  # noqa: N802 (gRPC method name)
        n = request.input.model_kwargs.sampling.max_tokens or 16
        rid = "bare"
        yield isvc.GenerateStreamResponse(accepted=isvc.RequestAccepted(request_id=rid, max_tokens=n))
        for i in range(n):
            # The same shape as a real chunk: one token id and its text.
            yield isvc.GenerateStreamResponse(
                chunk=msg.ResultChunk(request_id=rid, modality=msg.MODALITY_TEXT, text=" tok", index=i,
                                      token_ids=[i])
            )
        done = msg.RequestComplete(request_id=rid, finish_reason=msg.FINISH_REASON_LENGTH)
        done.usage.completion_tokens = n
        yield isvc.GenerateStreamResponse(complete=done)


async def serve(port: int) -> None:
    server = grpc.aio.server()
    isvc_grpc.add_InferenceServiceServicer_to_server(BareInference(), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"PORT {bound}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    asyncio.run(serve(ap.parse_args().port))


if __name__ == "__main__":
    main()
