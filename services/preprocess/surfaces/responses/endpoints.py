"""`/v1/responses`: create (streamed or not), retrieve, delete, cancel.

    api = ResponsesApi(store)
    api.create(req, runs)    POST   /v1/responses
    api.retrieve(req, runs)  GET    /v1/responses/{response_id}
    api.delete(req, runs)    DELETE /v1/responses/{response_id}
    api.cancel(req, runs)    POST   /v1/responses/{response_id}/cancel

`store: true` (the default, as at OpenAI) writes the response when it is admitted (in_progress)
and again when it ends, BEFORE the terminal event goes out, so a client that saw
`response.completed` can continue with `previous_response_id` at once. `store: false` writes
nothing. A conversation continues from the stored one: its messages, then the new `input`;
`instructions` apply to the request that gives them only.

Cancel: a response still running in this process is cancelled (its stream ends with status
`cancelled`); one that already ended is returned as it is (cancelling is idempotent).

Ownership: a response belongs to the principal of the call that created it (client.py
`principal`: the API key's name, or the identity a fronting proxy set; else anonymous). Retrieve,
delete, cancel and `previous_response_id` see only the caller's own responses: another's is the
same 404 as an id that never existed, so ids cannot be probed.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

from services.common import errors
from services.common.metrics import timing_headers
from services.common.structured_output import StructuredOutput
from services.preprocess import client
from services.preprocess.chat_template import ChatImage, ChatMessage
from services.preprocess.images import ImageError, image_url_bytes
from services.preprocess.request import Accepted, Complete, Failed, RequestSpec
from services.preprocess.runner import RunScope
from services.preprocess.surfaces import fields
from services.preprocess.surfaces.http import Frame, HttpRequest, json_frame, parse
from services.preprocess.surfaces.responses.body import ROLES, NamedFunction, ResponsesBody
from services.preprocess.surfaces.responses.render import ResponseState, ResponseStream
from services.preprocess.surfaces.responses.store import ResponseStore, StoredResponse
from services.preprocess.tools import END, CallStream, Tool, ToolCall, constraint, field_renames

SURFACE = "responses"
PREFIX = "resp_"
_CANCEL_WAIT_S = 5.0


class ResponsesApi:
    def __init__(self, store: ResponseStore) -> None:
        self.store = store
        # Responses running in this process, by id: what cancel reaches and waits for, and whose.
        self._live: dict[str, tuple[ResponseState, asyncio.Event, str]] = {}

    # ---- POST /v1/responses

    async def create(self, req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
        body = parse(ResponsesBody, req)
        owner = client.principal(runs.client)
        history, called = await self._history(body.previous_response_id, owner)
        conversation = history + _turns(body, called)
        messages = [("system", body.instructions)] if body.instructions else []
        tools = _tools(body)
        constraint, renames = _constraint(body, tools)
        spec = RequestSpec(
            model=body.model,
            messages=tuple(_message(turn) for turn in messages + conversation),
            tools=tools,
            sampling=replace(fields.sampling_of(body, SURFACE), structured_output=constraint),
            field_renames=renames,
            upload_bytes=len(req.body),
            surface=SURFACE,
        )
        stream = runs.run(spec)
        async with aclosing(stream):
            accepted: Accepted = await anext(stream)  # validation and admission: a real HTTP status
            state = ResponseState(
                id=PREFIX + accepted.request_id, item_id="msg_" + accepted.request_id,
                created_at=int(time.time()), model=body.model or runs.runner.model.name,
                instructions=body.instructions, max_output_tokens=body.max_output_tokens,
                temperature=body.temperature, top_p=body.top_p, store=body.store,
                previous_response_id=body.previous_response_id, metadata=dict(body.metadata or {}),
                prompt_tokens=accepted.prompt_tokens,
                tools=[t.model_dump(exclude_none=True) for t in body.tools or ()],
                tool_choice=body.tool_choice.model_dump() if isinstance(body.tool_choice, NamedFunction)
                else (body.tool_choice or ("auto" if body.tools else "none")),
                parallel_tool_calls=bool(body.tools) and body.parallel_tool_calls is not False,
                text_format=body.text.format.model_dump(by_alias=True, exclude_none=True)
                if body.text is not None and body.text.format is not None else {"type": "text"},
                parser=CallStream() if body.uses_tools else None,
            )
            ended = asyncio.Event()
            self._live[state.id] = (state, ended, owner)
            try:
                if body.store:
                    await self._save(state, conversation, owner)
                out = ResponseStream(state, runs.runner.deps.keepalive_s)
                if body.stream:
                    for frame in out.start():
                        yield frame
                async for event in stream:
                    if not isinstance(event, Complete | Failed):
                        frames = out.on_event(event)  # text, calls; keep-alives to fill a silence
                        if body.stream:
                            for frame in frames:
                                yield frame
                    else:
                        if isinstance(event, Failed):
                            state.fail(event.error)
                        else:
                            state.finish(event)
                        if body.store:
                            await self._save(state, conversation, owner)
                        if body.stream:
                            for frame in out.end():
                                yield frame
                        elif isinstance(event, Failed):
                            raise event.error  # nothing sent yet: a real HTTP status
                        else:
                            yield json_frame(state.object(), timing_headers(event))
                        return
            finally:
                ended.set()
                self._live.pop(state.id, None)
                if body.store and state.status == "in_progress":
                    # The client left (or the call was torn down): record it, without blocking.
                    state.status = "cancelled"
                    asyncio.ensure_future(self._save(state, conversation, owner))

    async def _history(self, previous_id: str | None, owner: str) -> tuple[list[tuple], set[str]]:
        """The stored conversation `owner` continues, and the call ids its last response made."""
        if previous_id is None:
            return [], set()
        stored = await self.store.get(previous_id, owner)
        if stored is None:
            err = errors.not_found("previous response not found (expired, deleted or stored with store: false)",
                                   reason="PREVIOUS_RESPONSE_NOT_FOUND")
            err.metadata["field"] = "previous_response_id"
            raise err
        if stored.status not in ("completed", "incomplete"):
            raise errors.invalid_argument("previous_response_id", f"the previous response is {stored.status}")
        called = {item.get("call_id") for item in stored.response.get("output", ())
                  if item.get("type") == "function_call"}
        return list(stored.conversation), called

    async def _save(self, state: ResponseState, conversation: list[tuple], owner: str) -> None:
        full = conversation + [("assistant", state.text)] if state.status != "in_progress" else conversation
        await self.store.put(StoredResponse(state.id, state.created_at, state.status, state.object(), full, owner))

    # ---- GET / DELETE /v1/responses/{id}, POST .../cancel

    def _id(self, req: HttpRequest) -> str:
        response_id = req.params.get("response_id", "")  # its declared bounds were checked at the boundary
        if not response_id:
            raise errors.invalid_argument("response_id", "required")
        return response_id

    async def _stored(self, response_id: str, owner: str) -> StoredResponse:
        stored = await self.store.get(response_id, owner)
        if stored is None:
            raise _not_found()
        return stored

    async def retrieve(self, req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
        yield json_frame((await self._stored(self._id(req), client.principal(runs.client))).response)

    async def delete(self, req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
        response_id = self._id(req)
        if not await self.store.delete(response_id, client.principal(runs.client)):
            raise _not_found()
        yield json_frame({"id": response_id, "object": "response", "deleted": True})

    async def cancel(self, req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
        response_id = self._id(req)
        owner = client.principal(runs.client)
        live = self._live.get(response_id)
        if live is not None and live[2] == owner:  # another's running response: as absent as none
            state, ended, _ = live
            runs.runner.cancel(response_id.removeprefix(PREFIX))
            try:
                async with asyncio.timeout(_CANCEL_WAIT_S):
                    await ended.wait()
            except TimeoutError:
                pass
            yield json_frame(state.object())
            return
        yield json_frame((await self._stored(response_id, owner)).response)


def _not_found() -> errors.MstarError:
    """The one answer for an id that is not the caller's: never stored, expired, deleted or another's."""
    return errors.not_found("response not found", reason="RESPONSE_NOT_FOUND")


def _message(turn: tuple) -> ChatMessage:
    """A stored or new turn: (role, text), or (role, text, [[offset, base64 image], ...]) for a
    message with images (kept with the owner's conversation, so a follow-up sees them too)."""
    role, text, *rest = turn
    images = tuple(ChatImage(offset, base64.b64decode(data), "previous_response_id") for offset, data in
                   (rest[0] if rest else ()))
    return ChatMessage(role, text, images=images)


def _message_turn(item, i: int) -> tuple:
    texts, images = [], []
    for j, part in enumerate(item.content):
        if part.type != "input_image":
            texts.append(part.text)
            continue
        where = f"input[{i}].content[{j}].image_url"
        try:
            data = image_url_bytes(part.image_url)
        except ImageError as exc:
            raise errors.invalid_argument(where, str(exc), reason="INVALID_IMAGE") from None
        images.append([sum(map(len, texts)), base64.b64encode(data).decode()])
    text = "".join(texts)
    return (ROLES[item.role], text, images) if images else (ROLES[item.role], text)


def _turns(body: ResponsesBody, called: set[str]) -> list[tuple]:
    """The input items as (role, text) turns (and their images: _message). Calls are kept as the
    text the model writes (tools.py), results as tool turns."""
    turns: list[tuple] = []
    called = set(called)
    for i, item in enumerate(body.input):
        if item.type == "message":
            turns.append(_message_turn(item, i))
        elif item.type == "function_call":
            called.add(item.call_id)
            text = ToolCall(item.call_id, item.name, item.arguments).text()
            if turns and turns[-1][0] == "assistant" and turns[-1][1].endswith(END):
                turns[-1] = ("assistant", turns[-1][1] + "\n" + text, *turns[-1][2:])
            else:
                turns.append(("assistant", text))
        else:
            if item.call_id not in called:
                raise errors.invalid_argument(f"input[{i}].call_id",
                                              "matches no function_call before it (in input or the previous response)")
            turns.append(("tool", item.output))
    return turns


def _tools(body: ResponsesBody) -> tuple[Tool, ...]:
    if not body.uses_tools:
        return ()
    return tuple(Tool(t.name, t.description or "", t.parameters or {"type": "object", "properties": {}})
                 for t in body.tools)


def _constraint(body: ResponsesBody, tools: tuple[Tool, ...]):
    if tools:
        choice = body.tool_choice_name
        return (constraint(tools, choice, body.parallel_tool_calls is not False),
                field_renames(tools, choice, "tools", "parameters"))
    fmt = body.text_format
    if fmt is None:
        return None, ()
    renames = (("structured_output.json_schema", "text.format.schema"), ("structured_output", "text.format"))
    if fmt.type == "json_object" or fmt.schema_ is None:
        return StructuredOutput.any_json_object(), renames
    return StructuredOutput.from_json_schema(fmt.schema_), renames
