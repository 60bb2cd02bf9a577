"""An OpenAI body's output constraint: response_format, vLLM's guided_* extras, or tools.

Each becomes one domain StructuredOutput for the engine, with the renames that make an engine
error (`structured_output.json_schema: does not compile: ...`) name the field the client sent
(`response_format.json_schema.schema`, `guided_json`, `tools[1].function.parameters`).
"""

from __future__ import annotations

from services.common.structured_output import StructuredOutput
from services.preprocess import tools as toolfmt
from services.preprocess.surfaces.openai.body import ChatBody

Renames = tuple[tuple[str, str], ...]
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def output_constraint(body) -> tuple[StructuredOutput | None, Renames]:
    """The constraint of a chat or completions body (ChatBody.check allows at most one kind)."""
    if isinstance(body, ChatBody) and body.uses_tools:
        tools = tools_of(body)
        choice = body.tool_choice_name
        parallel = body.parallel_tool_calls is not False
        return toolfmt.constraint(tools, choice, parallel), toolfmt.field_renames(tools, choice)
    name = body.constraint_field
    if name is None:
        return None, ()
    value = getattr(body, name)
    if name == "response_format":
        if value.type == "json_object" or value.json_schema.schema_ is None:
            return StructuredOutput.any_json_object(), (("structured_output", name),)
        return StructuredOutput.from_json_schema(value.json_schema.schema_), (
            ("structured_output.json_schema", "response_format.json_schema.schema"),
            ("structured_output", name))
    renames = (("structured_output.json_schema", name), ("structured_output.regex", name),
               ("structured_output.choices", name), ("structured_output.grammar", name),
               ("structured_output", name))
    if name == "guided_json":
        return StructuredOutput.from_json_schema(value), renames
    if name == "guided_regex":
        return StructuredOutput.from_regex(value), renames
    if name == "guided_choice":
        return StructuredOutput.from_choices(value), renames
    return StructuredOutput.from_grammar(value), renames


def tools_of(body: ChatBody) -> tuple[toolfmt.Tool, ...]:
    return tuple(toolfmt.Tool(t.function.name, t.function.description or "", t.function.parameters or EMPTY_PARAMETERS)
                 for t in body.tools or ())
