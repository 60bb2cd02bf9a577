"""The published JSON schema of every HTTP request body, generated from the pydantic models.

    python -m services.preprocess.http_schemas           # rewrite docs/schemas/*.json

docs/http.md links them; tests/unit/surfaces/test_schemas.py fails when a committed file differs
from what the models (and the contract's declared bounds they carry) produce.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from services.preprocess.surfaces.anthropic.body import CountTokensBody, MessagesBody
from services.preprocess.surfaces.openai.body import ChatBody, CompletionBody
from services.preprocess.surfaces.openai.embeddings import EmbeddingBody
from services.preprocess.surfaces.responses.body import ResponsesBody
from services.preprocess.surfaces.vllm.body import DetokenizeBody, TokenizeBody

DOCS = Path(__file__).resolve().parents[2] / "docs" / "schemas"
BODIES = {
    "chat.completions": ChatBody,
    "completions": CompletionBody,
    "embeddings": EmbeddingBody,
    "messages": MessagesBody,
    "messages.count_tokens": CountTokensBody,
    "responses": ResponsesBody,
    "tokenize": TokenizeBody,
    "detokenize": DetokenizeBody,
}


def schema(name: str) -> str:
    return json.dumps(BODIES[name].model_json_schema(), indent=2, sort_keys=True) + "\n"


def write(directory: Path = DOCS) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in BODIES:
        path = directory / f"{name}.json"
        path.write_text(schema(name), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS):
        print(path)
