"""Every curl example in docs/http.md works verbatim against the real stack (only the address is
pointed at the test stack, and curl is made to fail on an HTTP error status)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

DOC = Path(__file__).resolve().parents[2] / "docs" / "http.md"
# Fail on HTTP >= 400 (with the body shown), quiet progress; everything else is the doc's own.
CURL = 'curl() { command curl --fail-with-body -sS --max-time 120 "$@"; }\n'


def examples() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    return [b for b in blocks if re.search(r"^\s*(\S+=\$\()?curl ", b, re.M)]


def test_the_doc_has_examples_for_every_route():
    text = "\n".join(examples())
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                  "/v1/responses", "/v1/embeddings", "/v1/models", "/v1/generate", "/v1/generate_stream", "/v1/session",
                  ":append", ":cancel", "/cancel", "/tokenize", "/detokenize", "/version", "/health"):
        assert route in text, route
    assert "curl -X DELETE" in text


@pytest.mark.parametrize("index", range(len(examples())))
def test_curl_example_runs(stack, index):
    script = examples()[index].replace("localhost:8080", f"{stack.config.host}:{stack.config.http_port}")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", CURL + script], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{script}\n--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-2000:]}"
