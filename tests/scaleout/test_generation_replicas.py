"""Several real generation processes (tiny random-weight model) behind the preprocess replicas,
through real Envoy: prefix affinity, load spreading, kill -9 and SIGTERM of a replica mid-run,
and a replica that rejoins. Slow (each test starts its own stack: ~20 s on 2 cores)."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import shared_prefix
from mstar.v1 import messages_pb2 as pb
from streams import append, prompts_homed_on, start_stream, wait_all

pytestmark = pytest.mark.slow


def test_equal_prefixes_share_a_replica_and_its_prefix_cache(scaleout):
    rig = scaleout(generation=3, preprocess=2)
    prefix = shared_prefix(1)
    first = rig.generate(prefix + [501, 502, 503])
    again = rig.generate(prefix + [601, 602])  # likely through the other preprocess replica
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert int(first.json()["complete"]["usage"]["cached_prompt_tokens"]) == 0
    assert int(again.json()["complete"]["usage"]["cached_prompt_tokens"]) >= len(prefix)
    before = rig.routed()
    for tag in range(2, 20):
        assert rig.generate(shared_prefix(tag)).status_code == 200
    spread = {a: rig.routed()[a] - before[a] for a in before}
    assert all(n > 0 for n in spread.values()), spread  # different prefixes use every replica


def test_a_saturated_replica_overflows_to_another(scaleout):
    rig = scaleout(generation=2, preprocess=1, preprocess_args=("--routing-load-margin", "2"))
    prefix = shared_prefix(3)
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: rig.generate(prefix + [700 + i], max_tokens=400), range(8)))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
    overflow = sum(rig.routed("overflow").values())
    routed = rig.routed()
    assert overflow >= 1 and all(n > 0 for n in routed.values()), (routed, overflow)


def test_kill_9_of_a_replica_mid_run(scaleout, figures):
    rig = scaleout(generation=2, preprocess=1)
    envoy = rig.stack.grpc_target
    victim, survivor = rig.stack.generation_targets
    on_victim = prompts_homed_on(victim, rig.stack.generation_targets, 6)
    on_survivor = prompts_homed_on(survivor, rig.stack.generation_targets, 3)
    # Touched: already streaming tokens. Untouched: input still open, nothing generated yet.
    touched = [start_stream(envoy, ids, max_tokens=600) for ids in on_victim[:3] + on_survivor]
    untouched = [start_stream(envoy, ids, max_tokens=8, request_id=f"untouched-{i}", open_input=True)
                 for i, ids in enumerate(on_victim[3:])]
    deadline = time.monotonic() + 30
    while any(s.chunks == 0 for s in touched) or not all(s.accepted.is_set() for s in untouched):
        assert time.monotonic() < deadline, "streams did not start"
        time.sleep(0.01)
    in_flight = rig.in_flight()
    assert in_flight[victim] == 6 and in_flight[survivor] == 3, in_flight

    rig.kill("generation")
    killed = time.monotonic()
    served = rig.generate(on_victim[0], max_tokens=2, timeout_s=10)
    new_request_s = time.monotonic() - killed
    assert served.status_code == 200 and new_request_s < 2.0, (served.text, new_request_s)
    for s in untouched:  # moved to the survivor with their prompt; the rest of the input follows
        append(envoy, s.request_id, [42, 43], end=True)
    assert not wait_all(touched + untouched, timeout_s=60), "a request hangs"

    for s in untouched:
        done = s.terminal.complete
        assert done.finish_reason == pb.FINISH_REASON_LENGTH and done.usage.prompt_tokens == 6 * 16 + 2
    for s in touched[:3]:  # had tokens from the victim: the retry rule forbids a silent rerun
        assert s.terminal.failed.code == 14 and s.terminal.failed.http_status == 503
    for s in touched[3:]:  # untouched by the kill: every token
        assert s.terminal.complete.usage.completion_tokens == 600
    failovers = {outcome: rig.preprocess_total("mstar_preprocess_replica_failovers_total", replica=victim,
                                               outcome=outcome) for outcome in ("resubmitted", "failed")}
    # The new request sent right after the kill may itself have reached the victim before its
    # stream was seen broken: then it moved too (that is how it was served).
    assert failovers["resubmitted"] in (len(untouched), len(untouched) + 1) and failovers["failed"] == 3, failovers
    figures["scaleout_kill9_new_request_s"] = round(new_request_s, 3)

    rig.restart("generation")
    rejoin_s = rig.wait_serving(victim)
    before = rig.routed()[victim]
    assert rig.generate(on_victim[1], max_tokens=2).status_code == 200
    assert rig.routed()[victim] == before + 1  # its prompts go home again
    figures["scaleout_rejoin_s"] = round(rejoin_s, 3)


def test_sigterm_drain_of_a_replica_loses_nothing(scaleout, figures):
    rig = scaleout(generation=2, preprocess=1, generation_args=("--grace-s", "4"))
    envoy = rig.stack.grpc_target
    victim, survivor = rig.stack.generation_targets
    on_victim = prompts_homed_on(victim, rig.stack.generation_targets, 8)
    running = [start_stream(envoy, ids, max_tokens=150) for ids in on_victim[:5]]
    waiting = [start_stream(envoy, ids, max_tokens=8, request_id=f"open-{i}", open_input=True)
               for i, ids in enumerate(on_victim[5:])]
    deadline = time.monotonic() + 30
    while any(s.chunks == 0 for s in running) or not all(s.accepted.is_set() for s in waiting):
        assert time.monotonic() < deadline, "streams did not start"
        time.sleep(0.01)

    rig.kill("generation", signal.SIGTERM)
    signalled = time.monotonic()
    during = [rig.generate(ids, max_tokens=4) for ids in on_victim[:3]]  # new work while it drains
    assert all(r.status_code == 200 for r in during), [r.text for r in during]
    assert rig.wait_exit("generation") == 0
    figures["scaleout_generation_drain_exit_s"] = round(time.monotonic() - signalled, 3)
    for s in waiting:  # still open when the grace ran out: moved, then their input ends
        append(envoy, s.request_id, [7], end=True)
    assert not wait_all(running + waiting, timeout_s=60), "a request hangs"
    for s in running + waiting:
        assert s.terminal is not None and s.terminal.HasField("complete"), (s.request_id, s.terminal, s.error)
    assert all(s.terminal.complete.usage.completion_tokens == 150 for s in running)
    assert rig.routed("failover")[survivor] == len(waiting)
