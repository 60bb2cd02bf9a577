"""Free TCP ports on 127.0.0.1 (for tests and for running several stacks side by side)."""

from __future__ import annotations

import socket


def free_port() -> int:
    # Bind to port 0 and release: a small race with other processes is acceptable for tests;
    # the services bind without SO_REUSEPORT, so a collision fails loudly rather than sharing.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
