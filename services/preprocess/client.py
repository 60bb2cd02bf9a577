"""Who a call comes from: its admission key (admission.py: one fair share per client) and its
principal (who owns what it stores: surfaces/responses/store.py).

In order of trust:
1. `x-mstar-client`: an authenticated identity. With API keys on, Envoy's api_key_auth filter sets
   it to the key's stable name, `key-<first 16 hex digits of sha256(key)>`
   (deploy/envoy/render.py `api_key_client`), overwriting what a client sent under that name.
   With keys off Envoy removes it, unless the deployment fronts Envoy with its own
   authentication and says so (`EnvoySettings.trust_client_identity`): then that proxy names the
   principal and must overwrite a client-sent value itself.
2. `x-mstar-client-address`: the client address Envoy trusts (the TCP peer, or behind
   `xff_num_trusted_hops` proxies the matching X-Forwarded-For entry); Envoy overwrites it on every
   request (deploy/envoy/envoy.yaml.tmpl).
3. The gRPC peer's host: a client calling preprocess directly, without Envoy.

Only (1) is a principal: an address says where a request came from, not who sent it (clients
behind one NAT share it, one client's changes), so without an identity every call is the
anonymous principal "" and stored data is shared, as on any server without authentication.

Both headers are trusted because only Envoy can reach preprocess (it listens on 127.0.0.1 under
`make run`, and on a cluster-internal Service in compose/Kubernetes): do not expose the preprocess
port to clients, or they can claim any identity.
"""

from __future__ import annotations

import hashlib
import re

CLIENT_HEADER = "x-mstar-client"
ADDRESS_HEADER = "x-mstar-client-address"
ANONYMOUS = ""
_IDENTITY = "key:"
_DIGEST = "sha256:"
_MAX_KEY = 128  # a key is a label in memory, never unbounded
_PEER = re.compile(r"^(?:ipv4:|ipv6:)?\[?(?P<host>[^\]]*?)\]?(?::\d+)?$")


def client_key(metadata, peer: str | None) -> str:
    """The admission key of a call from its invocation metadata and `context.peer()`."""
    address = None
    for key, value in metadata or ():
        if key == CLIENT_HEADER and isinstance(value, str) and value:
            return _IDENTITY + _bounded(value)
        if key == ADDRESS_HEADER and isinstance(value, str) and value:
            address = value[:_MAX_KEY]
    if address is not None:
        return "addr:" + address
    return "peer:" + peer_host(peer or "unknown")


def principal(admission_key: str) -> str:
    """The principal of a call with this admission key: its authenticated identity, else ANONYMOUS."""
    return admission_key.removeprefix(_IDENTITY) if admission_key.startswith(_IDENTITY) else ANONYMOUS


def _bounded(identity: str) -> str:
    """The identity itself, or a digest of one too long to keep: never a prefix, which two
    identities could share (and then each other's stored data). An identity that looks like a
    digest is digested too, so none can pose as another's."""
    if len(identity) <= _MAX_KEY and not identity.startswith(_DIGEST):
        return identity
    return _DIGEST + hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()


def peer_host(peer: str) -> str:
    """'ipv4:127.0.0.1:5443' -> '127.0.0.1'; 'ipv6:[::1]:5443' -> '::1'; anything else as it is."""
    match = _PEER.match(peer)
    return (match.group("host") if match else peer)[:_MAX_KEY]


def of_context(context) -> str:
    """The admission key of a grpc.aio call."""
    return client_key(context.invocation_metadata(), context.peer())
