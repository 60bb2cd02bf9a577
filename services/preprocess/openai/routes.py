"""CreateChatCompletion / CreateCompletion for the preprocess InferenceServicer, as a mixin.

    class InferenceServicer(OpenAIRoutes, api_grpc.InferenceServiceServicer): ...

Each OpenAI choice runs through the servicer's own GenerateStream, so admission, validation,
stop strings, keep-alives and cancel-on-disconnect behave exactly as on the native API.
The host class provides `GenerateStream` and `_deps.model` (name, tokenizer).
"""

from __future__ import annotations

from mstar.v1 import inference_service_pb2 as api

from services.preprocess.openai.handler import chat_completions, completions


class OpenAIRoutes:
    def _openai_run(self, inp, context):
        return self.GenerateStream(api.GenerateStreamRequest(input=inp), context)  # type: ignore[attr-defined]

    def _openai_options(self) -> dict:
        model = self._deps.model  # type: ignore[attr-defined]
        return {"model_name": model.name, "token_text": lambda token_id: model.tokenizer.decode([token_id])}

    async def CreateChatCompletion(self, request, context):
        async for body in chat_completions(request, context, self._openai_run, **self._openai_options()):
            yield body

    async def CreateCompletion(self, request, context):
        async for body in completions(request, context, self._openai_run, **self._openai_options()):
            yield body
