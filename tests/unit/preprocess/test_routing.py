"""The replica-routing policy (services/preprocess/routing.py): affinity, the load bound, stability."""

import random

import pytest

from services.preprocess import routing
from services.preprocess.routing import PrefixIndex, ReplicaLoad, RoutingConfig, choose

CFG = RoutingConfig(block_size=4, affinity_blocks=2, load_margin=2.0, kv_weight=8.0)
REPLICAS = [f"10.0.0.{i}:50052" for i in range(1, 6)]


def idle(addresses=REPLICAS):
    return [ReplicaLoad(a) for a in addresses]


def test_equal_prefixes_go_to_one_replica_whatever_follows():
    system = list(range(100, 108))  # two full blocks of 4
    picks = {choose(system + [random.randrange(1000) for _ in range(9)], idle(), CFG).address for _ in range(50)}
    assert len(picks) == 1


def test_different_prefixes_spread_over_replicas():
    picks = {choose([k] * 8, idle(), CFG).address for k in range(200)}
    assert len(picks) == len(REPLICAS)


def test_every_preprocess_replica_ranks_the_same_without_shared_state():
    prompt = list(range(50, 70))
    assert choose(prompt, idle(), CFG) == choose(prompt, list(reversed(idle())), CFG)


def test_removing_a_replica_moves_only_the_keys_it_held():
    prompts = [[k] * 8 for k in range(300)]
    before = {tuple(p): choose(p, idle(), CFG).address for p in prompts}
    gone = REPLICAS[2]
    after = {tuple(p): choose(p, idle([a for a in REPLICAS if a != gone]), CFG).address for p in prompts}
    moved = [p for p in prompts if before[tuple(p)] != after[tuple(p)]]
    assert moved and all(before[tuple(p)] == gone for p in moved)


def test_a_busy_first_choice_overflows_to_the_keys_second_choice():
    prompt = list(range(8))
    key = routing.affinity_key(prompt, CFG)
    first, second = routing.rank(key, REPLICAS)[:2]
    loads = [ReplicaLoad(a, in_flight=10 if a == first else 0) for a in REPLICAS]
    decision = choose(prompt, loads, CFG)
    assert (decision.address, decision.reason, decision.rank) == (second, routing.OVERFLOW, 1)


def test_within_the_margin_affinity_wins_over_a_less_loaded_replica():
    prompt = list(range(8))
    first = routing.rank(routing.affinity_key(prompt, CFG), REPLICAS)[0]
    loads = [ReplicaLoad(a, in_flight=2 if a == first else 0) for a in REPLICAS]
    assert choose(prompt, loads, CFG) == routing.Decision(first, routing.AFFINITY, 0)


def test_a_full_kv_cache_counts_as_load():
    prompt = list(range(8))
    first = routing.rank(routing.affinity_key(prompt, CFG), REPLICAS)[0]
    loads = [ReplicaLoad(a, kv_usage=0.9 if a == first else 0.0) for a in REPLICAS]
    assert choose(prompt, loads, CFG).address != first


def test_short_prompts_have_no_key_and_go_to_the_least_loaded():
    loads = [ReplicaLoad(a, in_flight=3) for a in REPLICAS[:-1]] + [ReplicaLoad(REPLICAS[-1], in_flight=1)]
    decision = choose([1, 2, 3], loads, CFG)  # shorter than one block
    assert (decision.address, decision.reason) == (REPLICAS[-1], routing.LEAST_LOADED)


def test_no_candidate_no_decision():
    assert choose(list(range(8)), [], CFG) is None


def test_the_index_keeps_a_conversation_where_its_history_is():
    index = PrefixIndex()
    turn1 = list(range(40))  # 10 blocks: longer than the 2-block affinity key
    first = choose(turn1, idle(), CFG, index).address
    # Another conversation moved the affinity key's first choice elsewhere (overflow), but the
    # second turn still shares 10 blocks with the first: it follows its history.
    busy = [ReplicaLoad(a, in_flight=10 if a != first else 7) for a in REPLICAS]
    turn2 = turn1 + list(range(900, 912))
    decision = choose(turn2, busy, CFG, index)
    assert (decision.address, decision.reason) == (first, routing.PREFIX)


def test_the_index_is_only_a_hint_under_the_load_bound():
    index = PrefixIndex()
    turn1 = list(range(40))
    first = choose(turn1, idle(), CFG, index).address
    loads = [ReplicaLoad(a, in_flight=20 if a == first else 0) for a in REPLICAS]
    assert choose(turn1 + [5] * 8, loads, CFG, index).address != first


def test_the_index_is_bounded_and_forgets_a_replica():
    index = PrefixIndex(capacity=5)
    index.record(routing.block_hashes(list(range(40)), 4), "a")
    assert len(index) == 5
    index.forget("a")
    assert len(index) == 0 and index.longest_match(routing.block_hashes(list(range(40)), 4)) == (None, 0)


def test_others_from_status_subtracts_our_own_share():
    assert routing.others_from_status(running=6, waiting=2, in_flight_then=5) == 3
    assert routing.others_from_status(running=1, waiting=0, in_flight_then=4) == 0


@pytest.mark.parametrize("kwargs", [{"block_size": 0}, {"affinity_blocks": 0}, {"load_margin": -1}])
def test_config_rejects_nonsense(kwargs):
    with pytest.raises(ValueError):
        RoutingConfig(**kwargs)


def test_the_simulation_runs_and_affinity_saves_prefill():
    from bench.routing_sim import SimConfig, simulate

    cfg = SimConfig(replicas=4, seconds=20.0, seed=3)
    rr, ours = simulate("round_robin", cfg), simulate("mstar", cfg)
    assert rr["requests"] > 100 and abs(rr["requests"] - ours["requests"]) < 0.05 * rr["requests"]
    assert ours["hit_rate"] > rr["hit_rate"] and ours["prefill_computed"] < rr["prefill_computed"]
