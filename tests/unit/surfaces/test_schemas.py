"""docs/schemas/*.json are the request-body schemas the models produce (regenerate with
`python -m services.preprocess.http_schemas`)."""

from __future__ import annotations

import pytest

from services.preprocess import http_schemas as schemas


@pytest.mark.parametrize("name", sorted(schemas.BODIES))
def test_published_schema_is_current(name):
    path = schemas.DOCS / f"{name}.json"
    assert path.read_text() == schemas.schema(name), "regenerate: python -m services.preprocess.http_schemas"
