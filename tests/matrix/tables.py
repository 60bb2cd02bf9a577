"""The combinatorial tables of the request matrix, by surface (docs/schemas name)."""

from __future__ import annotations

from tests.matrix import chat_table, completions_table, messages_table, responses_table
from tests.matrix.table import Table

TABLES: dict[str, Table] = {t.TABLE.surface: t.TABLE for t in (chat_table, completions_table, messages_table,
                                                                responses_table)}
