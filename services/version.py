"""mstar's release version (pyproject.toml's; tests/unit/surfaces keeps the two equal), served
at GET /version."""

VERSION = "0.1.0"
