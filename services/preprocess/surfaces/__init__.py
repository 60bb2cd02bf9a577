"""The HTTP API surfaces: thin adapters on the domain, each `parse → spec, events → render`.

    surfaces/http.py        what every surface shares: the request/frame types, body parsing
                            (pydantic, unknown field = 400), SSE framing
    surfaces/fields.py      sampling fields as pydantic types, from the one field table
    surfaces/openai/        POST /v1/chat/completions, /v1/completions; GET /v1/models[/{id}]
    surfaces/anthropic/     POST /v1/messages, /v1/messages/count_tokens
    surfaces/responses/     POST /v1/responses; GET, DELETE /v1/responses/{id}; .../cancel
    surfaces/vllm/          POST /tokenize, /detokenize; GET /version

A surface endpoint is `async def endpoint(req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]`:
it parses the body into a domain `RequestSpec`, runs it through the RequestRunner
(services/preprocess/runner.py) and renders the domain events in its API's shape. An MstarError
raised before the first frame becomes a real HTTP status (the servicer aborts the call; Envoy's
per-route Lua gives the body the API's error shape); after the first frame the surface reports
failures in-band, in its own error-event shape. Surfaces never import each other or the servicer
(tests/unit/surfaces/test_layering.py), never touch protobuf, and the servicer
(services/preprocess/http_routes.py) is the only place that turns them into RPCs.
"""
