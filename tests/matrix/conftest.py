"""The request matrix's stack: the real default model (the SmolLM2 GGUF through the fused decoder
stack, what `make run` serves; MSTAR_STEP=auto as in tests/e2e/conftest.py) behind real Envoy,
started once per session by tests/reliability/conftest.py's `started_rig`, with one response
stored first for `previous_response_id`.

Sizes: MSTAR_MATRIX_EXAMPLES schema-drawn bodies per surface (default 40) and covering designs
of strength MSTAR_MATRIX_STRENGTH (default 2: every pair of levels); `make fuzz` runs 500 and 3.
MSTAR_MATRIX_SUMMARY=1 prints the session's figures at the end; they are always written to
build/matrix-summary.json.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from tests.matrix.ledger import Ledger
from tests.matrix.runner import Matrix
from tests.matrix.table import STORED
from tests.reliability.conftest import started_rig

EXAMPLES = int(os.environ.get("MSTAR_MATRIX_EXAMPLES", "40"))
STRENGTH = int(os.environ.get("MSTAR_MATRIX_STRENGTH", "2"))
SUMMARY = os.environ.get("MSTAR_MATRIX_SUMMARY") == "1"
_LEDGERS: list[Ledger] = []  # the session's, for the terminal summary


@pytest.fixture(scope="session")
def matrix(tmp_path_factory) -> Iterator[Matrix]:
    suite_setting = os.environ.get("MSTAR_STEP")
    os.environ["MSTAR_STEP"] = "auto"  # inherited by the services the rig starts (and restarts)
    rig_context = started_rig(tmp_path_factory.mktemp("matrix"), null_engine=False)
    try:
        rig = rig_context.__enter__()
    finally:
        if suite_setting is None:
            os.environ.pop("MSTAR_STEP")
        else:
            os.environ["MSTAR_STEP"] = suite_setting
    ledger = Ledger()
    _LEDGERS.append(ledger)
    try:
        stored = httpx.post(rig.http + "/v1/responses", timeout=120,
                            json={"model": "default", "input": "Hello", "max_output_tokens": 2, "store": True})
        assert stored.status_code == 200, stored.text
        yield Matrix(rig, {STORED: stored.json()["id"]}, ledger)
    finally:
        rig_context.__exit__(None, None, None)
        ledger.write()


def pytest_terminal_summary(terminalreporter) -> None:
    if not (SUMMARY and _LEDGERS):
        return
    ledger = _LEDGERS[0]
    terminalreporter.section("request matrix (build/matrix-summary.json)")
    for line in [ledger.text(), "", ledger.table(), "", "4xx of schema-drawn bodies, by rule:"]:
        terminalreporter.write_line(line)
    for (surface, rule), n in sorted(ledger.refusal_rules.items()):
        terminalreporter.write_line(f"{n:5d}  {surface}  {rule}")
