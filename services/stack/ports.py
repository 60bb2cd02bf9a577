"""Free TCP ports on 127.0.0.1 (for tests and for running several stacks side by side)."""

from __future__ import annotations

import socket


def free_port() -> int:
    # Bind to port 0 and release: a small race with other processes is acceptable for tests;
    # the services bind without SO_REUSEPORT, so a collision fails loudly rather than sharing.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports_with_stride(count: int, stride: int, taken: set[int], attempts: int = 200) -> int:
    """A base port such that base, base + stride, ... (count ports) are all free and not in
    `taken` (which gets them); for several replicas of one service side by side."""
    for _ in range(attempts):
        base = free_port()
        ports = [base + stride * i for i in range(count)]
        if ports[-1] < 65536 and not taken.intersection(ports) and all(_is_free(p) for p in ports[1:]):
            taken.update(ports)
            return base
    raise OSError(f"no {count} free ports {stride} apart")


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
