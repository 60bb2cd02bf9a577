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
