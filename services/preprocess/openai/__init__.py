"""OpenAI-compatible HTTP bodies ⇄ mstar requests, for the CreateChatCompletion and
CreateCompletion RPCs (Envoy passes the raw JSON body in as google.api.HttpBody and streams the
HttpBody responses out as SSE). See handler.py for the wiring and docs/http.md for behaviour."""

from services.preprocess.openai.handler import chat_completions, completions

__all__ = ["chat_completions", "completions"]
