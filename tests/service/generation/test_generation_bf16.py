"""`--dtype bfloat16` on CPU: the real server serves in bf16 (opt-in) and frees every block."""

import pytest
from generation_server_proc import start_server, stop_server
from generation_stream_client import StreamClient, start

STATUS = (("mstar-status-interval-ms", "50"),)


@pytest.fixture(scope="module")
def bf16_server(tiny_model_dir):
    proc, port = start_server(tiny_model_dir, "--kv-blocks", "128", "--block-size", "4", "--dtype", "bfloat16")
    yield port
    stop_server(proc)


def test_bf16_server_completes_a_mixed_batch_and_frees_blocks(bf16_server):
    client = StreamClient(bf16_server, metadata=STATUS)
    ids = [f"r{i}" for i in range(8)]
    client.send(*[start(rid, [3 + i, 40, 41, 42 + i], max_tokens=9, ignore_eos=True, temperature=0.7 * (i % 2), seed=i)
                  for i, rid in enumerate(ids)])
    assert client.wait_ended(ids)
    for rid in ids:
        assert client.ends[rid].HasField("request_complete"), client.ends[rid]
        assert len(client.tokens[rid]) == 9
    assert client.wait(lambda c: c.latest_metric("kv_blocks_used") == 0 and len(c.statuses) > 2)
    client.close()
    assert client.error is None

