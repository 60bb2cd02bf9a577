"""Which replicas an address list names right now: `--generation` and `--peers` resolved to HOST:PORTs.

A spec is a comma-separated list of HOST:PORT entries. A literal IP names one replica. A DNS name
names every address it resolves to, so one name can stand for many replicas: a Kubernetes
headless Service (`generation:50052` → one A record per ready pod) or a scaled compose service.
The caller re-resolves periodically (pods come and go); IPv4 answers are preferred when a name
has both (`localhost` → 127.0.0.1 only, not also ::1: one server must not count as two).

A failed lookup keeps the name's previous answer: a flaky DNS server must not drop every replica
(a replica that is really gone just fails its health checks and stops taking requests).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# (host, port) -> the IP addresses it names now; raises OSError when the lookup fails.
Lookup = Callable[[str, int], Awaitable[list[str]]]


@dataclass(frozen=True)
class Target:
    host: str
    port: int

    @property
    def is_literal(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True


def address(host: str, port: int) -> str:
    """HOST:PORT as gRPC takes it (IPv6 literals in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse(spec: str) -> list[Target]:
    """'a:1, b:2' → targets; ValueError with the offending entry when one is not HOST:PORT."""
    targets = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{entry!r} is not HOST:PORT")
        targets.append(Target(host, int(port)))
    if not targets:
        raise ValueError("no HOST:PORT given")
    return targets


async def system_lookup(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    v4 = [info[4][0] for info in infos if info[0] == socket.AF_INET]
    v6 = [info[4][0] for info in infos if info[0] == socket.AF_INET6]
    return list(dict.fromkeys(v4 or v6))  # unique, in resolver order


class Resolver:
    def __init__(self, spec: str, lookup: Lookup = system_lookup) -> None:
        self.spec = spec
        self.targets = parse(spec)
        self._lookup = lookup
        self._last: dict[Target, list[str]] = {}

    @property
    def is_static(self) -> bool:
        """Only literal IPs: nothing to re-resolve."""
        return all(t.is_literal for t in self.targets)

    async def resolve(self) -> list[str]:
        """Every replica address the spec names now, sorted, without duplicates."""
        found: set[str] = set()
        for target in self.targets:
            if target.is_literal:
                found.add(address(target.host, target.port))
                continue
            try:
                ips = await self._lookup(target.host, target.port)
                self._last[target] = ips
            except OSError as exc:
                ips = self._last.get(target, [])
                log.warning("replica lookup failed; keeping the last answer",
                            extra={"host": target.host, "error": repr(exc), "kept": len(ips)})
            found.update(address(ip, target.port) for ip in ips)
        return sorted(found)
