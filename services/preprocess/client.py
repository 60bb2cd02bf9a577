"""Who a call comes from, for fair admission (admission.py): one short key per client.

In order of trust:
1. `x-mstar-client`: the API-key client Envoy's api_key_auth filter names ("client-N") when API keys
   are on. Envoy overwrites what a client sends under that name, or removes it when keys are off.
2. `x-mstar-client-address`: the client address Envoy trusts (the TCP peer, or behind
   `xff_num_trusted_hops` proxies the matching X-Forwarded-For entry); Envoy overwrites it on every
   request (deploy/envoy/envoy.yaml.tmpl).
3. The gRPC peer's host: a client calling preprocess directly, without Envoy.

Both headers are trusted because only Envoy can reach preprocess (it listens on 127.0.0.1 under
`make run`, and on a cluster-internal Service in compose/Kubernetes): do not expose the preprocess
port to clients, or they can claim any identity.
"""

from __future__ import annotations

import re

CLIENT_HEADER = "x-mstar-client"
ADDRESS_HEADER = "x-mstar-client-address"
_MAX_KEY = 128  # a key is a label in memory, never unbounded
_PEER = re.compile(r"^(?:ipv4:|ipv6:)?\[?(?P<host>[^\]]*?)\]?(?::\d+)?$")


def client_key(metadata, peer: str | None) -> str:
    """The admission key of a call from its invocation metadata and `context.peer()`."""
    address = None
    for key, value in metadata or ():
        if key == CLIENT_HEADER and isinstance(value, str) and value:
            return "key:" + value[:_MAX_KEY]
        if key == ADDRESS_HEADER and isinstance(value, str) and value:
            address = value[:_MAX_KEY]
    if address is not None:
        return "addr:" + address
    return "peer:" + peer_host(peer or "unknown")


def peer_host(peer: str) -> str:
    """'ipv4:127.0.0.1:5443' -> '127.0.0.1'; 'ipv6:[::1]:5443' -> '::1'; anything else as it is."""
    match = _PEER.match(peer)
    return (match.group("host") if match else peer)[:_MAX_KEY]


def of_context(context) -> str:
    """The admission key of a grpc.aio call."""
    return client_key(context.invocation_metadata(), context.peer())
