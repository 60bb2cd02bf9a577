"""Where mstar keeps state between runs (the stored /v1/responses): MSTAR_DATA_DIR, else
~/.local/share/mstar. `make run` passes it to preprocess as --data-dir."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    return Path(os.environ.get("MSTAR_DATA_DIR") or Path.home() / ".local" / "share" / "mstar")
