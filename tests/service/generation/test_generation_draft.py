"""The real server with a draft model (`--draft-model`, services/generation/draft.py): a smaller GGUF
with the target's tokenizer proposes, and a mixed greedy/sampled batch of repeating prompts gets the
tokens a server without speculation gives; ConductorStatus counts the draft's runs and both KV
pools are free at the end."""

import dataclasses

import pytest
from generation_server_proc import start_server, stop_server
from generation_stream_client import StreamClient, start

from services.generation.weights.random_init import TINY, random_checkpoint, save_gguf

STATUS = (("mstar-status-interval-ms", "50"),)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    d = tmp_path_factory.mktemp("draft")
    target = save_gguf(random_checkpoint(seed=0), str(d / "target.gguf"))
    draft = save_gguf(random_checkpoint(dataclasses.replace(TINY, num_layers=1), seed=0), str(d / "draft.gguf"))
    return target, draft


def serve_batch(model: str, *args: str) -> tuple[dict, StreamClient]:
    proc, port = start_server(model, "--kv-blocks", "128", "--block-size", "4", *args)
    try:
        client = StreamClient(port, metadata=STATUS)
        ids = [f"r{i}" for i in range(4)]
        client.send(*[start(rid, [3 + i, 40, 41, 42, 40, 41, 42, 40, 41], max_tokens=16, ignore_eos=True,
                            temperature=0.7 * (i % 2), seed=i) for i, rid in enumerate(ids)])
        assert client.wait_ended(ids)
        assert all(client.ends[rid].HasField("request_complete") for rid in ids)
        assert client.wait(lambda c: c.latest_metric("kv_blocks_used") == 0 and len(c.statuses) > 2)
        client.close()
        assert client.error is None
        return {rid: list(client.tokens[rid]) for rid in ids}, client
    finally:
        stop_server(proc)


def test_a_draft_model_server_gives_the_tokens_of_one_without_speculation(ggufs):
    target, draft = ggufs
    want, _ = serve_batch(target, "--speculative", "off")
    got, client = serve_batch(target, "--draft-model", draft)  # --speculative auto becomes draft
    assert got == want
    assert client.latest_metric("spec_draft_passes") > 0 and client.latest_metric("spec_proposed_tokens") > 0
