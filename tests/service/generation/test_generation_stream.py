"""GenerationService.Stream against a real server on a tiny random model."""

import grpc
from generation_server_proc import start_server, stop_server
from generation_stream_client import StreamClient, abort, append, start
from grpc_health.v1 import health_pb2, health_pb2_grpc
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.v1 import messages_pb2 as pb

STATUS = (("mstar-status-interval-ms", "50"),)


def prompt(i):
    return [(11 * i + j) % 500 + 3 for j in range(5 + i % 7)]


def test_32_concurrent_requests_on_one_stream(server):
    client = StreamClient(server)
    ids = [f"r{i}" for i in range(32)]
    client.send(*[start(rid, prompt(i), max_tokens=10, ignore_eos=True) for i, rid in enumerate(ids)])
    assert client.wait_ended(ids)
    for rid in ids:
        done = client.ends[rid]
        assert done.HasField("request_complete"), done
        assert done.request_complete.usage.completion_tokens == 10 == len(client.tokens[rid])
        assert done.request_complete.finish_reason == pb.FINISH_REASON_LENGTH
    for response in client.responses:
        # One SIGNAL_STEP ResultTokens per engine step, one row per request in it. A backlog of
        # steps (the engine ahead of the writer) leaves as one message: its steps in order.
        steps = [f.result_tokens.step for f in response.frames
                 if f.HasField("result_tokens") and f.result_tokens.signal == gen_pb2.SIGNAL_STEP]
        assert steps == sorted(set(steps))
        for f in response.frames:
            if f.HasField("result_tokens"):
                assert len(set(f.result_tokens.request_ids)) == len(f.result_tokens.request_ids)
        if steps:
            assert response.frames[0].HasField("result_tokens")
    # a request's last token and its RequestComplete travel in the same StreamResponse, token first
    for response in client.responses:
        rows: set[str] = set()
        for f in response.frames:
            if f.HasField("result_tokens"):
                rows.update(f.result_tokens.request_ids)
            elif f.HasField("request_complete"):
                assert f.request_complete.request_id in rows
    client.close()
    assert client.error is None


def test_abort_one_mid_decode_others_unaffected_blocks_back_to_baseline(server):
    reference = StreamClient(server)
    reference.send(*[start(f"r{i}", prompt(i), max_tokens=20, ignore_eos=True) for i in range(4)])
    assert reference.wait_ended([f"r{i}" for i in range(4)])
    reference.close()

    client = StreamClient(server, metadata=STATUS)
    client.send(*[start(f"r{i}", prompt(i), max_tokens=20, ignore_eos=True) for i in range(3)])
    client.send(start("victim", prompt(3), max_tokens=200, ignore_eos=True))
    assert client.wait(lambda c: len(c.tokens.get("victim", [])) >= 3)
    client.send(abort("victim"), abort("never-existed"))
    assert client.wait_ended(["r0", "r1", "r2", "victim"])
    assert client.ends["victim"].request_complete.finish_reason == pb.FINISH_REASON_CANCELLED
    assert len(client.tokens["victim"]) < 200
    for i in range(3):
        assert client.tokens[f"r{i}"] == reference.tokens[f"r{i}"]
    assert client.wait(lambda c: c.latest_metric("kv_blocks_used") == 0 and len(c.statuses) > 2)
    client.close()


def test_breaking_the_stream_frees_all_its_requests(server):
    client = StreamClient(server)
    client.send(*[start(f"r{i}", prompt(i), max_tokens=200, ignore_eos=True) for i in range(8)])
    assert client.wait(lambda c: len(c.tokens) == 8)
    client.cancel()
    watcher = StreamClient(server, metadata=STATUS)
    assert watcher.wait(lambda c: c.latest_metric("kv_blocks_used") == 0 and c.latest_metric("requests_running") == 0)
    watcher.close()


def test_malformed_requests_fail_alone(server):
    client = StreamClient(server)
    client.send(
        start("ok", prompt(1), max_tokens=6),
        start("vocab", [5, 999_999]),
        start("temp", [5, 6], temperature=-3.0),
        start("long", list(range(3, 300))),
        start("ok2", prompt(2), max_tokens=6),
    )
    assert client.wait_ended(["ok", "ok2", "vocab", "temp", "long"])
    assert client.ends["ok2"].HasField("request_complete")
    for rid in ("vocab", "temp", "long"):
        failed = client.ends[rid].request_failed
        assert failed.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and failed.http_status == 400, failed
    assert client.ends["long"].request_failed.reason == "PROMPT_TOO_LONG"
    assert client.ends["temp"].request_failed.reason == "INVALID_FIELD"
    assert "temperature" in client.ends["temp"].request_failed.message
    client.close()
    assert client.error is None


def test_a_start_reusing_a_running_id_ends_it_with_one_terminal_event(server):
    # Issue 13, finding 6 (internal stream): refusing only the duplicate let the running request
    # keep streaming under an id that had already received a terminal RequestFailed.
    client = StreamClient(server)
    client.send(start("dup", prompt(1), max_tokens=200, ignore_eos=True))
    assert client.wait(lambda c: len(c.tokens.get("dup", [])) >= 2)
    client.send(start("dup", prompt(2), max_tokens=5))
    assert client.wait_ended(["dup"])
    failed = client.ends["dup"].request_failed
    assert failed.code == grpc.StatusCode.ALREADY_EXISTS.value[0], failed
    tokens_at_end = len(client.tokens["dup"])
    client.send(start("after", prompt(3), max_tokens=3))  # the stream keeps serving
    assert client.wait_ended(["after"])
    assert len(client.tokens["dup"]) == tokens_at_end  # the client asserts no row after the terminal
    client.close()
    assert client.error is None


def test_streamed_input_generates_after_the_input_ends(server):
    client = StreamClient(server)
    client.send(start("s", [5, 6, 7], max_tokens=4, input_open=True))
    client.send(append("s", [8, 9], end=False))
    client.send(append("s", [10], end=True))
    assert client.wait_ended(["s"])
    assert client.ends["s"].request_complete.usage.prompt_tokens == 6
    assert len(client.tokens["s"]) == 4
    client.close()


def test_an_empty_frame_ends_the_stream_invalid_argument(server):
    client = StreamClient(server)
    client.send(gen_pb2.ClientFrame())
    assert client.wait(lambda c: c.error is not None)
    assert client.error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_frame_out_of_bounds_fails_only_its_request(server):
    client = StreamClient(server)
    big_stop = start("bad", prompt(1))
    big_stop.preprocess_input.model_kwargs.sampling.stop_token_ids.extend(range(3, 100))  # > 64 declared
    client.send(start("good", prompt(2), max_tokens=4), big_stop)
    assert client.wait_ended(["good", "bad"])
    failed = client.ends["bad"].request_failed
    assert failed.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "model_kwargs.sampling.stop_token_ids" in failed.message
    assert client.ends["good"].HasField("request_complete")
    client.close()
    assert client.error is None


def test_an_out_of_bounds_request_id_ends_the_stream_without_echoing_it(server):
    # Issue 13, finding 1: ids are repeated in every step frame; an unbounded one could push a
    # frame past the message limit and break the stream for every request on it.
    client = StreamClient(server)
    client.send(start("x" * 100_000, prompt(1)))
    assert client.wait(lambda c: c.error is not None)
    assert client.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "frames[0].preprocess_input.request_id" in client.error.details()
    assert len(client.error.details()) < 300


def test_an_undecodable_frame_ends_the_stream_invalid_argument(server):
    # Issue 13, finding 5: garbage bytes used to stop the server reading the stream without
    # ending it, so the client hung until its deadline.
    with grpc.insecure_channel(f"127.0.0.1:{server}") as channel:
        call = channel.stream_stream(
            "/mstar.generation.v1.GenerationService/Stream",
            request_serializer=lambda raw: raw, response_deserializer=gen_pb2.StreamResponse.FromString,
        )(iter([b"\x0a\xff\xff\xff\xff\x0f garbage"]), timeout=20)
        try:
            list(call)
            raise AssertionError("the stream ended OK")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
            assert "StreamRequest" in exc.details()


def test_a_long_prefill_sends_heartbeat_frames(tiny_model_dir):
    proc, port = start_server(tiny_model_dir, "--kv-blocks", "256", "--block-size", "4",
                              "--max-batched-tokens", "16")
    try:
        client = StreamClient(port)
        client.send(start("long", [(7 * j) % 500 + 3 for j in range(100)], max_tokens=2))
        assert client.wait_ended(["long"])
        # 100 prompt tokens in 16-token chunks: 6 steps prefill only, the 7th samples.
        assert client.heartbeats.get("long", 0) >= 5, client.heartbeats
        assert client.ends["long"].HasField("request_complete")
        client.close()
    finally:
        stop_server(proc)


def test_same_request_id_on_two_streams_does_not_collide(server):
    a, b = StreamClient(server), StreamClient(server)
    a.send(start("x", prompt(1), max_tokens=5, ignore_eos=True))
    b.send(start("x", prompt(2), max_tokens=7, ignore_eos=True))
    assert a.wait_ended(["x"]) and b.wait_ended(["x"])
    assert len(a.tokens["x"]) == 5 and len(b.tokens["x"]) == 7
    a.close()
    b.close()


def test_sigterm_lets_in_flight_requests_finish(tiny_model_dir):
    proc, port = start_server(tiny_model_dir, "--kv-blocks", "64", "--block-size", "4", "--grace-s", "20")
    client = StreamClient(port)
    client.send(start("long", prompt(1), max_tokens=150, ignore_eos=True))
    assert client.wait(lambda c: len(c.tokens.get("long", [])) >= 1)
    proc.send_signal(15)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert client.wait(lambda c: "long" in c.ends, 30)
        status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert client.ends["long"].HasField("request_complete")
    assert len(client.tokens["long"]) == 150
    assert stop_server(proc) == 0
