"""The request matrix (issue 28): everyday parameter combinations on every HTTP surface, through
real Envoy to the real default model, max_tokens 1-4.

Three sources, one set of properties (checks.py): bodies drawn from each surface's published
schema (docs/schemas, schema_bodies.py), the contract's boundary values (edges.py), and a
covering design over the parameters SDKs send together (every pair of levels, with the rules
between them; chat_table.py and its siblings), plus each table's invalid variants. Valid requests get 200 and a well-formed reply (streamed:
well-formed SSE, the surface's terminal event, no error frame); invalid ones the surface's 4xx
naming the field; never a 5xx; no stack process exits; the engine ends no request as an internal
error; KV blocks back to idle after every batch (runner.py).

The NULL engine of tests/reliability/test_fuzz.py never runs the sampler, which is how
`"logprobs": true` without `top_logprobs` crashed the engine unnoticed: these run the real one.
"""

from __future__ import annotations

import pytest

from tests.matrix.conftest import EXAMPLES, STRENGTH
from tests.matrix.covering import covering_rows
from tests.matrix.edges import edge_bodies
from tests.matrix.exchange import Case
from tests.matrix.schema_bodies import SURFACES, draw_bodies, schema_bodies
from tests.matrix.table import OK, negative_rows
from tests.matrix.tables import TABLES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800 if STRENGTH > 2 or EXAMPLES > 50 else 300)]

PATHS = {"chat.completions": "/v1/chat/completions", "completions": "/v1/completions", "messages": "/v1/messages",
         "messages.count_tokens": "/v1/messages/count_tokens", "responses": "/v1/responses",
         "embeddings": "/v1/embeddings", "tokenize": "/tokenize", "detokenize": "/detokenize"}
# Schema-drawn bodies that must succeed, at least: the schema allows bodies the surface's rules
# refuse (a user message with null content, a tool message answering no call), but a generator
# whose every body is refused would test nothing but the error path.
MIN_OK_SHARE = 0.2


@pytest.mark.parametrize("surface", SURFACES)
def test_bodies_drawn_from_the_published_schema(matrix, surface):
    bodies = draw_bodies(schema_bodies(surface, matrix.context), EXAMPLES)
    batch = matrix.run([Case(surface, PATHS[surface], body, "schema") for body in bodies])
    assert batch.clean, batch.text()
    ok = sum(n for (_, _, status), n in batch.shapes.items() if status == 200)
    assert ok >= MIN_OK_SHARE * len(bodies), f"only {ok} of {len(bodies)} drawn bodies served: {batch.text()}"


@pytest.mark.parametrize("surface", sorted(TABLES))
def test_boundary_values_of_the_contract(matrix, surface):
    batch = matrix.run([Case(surface, PATHS[surface], body, "edge") for body in edge_bodies(surface)])
    assert batch.clean, batch.text()


@pytest.mark.parametrize("surface", sorted(TABLES))
def test_parameter_combinations_sdks_send(matrix, surface):
    table = TABLES[surface]
    rows = covering_rows(table.factors, strength=STRENGTH, allowed=table.allowed,
                         constrained=table.constrained).rows
    assert all(table.expect(row) == OK for row in rows), "the table's own rules and its oracle disagree"
    cases = [Case(surface, table.path, table.body(row, matrix.context), "table", OK) for row in rows]
    for row, param in negative_rows(table, rows):
        expect = table.expect(row)
        assert expect.param == param, (row, expect)
        cases.append(Case(surface, table.path, table.body(row, matrix.context), "negative", expect))
    batch = matrix.run(cases)
    assert batch.clean, batch.text()
