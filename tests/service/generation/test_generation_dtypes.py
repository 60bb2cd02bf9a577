"""The real server in its numerics variants: an HF directory in `--dtype bfloat16`, a Q4_1 GGUF at
its defaults (the file's own block codes through the CPU kernels), and the fp32 HF oracle. Each
serves a mixed greedy/sampled batch to the end, frees every block, and says how it computes in the
Stream's initial metadata (what ListModels reports)."""

import json

import pytest
from generation_server_proc import start_server, stop_server
from generation_stream_client import StreamClient, start

from services.generation.weights.random_init import random_checkpoint, save_gguf

STATUS = (("mstar-status-interval-ms", "50"),)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return save_gguf(random_checkpoint(seed=0), str(tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf"))


VARIANTS = {  # name -> (model fixture, extra args, expected numerics metadata)
    "bf16": ("tiny_model_dir", ("--dtype", "bfloat16"), {"activations": "bfloat16", "kernels": "cpu"}),
    "gguf-default": ("tiny_gguf", (), {"activations": "float32", "kernels": "cpu", "weights": "Q4_1 codes x14, float32 x7"}),
    "oracle": ("tiny_model_dir", ("--dtype", "float32", "--quantization", "none"), {"kernels": "reference"}),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant_server(request):
    model_fixture, args, expected = VARIANTS[request.param]
    proc, port = start_server(request.getfixturevalue(model_fixture), "--kv-blocks", "128", "--block-size", "4", *args)
    yield port, expected
    stop_server(proc)


def test_server_completes_a_mixed_batch_and_frees_blocks(variant_server):
    port, expected = variant_server
    client = StreamClient(port, metadata=STATUS)
    numerics = json.loads(dict(client.call.initial_metadata())["mstar-numerics"])
    assert numerics | expected == numerics and numerics["device"] == "cpu", numerics
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
