"""CreateChatCompletion / CreateCompletion for the preprocess InferenceServicer, as a mixin.

    class InferenceServicer(OpenAIRoutes, api_grpc.InferenceServiceServicer): ...

Each OpenAI choice runs through the servicer's own request stream (what GenerateStream serves), so
admission, validation, stop strings, keep-alives and cancel-on-disconnect behave exactly as on the
native API; its metrics and log line are labelled with the OpenAI surface (`chat.completions`,
`completions`), not as GenerateStream. The host class provides `stream(inp, context, surface)`
and `_deps.model` (name, tokenizer).
"""

from __future__ import annotations

from services.preprocess.openai.handler import chat_completions, completions


class OpenAIRoutes:
    def _openai_run(self, surface: str):
        def run(inp, context):
            return self.stream(inp, context, surface)  # type: ignore[attr-defined]

        return run

    def _openai_options(self) -> dict:
        model = self._deps.model  # type: ignore[attr-defined]
        return {"model_name": model.name, "token_text": lambda token_id: model.tokenizer.decode([token_id]),
                "token_bytes": model.tokenizer.token_bytes}

    async def CreateChatCompletion(self, request, context):
        async for body in chat_completions(request, context, self._openai_run("chat.completions"),
                                           **self._openai_options()):
            yield body

    async def CreateCompletion(self, request, context):
        async for body in completions(request, context, self._openai_run("completions"), **self._openai_options()):
            yield body
