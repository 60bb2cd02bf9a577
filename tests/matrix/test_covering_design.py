"""The covering design the request matrix is built on (tests/matrix/covering.py): every allowed
pair (triple) is in some row, no row breaks a rule, the table is small and the same every run."""

from __future__ import annotations

import itertools

import pytest

from tests.matrix.covering import ABSENT, Factor, covering_rows, missing_tuples
from tests.matrix.tables import TABLES


def _binary(k: int) -> list[Factor]:
    return [Factor(f"f{i}", (False, True)) for i in range(k)]


@pytest.mark.parametrize("strength", [2, 3])
def test_every_tuple_is_covered_and_the_design_is_far_smaller_than_the_product(strength):
    factors = [Factor("a", (1, 2, 3)), Factor("b", ("x", "y")), Factor("c", (ABSENT, 0, 5, 9)),
               Factor("d", ({"k": 1}, [1, 2])), *(_binary(6))]
    design = covering_rows(factors, strength=strength)
    assert not missing_tuples(design.rows, factors, strength, lambda row: True)
    assert design.impossible == 0
    product = 1
    for f in factors:
        product *= len(f.levels)
    assert len(design.rows) <= (30 if strength == 2 else 110) < product


def test_ten_binary_factors_pairwise_fit_in_a_dozen_rows():
    factors = _binary(10)
    rows = covering_rows(factors).rows
    assert len(rows) <= 12  # the optimum is 6; greedy stays close
    assert not missing_tuples(rows, factors, 2, lambda row: True)


def test_constraints_hold_in_every_row_and_forbidden_pairs_are_not_counted():
    factors = [Factor("tools", (ABSENT, "one")), Factor("choice", (ABSENT, "auto", "required")),
               Factor("format", (ABSENT, "json")), *(_binary(3))]

    def allowed(row):
        if row.get("choice") == "required" and row.get("tools", "one") is ABSENT:
            return False
        return not (row.get("format") == "json" and row.get("tools") == "one")

    design = covering_rows(factors, allowed=allowed)
    assert all(allowed(row) for row in design.rows)
    assert not missing_tuples(design.rows, factors, 2, allowed)
    assert {(r["tools"], r["choice"]) for r in design.rows} >= {("one", "required"), ("one", "auto")}


def test_a_tuple_no_allowed_row_can_hold_is_dropped_and_counted():
    factors = [Factor("a", (0, 1)), Factor("b", (0, 1)), Factor("c", (0, 1))]

    def allowed(row):  # a=1 and b=1 each force c=0 and c=1: (a=1, b=1) is a dead end
        if row.get("a") == 1 and row.get("c", 0) != 0:
            return False
        return not (row.get("b") == 1 and row.get("c", 1) != 1)

    design = covering_rows(factors, allowed=allowed)
    assert all(allowed(row) for row in design.rows)
    assert design.impossible >= 1
    held = {(r["a"], r["b"]) for r in design.rows}
    assert (1, 1) not in held and {(0, 0), (0, 1), (1, 0)} <= held


def test_the_same_seed_gives_the_same_rows():
    factors = _binary(8)
    assert covering_rows(factors, seed=3).rows == covering_rows(factors, seed=3).rows


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_surface_tables_cover_their_pairs(name):
    table = TABLES[name]
    design = covering_rows(table.factors, strength=2, allowed=table.allowed, constrained=table.constrained)
    assert not missing_tuples(design.rows, table.factors, 2, table.allowed)  # checked over every factor
    assert all(table.allowed(row) for row in design.rows)
    assert 10 <= len(design.rows) <= 60, len(design.rows)
    for row, (overrides, field) in itertools.product(design.rows[:2], table.negatives):
        assert table.expect({**row, **overrides}).param == field
