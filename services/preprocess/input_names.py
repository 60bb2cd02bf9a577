"""How each API surface names the input fields of a request, so an error about the prompt names
the field the client actually sent (`prompt`, `messages`, `input`), not the native
`input.prompt_parts[0].token_ids`. The sampling fields have their own table
(services/preprocess/surfaces/sampling_names.py)."""

from __future__ import annotations

from dataclasses import dataclass

from services.preprocess.surfaces.sampling_names import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    RESPONSES,
    TOKENIZE,
)


@dataclass(frozen=True)
class InputNames:
    text: str
    messages: str
    parts: str
    modalities: str
    flat_parts: bool = False  # the parts are one bare token list (completions' `prompt: [ids]`)

    def part(self, i: int) -> str:
        return self.parts if self.flat_parts else f"{self.parts}[{i}]"

    def part_field(self, i: int, name: str) -> str:
        return self.parts if self.flat_parts else f"{self.parts}[{i}].{name}"


def _native(root: str) -> InputNames:
    return InputNames(f"{root}.text", f"{root}.messages", f"{root}.prompt_parts", f"{root}.input_modalities")


NATIVE = _native("input")
_BY_SURFACE = {
    "Session": _native("start"),
    CHAT: InputNames("messages", "messages", "messages", "messages"),
    COMPLETIONS: InputNames("prompt", "prompt", "prompt", "prompt", flat_parts=True),
    MESSAGES: InputNames("messages", "messages", "messages", "messages"),
    RESPONSES: InputNames("input", "input", "input", "input"),
    TOKENIZE: InputNames("prompt", "messages", "prompt", "prompt"),
    EMBEDDINGS: InputNames("input", "input", "input", "input", flat_parts=True),
}


def input_names(surface: str) -> InputNames:
    return _BY_SURFACE.get(surface, NATIVE)
