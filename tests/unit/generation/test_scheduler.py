import pytest
from generation_helpers import drive, make_engine

from services.generation.block_manager import BlockManager
from services.generation.sampling_params import SamplingParams
from services.generation.scheduler import Scheduler, SchedulerConfig
from services.generation.sequence import Sequence, SequenceStatus, Timing


def seq(n, seq_id, input_done=True):
    return Sequence(seq_id, seq_id, list(range(1, n + 1)), SamplingParams(), 0, Timing(0.0, 0.0), input_done)


def run_batch(batch, new_token=5):
    """What the engine does after a step: advance computed counts, append a token when sampling."""
    for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        sampling = s.is_sampling_step(n)
        s.num_computed_tokens += n
        if sampling:
            s.append_output(new_token)


def test_chunked_prefill_respects_the_token_budget():
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=10), BlockManager(64, 4))
    a = seq(25, 0)
    sched.add(a)
    sizes = []
    for _ in range(3):
        batch = sched.schedule()
        sizes.append(batch.num_new_tokens)
        run_batch(batch)
    assert sizes == [[10], [10], [5]]
    assert a.num_output_tokens == 1


def test_decodes_go_first_then_new_prefills_share_the_budget():
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8), BlockManager(64, 4))
    a = seq(4, 0)
    sched.add(a)
    run_batch(sched.schedule())
    b = seq(20, 1)
    sched.add(b)
    batch = sched.schedule()
    assert [s.seq_id for s in batch.seqs] == [0, 1] and batch.num_new_tokens == [1, 7]


def test_max_num_seqs_limits_admission():
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=100), BlockManager(64, 4))
    for i in range(3):
        sched.add(seq(3, i))
    batch = sched.schedule()
    assert len(batch.seqs) == 2 and len(sched.waiting) == 1


def test_preempts_the_newest_when_blocks_run_out():
    bm = BlockManager(4, 4)
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=100), bm)
    a, b = seq(8, 0), seq(8, 1)
    sched.add(a)
    sched.add(b)
    run_batch(sched.schedule())  # both prefilled: 4 blocks used, each now has 9 tokens
    batch = sched.schedule()  # a needs a 3rd block: b (newest) is preempted
    assert batch.preempted == [b] and batch.seqs == [a]
    assert b.status == SequenceStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    assert sched.waiting[0] is b and sched.num_preemptions == 1


def test_streaming_input_holds_back_the_last_token():
    sched = Scheduler(SchedulerConfig(), BlockManager(64, 4))
    a = seq(5, 0, input_done=False)
    sched.add(a)
    batch = sched.schedule()
    assert batch.num_new_tokens == [4] and not a.is_sampling_step(4)
    run_batch(batch)
    assert not sched.has_work()
    a.append_prompt([7, 8])
    a.is_input_done = True
    batch = sched.schedule()
    assert batch.num_new_tokens == [3] and a.is_sampling_step(3)


def test_a_sequence_larger_than_the_pool_is_unfittable():
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=100), BlockManager(2, 4))
    a = seq(12, 0)
    sched.add(a)
    batch = sched.schedule()
    assert batch.unfittable == [a] and not sched.waiting and not sched.running


def test_tiny_pool_preemption_keeps_greedy_outputs(tiny_checkpoint):
    prompts = [[(7 * i + j) % 500 + 3 for j in range(6 + i)] for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    roomy = make_engine(tiny_checkpoint, num_blocks=128, block_size=4)
    for i, p in enumerate(prompts):
        roomy.add_request(i, p, params)
    expected, _, _, _ = drive(roomy)

    tight = make_engine(tiny_checkpoint, num_blocks=12, block_size=4)  # ~1.5 of these requests
    for i, p in enumerate(prompts):
        tight.add_request(i, p, params)
    got, completed, failed, _ = drive(tight)
    assert not failed and len(completed) == len(prompts)
    assert tight.scheduler.num_preemptions > 0
    assert got == expected
    assert tight.block_manager.num_free_blocks == 12


@pytest.mark.parametrize("num_blocks", [1, 3])
def test_requests_that_never_fit_are_rejected_at_admission(tiny_checkpoint, num_blocks):
    engine = make_engine(tiny_checkpoint, num_blocks=num_blocks, block_size=4)
    engine.add_request("big", list(range(3, 20)), SamplingParams(temperature=0.0, max_tokens=4))
    _, _, failed, _ = drive(engine)
    assert failed["big"].error.reason == "KV_CACHE_TOO_SMALL"


# Fairness between prefills (scheduler.py's docstring): a short prompt that arrives while a long
# one prefills starts in the next step, beside a chunk capped at the threshold; the long one keeps
# the threshold's worth of every step.


def fair_scheduler(threshold=None, budget=64, max_num_seqs=16, num_blocks=256):
    config = SchedulerConfig(max_num_seqs, budget, long_prefill_token_threshold=threshold)
    return Scheduler(config, BlockManager(num_blocks, 4))


def step(sched):
    batch = sched.schedule()
    run_batch(batch)
    return dict(zip([s.seq_id for s in batch.seqs], batch.num_new_tokens, strict=True))


def test_a_short_prompt_arriving_during_a_long_prefill_is_admitted_in_the_next_step():
    sched = fair_scheduler()  # budget 64, threshold 32
    long = seq(600, 0)
    sched.add(long)
    assert step(sched) == {0: 64}
    short = seq(10, 1)
    sched.add(short)
    assert step(sched) == {0: 32, 1: 10}  # the long chunk capped; the short one samples its first token
    assert short.num_output_tokens == 1 and long.num_computed_tokens == 96
    assert step(sched) == {0: 63, 1: 1}  # now a decode: one token, the long prefill the rest


def test_without_the_threshold_the_short_prompt_waits_for_the_whole_long_prefill():
    sched = fair_scheduler(threshold=0)
    long, short = seq(600, 0), seq(10, 1)
    sched.add(long)
    step(sched)
    sched.add(short)
    steps = 1
    while not short.num_output_tokens:
        got = step(sched)
        steps += 1
        if long.num_computed_tokens < 600:
            assert got == {0: 64}
    assert steps == 10  # 600 tokens in 64-token chunks, the short prompt in the last one's rest


def test_a_long_prefill_yields_at_most_the_share_and_keeps_the_threshold():
    sched = fair_scheduler(threshold=40)  # the others get up to 24
    long = seq(600, 0)
    sched.add(long)
    step(sched)
    for i in range(1, 4):
        sched.add(seq(20, i))  # 60 tokens want in: 24 of them a step, in arrival order
    assert step(sched) == {0: 40, 1: 20, 2: 4}
    assert step(sched) == {0: 39, 1: 1, 2: 16, 3: 8}  # 1 decodes: its token is not taken from the share
    assert step(sched) == {0: 40, 1: 1, 2: 1, 3: 12} and long.num_computed_tokens == 64 + 40 + 39 + 40


def test_many_short_arrivals_cannot_starve_the_long_prefill():
    sched = fair_scheduler(max_num_seqs=64, num_blocks=1024)  # budget 64, threshold 32
    long = seq(640, 0)
    sched.add(long)
    steps, next_id = 0, 1
    while not long.num_output_tokens:
        for _ in range(3):  # 60 tokens of new prompts every step, more than the share
            sched.add(seq(20, next_id))
            next_id += 1
        before = long.num_computed_tokens
        batch = sched.schedule()
        decodes = sum(1 for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True) if n == 1)
        run_batch(batch)
        for s in list(sched.running):  # the short ones end after their first token
            if s is not long and s.num_output_tokens:
                sched.remove(s)
        assert long.num_computed_tokens - before >= 32 - decodes > 0
        steps += 1
    assert steps <= 20  # 640 tokens at the threshold's 32 a step: at most 20 steps


def test_decodes_behind_a_long_prefill_get_their_token_every_step():
    sched = fair_scheduler(threshold=0)  # even without fairness
    long = seq(5, 0, input_done=False)  # streamed input: 4 tokens now, the rest later
    streams = [seq(2, i) for i in (1, 2, 3)]
    for s in [long, *streams]:
        sched.add(s)
    assert step(sched) == {0: 4, 1: 2, 2: 2, 3: 2}
    long.append_prompt(list(range(600)))
    long.is_input_done = True  # a long prefill now runs ahead of three decodes
    for _ in range(3):
        assert step(sched) == {0: 61, 1: 1, 2: 1, 3: 1}


def test_equal_or_longer_prefills_behind_are_served_first_come_first_served():
    sched = fair_scheduler()
    first, second = seq(300, 0), seq(300, 1)
    sched.add(first)
    sched.add(second)
    for _ in range(4):
        assert step(sched) == {0: 64}
    assert sched.waiting[0] is second and second.num_computed_tokens == 0


def test_a_long_and_a_short_arriving_together_start_in_the_same_step():
    sched = fair_scheduler()
    long, short = seq(600, 0), seq(10, 1)
    sched.add(long)
    sched.add(short)
    assert step(sched) == {0: 32, 1: 10}
    assert short.num_output_tokens == 1


def test_no_free_seat_means_nothing_to_yield_to():
    sched = fair_scheduler(max_num_seqs=1)
    long, short = seq(600, 0), seq(10, 1)
    sched.add(long)
    step(sched)
    sched.add(short)
    assert step(sched) == {0: 64}
    assert sched.waiting[0] is short


@pytest.mark.parametrize(("threshold", "cap"), [(None, 256), (384, 384), (0, None), (512, None), (4096, None)])
def test_the_fairness_cap_follows_the_threshold(threshold, cap):
    assert SchedulerConfig(64, 512, threshold).fairness_cap == cap


def test_a_negative_threshold_is_refused():
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        Scheduler(SchedulerConfig(long_prefill_token_threshold=-1), BlockManager(8, 4))
