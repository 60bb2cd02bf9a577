"""ReplicaPool against several in-process contract fakes: affinity, load spreading, failover by the
contract's retry rule, a replica that leaves, dies and comes back (services/preprocess/replica_pool.py)."""

from __future__ import annotations

import asyncio

import grpc
from fake_generation import FakeGeneration, start_fake

from services.common.errors import Code
from services.common.finish import FinishReason
from services.preprocess.backend_events import BackendFailed, BackendFinished, TokenStep
from services.preprocess.replica_pool import PoolConfig, ReplicaPool
from services.preprocess.request import Sampling
from services.preprocess.resolver import Resolver
from services.preprocess.routing import RoutingConfig

ROUTING = RoutingConfig(block_size=4, affinity_blocks=2, load_margin=2.0, kv_weight=0.0)
SAMPLING = Sampling(temperature=0.0)


class Fakes:
    """N fake generation servers on their own ports, restartable on the same port."""

    def __init__(self) -> None:
        self.servers: dict[str, grpc.aio.Server] = {}
        self.fakes: dict[str, FakeGeneration] = {}

    async def start(self, n: int, step_s: float = 0.002) -> list[str]:
        for _ in range(n):
            server, fake, port = await start_fake(step_s=step_s)
            address = f"127.0.0.1:{port}"
            self.servers[address], self.fakes[address] = server, fake
        return list(self.servers)

    async def kill(self, address: str) -> None:
        await self.servers.pop(address).stop(None)  # every stream on it breaks at once

    async def restart(self, address: str) -> FakeGeneration:
        server, fake, _ = await start_fake(port=int(address.rsplit(":", 1)[1]))
        self.servers[address], self.fakes[address] = server, fake
        return fake

    def owner(self, request) -> str:
        return request.tried[-1]

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop(None) for s in self.servers.values()))


async def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def make_pool(addresses: list[str], **config) -> ReplicaPool:
    config.setdefault("routing", ROUTING)
    config.setdefault("heartbeat_s", 0.05)
    config.setdefault("resolve_interval_s", 0.05)
    pool = ReplicaPool(Resolver(",".join(addresses)), PoolConfig(max_backoff_s=0.2, **config))
    pool.start()
    await wait_for(lambda: len(pool.replicas) == len(addresses) and all(r.serving for r in pool.replicas.values()))
    return pool


async def events_of(request, timeout_s: float = 10.0) -> list:
    """Every event until the terminal one."""
    events = []
    while not events or not isinstance(events[-1], BackendFinished | BackendFailed):
        events.append(await asyncio.wait_for(request.queue.get(), timeout_s))
    return events


def submit(pool, rid: str, prompt: list[int], max_tokens: int = 4, input_open: bool = False):
    return pool.submit(rid, prompt, SAMPLING, max_tokens, input_open)


def test_equal_prefixes_share_a_replica_and_different_ones_spread(loop):
    async def run():
        fakes = Fakes()
        pool = await make_pool(await fakes.start(3))
        try:
            system = [7, 7, 7, 7, 8, 8, 8, 8]  # two full blocks: the affinity key
            same = []
            for i in range(6):  # one after the other: no load to bound
                same.append(submit(pool, f"s{i}", system + [100 + i] * 5))
                await events_of(same[-1])
            others = [submit(pool, f"o{i}", [i] * 8) for i in range(30)]
            for r in others:
                await events_of(r)
            assert len({r.tried[0] for r in same}) == 1
            assert len({r.tried[0] for r in others}) == 3
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())


def test_a_saturated_replica_overflows_to_the_next_one(loop):
    async def run():
        fakes = Fakes()
        pool = await make_pool(await fakes.start(3))
        try:
            prompt = [5] * 8
            # Open input: the requests stay in flight (no token) until their input ends.
            held = [submit(pool, f"h{i}", prompt, input_open=True) for i in range(8)]
            placed = [r.tried[0] for r in held]
            first = placed[0]
            assert placed[:3] == [first] * 3  # within the margin (2) affinity wins
            assert len(set(placed)) >= 2 and placed.count(first) < 8
            for r in held:
                r.append([], end=True)
            for r in held:
                assert isinstance((await events_of(r))[-1], BackendFinished)
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())


def test_kill_moves_untouched_requests_with_every_prompt_token_and_fails_the_others(loop):
    async def run():
        fakes = Fakes()
        addresses = await fakes.start(2)
        pool = await make_pool(addresses)
        try:
            victim = addresses[0]
            fakes.fakes[addresses[1]].paused = False
            # Untouched: input still open, so the engine has produced nothing for it.
            untouched = [submit(pool, f"u{i}", [i] * 8, input_open=True) for i in range(20)]
            untouched = [r for r in untouched if r.tried[0] == victim][:3]
            assert untouched, "rendezvous put nothing on the victim"
            for r in untouched:
                r.append([41, 42], end=False)  # part of the input arrives before the crash
            # Touched: has received tokens from the victim already.
            touched = next(r for r in (submit(pool, f"t{i}", [50 + i] * 8, max_tokens=10_000) for i in range(20))
                           if r.tried[0] == victim)
            await wait_for(lambda: touched.tokens_received)
            await fakes.kill(victim)
            failed = (await events_of(touched))[-1]
            assert isinstance(failed, BackendFailed) and failed.error.code == Code.UNAVAILABLE
            for r in untouched:
                await wait_for(lambda r=r: r.tried[-1] == addresses[1])
                r.append([43], end=True)
                events = await events_of(r, timeout_s=5)
                assert isinstance(events[-1], BackendFinished)
                resubmitted = fakes.fakes[addresses[1]].prompts[r.key]
                assert resubmitted == [int(r.request_id[1:])] * 8 + [41, 42]  # everything sent before the crash
                assert [e.token_id for e in events if isinstance(e, TokenStep)][:4] == resubmitted[:4]
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())


def test_a_silent_replica_takes_nothing_new_moves_what_may_move_and_finishes_the_rest_when_it_speaks(loop):
    """A frozen generation (SIGSTOP: the stream stays up, nothing comes) is stalled after stall_s:
    new requests go elsewhere; a request with no token yet moves (the retry rule); one that already
    streamed tokens waits for the replica instead of failing (issue 28: a 10 s freeze failed every
    request in flight with BACKEND_STALLED), and finishes with every token once it speaks again."""
    async def run():
        fakes = Fakes()
        addresses = await fakes.start(2, step_s=0.01)
        pool = await make_pool(addresses, stall_s=0.3)
        try:
            victim, other = addresses
            untouched = next(r for r in (submit(pool, f"u{i}", [i] * 8, input_open=True) for i in range(20))
                             if r.tried[0] == victim)
            touched = next(r for r in (submit(pool, f"t{i}", [50 + i] * 8, max_tokens=200) for i in range(20))
                           if r.tried[0] == victim)
            await wait_for(lambda: touched.tokens_received)
            fakes.fakes[victim].frozen = True
            await wait_for(lambda: not pool.replicas[victim].serving, timeout_s=5)
            await wait_for(lambda: untouched.tried[-1] == other)  # moved, with its prompt
            assert touched.tried == [victim] and not touched.ended and touched.backend.is_running(touched.key)
            assert all(submit(pool, f"n{i}", [90 + i] * 8).tried == [other] for i in range(8))
            await asyncio.sleep(0.5)  # frozen well past stall_s: still waiting, not failed
            assert not touched.ended
            fakes.fakes[victim].frozen = False
            events = await events_of(touched, timeout_s=10)
            assert isinstance(events[-1], BackendFinished) and events[-1].finish_reason is FinishReason.LENGTH, events[-1]
            assert sum(isinstance(e, TokenStep) for e in events) == 200
            await wait_for(lambda: pool.replicas[victim].serving)
            untouched.append([43], end=True)
            assert isinstance((await events_of(untouched, timeout_s=5))[-1], BackendFinished)
            await wait_for(lambda: untouched.request_id in fakes.fakes[victim].aborted)  # freed there too
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())


def test_a_replica_silent_past_dead_s_is_given_up_like_a_broken_stream(loop):
    """A process that never resumes must not hold a request without a deadline forever: after
    dead_s of silence its stream is given up, what streamed tokens fails UNAVAILABLE, and the
    replica serves again once a new stream speaks."""
    async def run():
        fakes = Fakes()
        addresses = await fakes.start(1, step_s=0.01)
        pool = await make_pool(addresses, stall_s=0.2, dead_s=0.8)
        try:
            touched = submit(pool, "t0", [5] * 8, max_tokens=10_000)
            await wait_for(lambda: touched.tokens_received)
            fakes.fakes[addresses[0]].frozen = True
            started = asyncio.get_running_loop().time()
            failed = (await events_of(touched, timeout_s=5))[-1]
            waited = asyncio.get_running_loop().time() - started
            assert isinstance(failed, BackendFailed) and failed.error.code == Code.UNAVAILABLE, failed
            assert 0.7 <= waited < 3.0, waited
            fakes.fakes[addresses[0]].frozen = False
            await wait_for(lambda: pool.replicas[addresses[0]].serving)
            assert isinstance((await events_of(submit(pool, "n0", [6] * 8)))[-1], BackendFinished)
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())


def test_a_draining_replica_hands_its_new_requests_to_another(loop):
    async def run():
        fakes = Fakes()
        addresses = await fakes.start(2)
        pool = await make_pool(addresses)
        try:
            fakes.fakes[addresses[0]].refuse = True  # RequestFailed UNAVAILABLE, as when draining
            requests = [submit(pool, f"r{i}", [i] * 8) for i in range(12)]
            assert {r.tried[0] for r in requests} == set(addresses)
            for r in requests:
                assert isinstance((await events_of(r))[-1], BackendFinished)
                assert r.tried[-1] == addresses[1]
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())


def test_no_serving_replica_is_unavailable_and_failover_stops_after_max_attempts(loop):
    async def run():
        fakes = Fakes()
        addresses = await fakes.start(2)
        pool = await make_pool(addresses, max_attempts=2)
        try:
            for fake in fakes.fakes.values():
                fake.refuse = True
            request = submit(pool, "r", [1] * 8)
            failed = (await events_of(request))[-1]
            assert isinstance(failed, BackendFailed) and failed.error.code == Code.UNAVAILABLE
            assert sorted(request.tried) == sorted(addresses)  # each tried once, then given up
            for address in addresses:
                await fakes.kill(address)
            await wait_for(lambda: not pool.healthy)
            try:
                submit(pool, "x", [1] * 8)
                raise AssertionError("submit must refuse without a serving replica")
            except Exception as err:  # noqa: BLE001 - MstarError
                assert getattr(err, "code", None) == Code.UNAVAILABLE
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())


def test_a_restarted_replica_is_used_again_and_its_index_entries_are_forgotten(loop):
    async def run():
        fakes = Fakes()
        addresses = await fakes.start(2)
        pool = await make_pool(addresses)
        try:
            prompt = [9] * 40  # longer than the affinity key: recorded in the prefix index
            first = submit(pool, "a", prompt)
            await events_of(first)
            home = first.tried[0]
            assert pool.index.longest_match(list(_hashes(prompt)))[0] == home
            await fakes.kill(home)
            await wait_for(lambda: not pool.replicas[home].serving)
            assert pool.index.longest_match(list(_hashes(prompt)))[0] is None
            moved = submit(pool, "b", prompt)
            assert moved.tried[0] != home
            await events_of(moved)
            await fakes.restart(home)
            await wait_for(lambda: pool.replicas[home].serving, timeout_s=5)
            back = submit(pool, "c", [9] * 8)  # rendezvous sends the short key home again
            assert back.tried[0] == home
            assert isinstance((await events_of(back))[-1], BackendFinished)
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())


def test_a_replica_that_leaves_the_answer_finishes_its_requests_then_closes(loop):
    async def run():
        fakes = Fakes()
        addresses = await fakes.start(2)
        answer = list(addresses)

        async def lookup(host, port):
            return [a.rsplit(":", 1)[0] for a in answer if a.endswith(f":{port}")]

        resolver = Resolver(",".join(f"localhost:{a.rsplit(':', 1)[1]}" for a in addresses), lookup=lookup)
        pool = ReplicaPool(resolver, PoolConfig(routing=ROUTING, resolve_interval_s=0.05, max_backoff_s=0.2))
        pool.start()
        try:
            await wait_for(lambda: len(pool.replicas) == 2 and pool.healthy)
            await wait_for(lambda: all(r.serving for r in pool.replicas.values()))
            held = [submit(pool, f"h{i}", [i] * 8, input_open=True) for i in range(10)]
            leaving = addresses[0]
            on_leaving = [r for r in held if r.tried[0] == leaving]
            answer.remove(leaving)
            await wait_for(lambda: pool.replicas[leaving].leaving)
            assert all(submit(pool, f"n{i}", [i] * 8).tried[0] == addresses[1] for i in range(10))
            for r in held:
                r.append([], end=True)
            for r in on_leaving:  # finished where they ran: leaving is not a failure
                assert isinstance((await events_of(r))[-1], BackendFinished) and r.tried == [leaving]
            await wait_for(lambda: leaving not in pool.replicas)
            answer.append(leaving)
            await wait_for(lambda: leaving in pool.replicas and pool.replicas[leaving].serving)
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())


def test_load_comes_from_the_pushed_status_and_our_own_in_flight(loop):
    async def run():
        fakes = Fakes()
        addresses = await fakes.start(1)
        pool = await make_pool(addresses)
        try:
            held = [submit(pool, f"h{i}", [i] * 8, input_open=True) for i in range(3)]
            replica = pool.replicas[addresses[0]]
            await wait_for(lambda: replica.running == 3)
            load = replica.load()
            assert (load.in_flight, load.others) == (3, 0)  # the status counts ours: not twice
            assert 0 < load.kv_usage < 1
            for r in held:
                r.abort("test over")
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())


def _hashes(prompt):
    from services.preprocess.routing import block_hashes

    return block_hashes(prompt, ROUTING.block_size)


def test_routing_counters_and_replica_gauges(loop):
    from prometheus_client import CollectorRegistry

    from services.common.conductor_collector import ConductorCollector
    from services.preprocess.replica_metrics import ReplicaMetrics

    async def run():
        fakes = Fakes()
        addresses = await fakes.start(2)
        registry, conductor = CollectorRegistry(), ConductorCollector()
        registry.register(conductor)
        metrics = ReplicaMetrics(registry, conductor)
        pool = ReplicaPool(Resolver(",".join(addresses)), PoolConfig(routing=ROUTING, heartbeat_s=0.05),
                           events=metrics, on_status=lambda replica, status: conductor.update(status, replica))
        metrics.watch(pool)
        pool.start()
        value = registry.get_sample_value
        try:
            await wait_for(lambda: all(r.serving for r in pool.replicas.values()) and len(pool.replicas) == 2)
            held = [submit(pool, f"h{i}", [i] * 8, input_open=True) for i in range(10)]
            victim = held[0].tried[0]
            survivor = next(a for a in addresses if a != victim)
            on_victim = sum(r.tried[0] == victim for r in held)
            routed = {a: sum(value("mstar_preprocess_routed_requests_total", {"replica": a, "reason": reason}) or 0
                             for reason in ("affinity", "overflow")) for a in addresses}
            assert routed == {a: sum(r.tried[0] == a for r in held) for a in addresses}
            assert value("mstar_preprocess_replica_in_flight", {"replica": victim}) == on_victim
            await wait_for(lambda: value("mstar_conductor_requests_running", {"replica": victim}) == on_victim)
            await fakes.kill(victim)
            await wait_for(lambda: value("mstar_preprocess_replica_serving", {"replica": victim}) == 0)
            assert value("mstar_preprocess_replica_serving", {"replica": survivor}) == 1
            assert value("mstar_preprocess_replica_failovers_total",
                         {"replica": victim, "outcome": "resubmitted"}) == on_victim
            assert value("mstar_preprocess_routed_requests_total",
                         {"replica": survivor, "reason": "failover"}) == on_victim
            metrics.removed(victim)
            assert value("mstar_preprocess_replica_failovers_total",
                         {"replica": victim, "outcome": "resubmitted"}) is None
            assert value("mstar_conductor_requests_running", {"replica": victim}) is None
            for r in held:
                r.abort("test over")
        finally:
            await pool.close()
            await fakes.stop()

    loop.run(run())
