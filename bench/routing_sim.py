"""Routing simulation: round-robin vs least-loaded vs mstar's policy over 2..32 simulated replicas.

    python -m bench.routing_sim [--replicas 2,4,8,16,32] [--seconds 120] [--out tables.md]  (tables of docs/benchmarks-routing.md)

Real multi-replica throughput cannot be measured on a 2-core box, so this is a simulation, and it
says what it models:

- **Trace**: a synthetic multi-tenant chat workload. Tenants (Zipf popularity) each have a system
  prompt of 200-1200 tokens; conversations arrive as a Poisson process and run 1-6 turns; each
  turn's prompt is the previous turn's prompt + the reply + a new user message (20-200 tokens),
  sent after a think time (exponential, mean 3 s) once the previous reply finished. One request in
  ten is a one-shot prompt with no shared prefix. Token ids are synthetic but shared exactly where
  real prompts share text.
- **Replica**: a model of the generation engine's scheduler: per step a token budget (512) and a
  cap on running requests (64); decode rows first, then prefill chunks, FCFS admission. A step
  takes 15 ms + 0.05 ms per batched token. A prefix cache of `cache_blocks` blocks of 16 tokens,
  LRU, keyed by chained block hashes like services/generation/block_manager.py; a request's
  leading cached blocks are not recomputed.
- **Router**: two preprocess replicas (requests split between them at random, like Envoy's
  least-request over equal peers) each routing with only their own in-flight counts plus every
  replica's ConductorStatus pushed every 0.5 s (stale by up to 0.5 s), exactly the inputs
  services/preprocess/routing.py gets in production. mstar's policy IS that module.

Reported per policy and replica count: prefix-cache hit rate (cached / all prompt tokens), prefill
tokens computed and saved versus round-robin, load imbalance (max / mean of per-replica computed
tokens), and mean / p99 time to first token. The arrival rate grows with the replica count so every
run sits at the same nominal utilisation. Deterministic for a given --seed.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

from services.preprocess import routing

BLOCK = 16
POLICIES = ("round_robin", "least_loaded", "rendezvous", "mstar")


@dataclass
class SimConfig:
    replicas: int = 8
    seconds: float = 120.0
    seed: int = 0
    tenants: int = 12
    conversations_per_s_per_replica: float = 1.2
    cache_blocks: int = 1024  # 16k tokens of prefix cache per replica
    kv_blocks: int = 8192  # KV pool for running requests (kv_usage denominator)
    step_base_s: float = 0.015
    step_per_token_s: float = 0.00005
    token_budget: int = 512
    max_running: int = 64
    status_interval_s: float = 0.5  # = the preprocess backend's heartbeat (ConductorStatus period)
    load_margin: float = routing.RoutingConfig.load_margin
    preprocess_replicas: int = 2


@dataclass
class Request:
    conv: int
    turn: int
    prompt: list[int]
    out_len: int
    arrival: float
    hashes: list[int] = field(default_factory=list)
    cached: int = 0
    computed: int = 0  # prompt tokens done (cached + prefilled)
    generated: int = 0
    first_token: float | None = None
    started: bool = False
    replica: int = -1
    router: int = 0


def block_hashes(tokens: list[int]) -> list[int]:
    out, parent = [], 0x6D73746172
    for i in range(len(tokens) // BLOCK):
        parent = hash((parent, tuple(tokens[i * BLOCK : (i + 1) * BLOCK])))
        out.append(parent)
    return out


class Replica:
    def __init__(self, index: int, cfg: SimConfig):
        self.index, self.cfg = index, cfg
        self.address = f"10.0.0.{index + 1}:50052"
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.busy_until = 0.0
        self.scheduled = False
        self.computed_tokens = 0
        self.status = (0, 0, 0.0)  # running, waiting, kv_usage as last pushed

    def kv_usage(self) -> float:
        used = sum(-(-(len(r.prompt) + r.generated) // BLOCK) for r in self.running)
        return min(1.0, used / self.cfg.kv_blocks)

    def push_status(self) -> None:
        self.status = (len(self.running), len(self.waiting), self.kv_usage())

    def _lookup(self, req: Request) -> int:
        hits = 0
        for h in req.hashes:
            if h not in self.cache:
                break
            self.cache.move_to_end(h)
            hits += 1
        return hits * BLOCK

    def _insert(self, hashes: list[int]) -> None:
        for h in hashes:
            self.cache[h] = None
            self.cache.move_to_end(h)
        while len(self.cache) > self.cfg.cache_blocks:
            self.cache.popitem(last=False)

    def step(self, now: float) -> tuple[float, list[Request]]:
        """Run one engine step starting at `now`: returns its end time and the requests it finished."""
        budget, tokens = self.cfg.token_budget, 0
        decoding = [r for r in self.running if r.computed >= len(r.prompt)]
        for r in decoding[:budget]:
            r.generated += 1
            tokens += 1
        budget -= tokens
        while self.waiting and len(self.running) < self.cfg.max_running:
            req = self.waiting.popleft()
            req.cached = min(self._lookup(req), len(req.prompt) - 1)  # the last token is always computed
            req.computed = req.cached
            self.running.append(req)
        for r in self.running:
            if budget <= 0:
                break
            if r.computed < len(r.prompt):
                n = min(budget, len(r.prompt) - r.computed)
                r.computed += n
                budget -= n
                tokens += n
                self.computed_tokens += n
                if r.computed == len(r.prompt):
                    r.generated = 1  # the prefill's last row samples the first token
        end = now + self.cfg.step_base_s + self.cfg.step_per_token_s * tokens
        finished = []
        for r in self.running:
            if r.computed >= len(r.prompt) and r.generated >= 1 and r.first_token is None:
                r.first_token = end
            if r.generated >= r.out_len:
                finished.append(r)
        for r in finished:
            self.running.remove(r)
            self._insert(r.hashes)
        return end, finished


class Trace:
    """Synthetic tenants, conversations and one-shot prompts (deterministic per seed)."""

    def __init__(self, cfg: SimConfig, rng: random.Random):
        self.rng = rng
        self.next_token = 10_000
        weights = [1.0 / (i + 1) for i in range(cfg.tenants)]  # Zipf popularity
        self.tenant_weights = weights
        self.system = [self._fresh(rng.randint(200, 1200)) for _ in range(cfg.tenants)]

    def _fresh(self, n: int) -> list[int]:
        start = self.next_token
        self.next_token += n
        return list(range(start, start + n))

    def first_turn(self, conv: int, now: float) -> tuple[Request, int]:
        rng = self.rng
        if rng.random() < 0.1:  # one-shot, nothing shared
            return Request(conv, 0, self._fresh(rng.randint(8, 400)), rng.randint(30, 200), now), 1
        tenant = rng.choices(range(len(self.system)), self.tenant_weights)[0]
        prompt = self.system[tenant] + self._fresh(rng.randint(20, 200))
        return Request(conv, 0, prompt, rng.randint(30, 200), now), rng.randint(1, 6)

    def next_turn(self, prev: Request, now: float) -> Request:
        prompt = prev.prompt + self._fresh(prev.out_len) + self._fresh(self.rng.randint(20, 200))
        return Request(prev.conv, prev.turn + 1, prompt, self.rng.randint(30, 200), now)


def simulate(policy: str, cfg: SimConfig) -> dict:
    rng = random.Random(cfg.seed)  # same trace for every policy
    route_rng = random.Random(cfg.seed + 1)
    trace = Trace(cfg, rng)
    replicas = [Replica(i, cfg) for i in range(cfg.replicas)]
    in_flight = [[0] * cfg.replicas for _ in range(cfg.preprocess_replicas)]
    rr = [0] * cfg.preprocess_replicas
    indexes = [routing.PrefixIndex() for _ in range(cfg.preprocess_replicas)]
    rcfg = routing.RoutingConfig(block_size=BLOCK, load_margin=cfg.load_margin)
    events: list = []  # (time, seq, kind, payload)
    seq = 0

    def push(t: float, kind: str, payload) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, payload))

    t, conv = 0.0, 0
    rate = cfg.conversations_per_s_per_replica * cfg.replicas
    while t < cfg.seconds:
        t += rng.expovariate(rate)
        request, turns = trace.first_turn(conv, t)
        push(t, "arrive", (request, turns))
        conv += 1
    for i in range(int(cfg.seconds / cfg.status_interval_s) + 1):
        push(i * cfg.status_interval_s, "status", None)

    at_status = [[0] * cfg.replicas for _ in range(cfg.preprocess_replicas)]
    done: list[Request] = []
    turns_left: dict[int, int] = {}
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "status":
            for r in replicas:
                r.push_status()
            # Each router notes its own in-flight count per replica as the status arrives.
            at_status = [list(row) for row in in_flight]
        elif kind == "arrive":
            req, turns = payload
            turns_left.setdefault(req.conv, turns)
            req.hashes = block_hashes(req.prompt)
            req.router = route_rng.randrange(cfg.preprocess_replicas)
            req.replica = _route(
                policy, req, replicas, in_flight[req.router], at_status[req.router], rr, rcfg, route_rng,
                indexes[req.router],
            )
            in_flight[req.router][req.replica] += 1
            target = replicas[req.replica]
            target.waiting.append(req)
            if not target.scheduled:
                target.scheduled = True
                push(max(now, target.busy_until), "step", target)
        elif kind == "step":
            replica = payload
            end, finished = replica.step(now)
            replica.busy_until = end
            for req in finished:
                in_flight[req.router][req.replica] -= 1
                done.append(req)
                turns_left[req.conv] -= 1
                if turns_left[req.conv] > 0 and end < cfg.seconds:
                    t_next = end + rng.expovariate(1 / 3.0)  # think time
                    push(t_next, "arrive", (trace.next_turn(req, t_next), 0))
            if replica.running or replica.waiting:
                push(end, "step", replica)
            else:
                replica.scheduled = False
    return _summary(done, replicas)


def _route(policy, req, replicas, in_flight, at_status, rr, rcfg, rng, index) -> int:
    if policy == "round_robin":
        rr[req.router] = (rr[req.router] + 1) % len(replicas)
        return rr[req.router]
    loads = [
        routing.ReplicaLoad(
            r.address,
            in_flight[r.index],
            routing.others_from_status(r.status[0], r.status[1], at_status[r.index]),
            r.status[2],
        )
        for r in replicas
    ]
    if policy == "least_loaded":
        least = min(load.load(rcfg.kv_weight) for load in loads)
        return rng.choice([i for i, load in enumerate(loads) if load.load(rcfg.kv_weight) == least])
    decision = routing.choose(req.prompt, loads, rcfg, index if policy == "mstar" else None)
    return next(r.index for r in replicas if r.address == decision.address)


def _summary(done: list[Request], replicas: list[Replica]) -> dict:
    prompt = sum(len(r.prompt) for r in done)
    cached = sum(r.cached for r in done)
    work = [r.computed_tokens for r in replicas]
    ttft = sorted((r.first_token or r.arrival) - r.arrival for r in done)
    return {
        "requests": len(done),
        "hit_rate": cached / prompt if prompt else 0.0,
        "prefill_computed": sum(work),
        "prompt_tokens": prompt,
        "imbalance": max(work) / statistics.mean(work) if sum(work) else 1.0,
        "ttft_mean_s": statistics.mean(ttft) if ttft else 0.0,
        "ttft_p99_s": ttft[int(0.99 * (len(ttft) - 1))] if ttft else 0.0,
    }


def report(results: dict[int, dict[str, dict]], cfg: SimConfig) -> str:
    lines = [
        f"## {cfg.conversations_per_s_per_replica} new conversations/s per replica",
        "",
        "Generated by `python -m bench.routing_sim` (module docstring: what is modelled). "
        f"{cfg.seconds:.0f} s of simulated traffic per run, seed {cfg.seed}, "
        f"{cfg.conversations_per_s_per_replica} new conversations/s per replica, {cfg.tenants} tenants, "
        f"{cfg.preprocess_replicas} preprocess replicas with ConductorStatus every {cfg.status_interval_s:g} s. "
        "A simulation, not a measurement: real multi-replica throughput cannot be measured on this 2-core box.",
        "",
        "| replicas | policy | requests | prefix hit rate | prefill tokens computed | saved vs round-robin "
        "| load imbalance (max/mean) | TTFT mean (s) | TTFT p99 (s) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, by_policy in results.items():
        base = by_policy["round_robin"]["prefill_computed"]
        for policy, r in by_policy.items():
            saved = 1 - r["prefill_computed"] / base if base else 0.0
            lines.append(
                f"| {n} | {policy} | {r['requests']} | {r['hit_rate']:.1%} | {r['prefill_computed']:,} | {saved:+.1%} "
                f"| {r['imbalance']:.2f} | {r['ttft_mean_s']:.3f} | {r['ttft_p99_s']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", default="2,4,8,16,32")
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rates", default="1.2,3.0", help="new conversations/s per replica; one table each")
    p.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = p.parse_args(argv)
    tables = []
    for rate in (float(x) for x in args.rates.split(",")):
        results: dict[int, dict[str, dict]] = {}
        for n in (int(x) for x in args.replicas.split(",")):
            cfg = SimConfig(replicas=n, seconds=args.seconds, seed=args.seed, conversations_per_s_per_replica=rate)
            results[n] = {policy: simulate(policy, cfg) for policy in POLICIES}
            print(f"rate {rate} replicas {n} done", flush=True)
        base = SimConfig(seconds=args.seconds, seed=args.seed, conversations_per_s_per_replica=rate)
        tables.append(report(results, base))
    text = "\n".join(tables)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
