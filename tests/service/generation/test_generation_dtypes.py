"""The real server in its non-default numerics: `--dtype bfloat16`, and `--quantization gguf` on a
Q4_1 GGUF. Each serves a mixed greedy/sampled batch to the end and frees every block."""

import pytest
from generation_server_proc import start_server, stop_server
from generation_stream_client import StreamClient, start

from services.generation.weights.random_init import random_checkpoint, save_gguf

STATUS = (("mstar-status-interval-ms", "50"),)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return save_gguf(random_checkpoint(seed=0), str(tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf"))


@pytest.fixture(scope="module", params=["bf16", "gguf-q4"])
def variant_server(request, tiny_model_dir, tiny_gguf):
    if request.param == "bf16":
        proc, port = start_server(tiny_model_dir, "--kv-blocks", "128", "--block-size", "4", "--dtype", "bfloat16")
    else:
        proc, port = start_server(tiny_gguf, "--kv-blocks", "128", "--block-size", "4", "--quantization", "gguf")
    yield port
    stop_server(proc)


def test_server_completes_a_mixed_batch_and_frees_blocks(variant_server):
    client = StreamClient(variant_server, metadata=STATUS)
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
