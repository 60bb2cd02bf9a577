"""One RPC call as the request runner sees it: whose it is and when it must end.

    scope = call.scope_of(runner, context)   # closes with the call, and at its deadline

The deadline is the client's grpc-timeout, which reaches us through Envoy unchanged on every
route (deploy/envoy/envoy.yaml.tmpl: the plain gRPC route must not set max_stream_duration, or
Envoy rewrites the header to that). Ending the requests at the deadline ourselves means a cancel
that never arrives cannot hold a slot and KV until max_tokens.
"""

from __future__ import annotations

from services.preprocess import client
from services.preprocess.runner import RequestRunner, RunScope


def scope_of(runner: RequestRunner, context) -> RunScope:
    """A RunScope for this call: its client's fair share of admission, closed when the call ends
    (the done-callback: a handler torn down without unwinding through our code) and at its
    deadline (whatever else happens)."""
    scope = runner.scope(client.of_context(context))
    context.add_done_callback(lambda _ctx: scope.close())
    scope.close_after(context.time_remaining())
    return scope
