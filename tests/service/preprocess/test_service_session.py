"""Session multiplexing, admission under overload, backend death, file_path safety."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from conftest import REPO, Preprocess, free_port, start_generation
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import messages_pb2 as pb

from services.preprocess.admission import Admission, AdmissionLimits


def _start(rid, text="alpha beta gamma delta epsilon", max_tokens=20):
    return api.SessionRequest(
        start=pb.PreprocessInput(
            request_id=rid,
            text=text,
            model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=max_tokens)),
        )
    )


class SessionClient:
    """Drives a Session from a queue of outgoing messages."""

    def __init__(self, stub, timeout=30):
        self.out: queue.Queue = queue.Queue()
        self.call = stub.Session(iter(self.out.get, None), timeout=timeout)

    def send(self, msg):
        self.out.put(msg)

    def close(self):
        self.out.put(None)


def test_cancel_one_of_eight(fake_stack):
    client = SessionClient(fake_stack.stub)
    for i in range(8):
        client.send(_start(f"r{i}", max_tokens=300))
    ended: dict[str, str] = {}
    text: dict[str, str] = {}
    for event in client.call:
        kind = event.WhichOneof("event")
        if kind == "chunk":
            text[event.chunk.request_id] = text.get(event.chunk.request_id, "") + event.chunk.text
            if event.chunk.request_id == "r3" and event.chunk.index == 2:
                client.send(api.SessionRequest(cancel=api.SessionCancel(request_id="r3")))
        elif kind in ("complete", "failed"):
            rid = getattr(event, kind).request_id
            ended[rid] = kind if kind == "failed" else pb.FinishReason.Name(event.complete.finish_reason)
            if len(ended) == 8:
                client.close()
    assert ended.pop("r3") == "FINISH_REASON_CANCELLED"
    assert set(ended.values()) == {"FINISH_REASON_LENGTH"} and len(ended) == 7
    assert all(len(text[f"r{i}"]) > len(text["r3"]) for i in range(8) if i != 3)


def test_overload_is_fast_and_admitted_finish(loop, model):
    from fake_generation import start_fake

    server, fake, port = loop.run(start_fake(step_s=0.01))
    pre = Preprocess(loop, model, f"127.0.0.1:{port}", admission=Admission(AdmissionLimits(max_requests=4)))
    pre.wait_healthy()
    try:
        results: list = [None] * 16

        def one(i):
            t0 = time.monotonic()
            try:
                r = pre.stub.Generate(
                    api.GenerateRequest(
                        input=pb.PreprocessInput(
                            text="one two three",
                            model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=30)),
                        )
                    ),
                    timeout=30,
                )
                results[i] = ("ok", r.complete.usage.completion_tokens, time.monotonic() - t0)
            except grpc.RpcError as e:
                results[i] = (e.code(), e.trailing_metadata(), time.monotonic() - t0)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        ok = [r for r in results if r[0] == "ok"]
        refused = [r for r in results if r[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert len(ok) >= 4 and len(ok) + len(refused) == 16 and refused
        assert all(r[1] == 30 for r in ok)
        assert max(r[2] for r in refused) < 0.2 + min(r[2] for r in ok)
        assert any(k == "grpc-status-details-bin" for k, _ in refused[0][1])
    finally:
        pre.close()
        loop.run(server.stop(None))


def _generation_process(port):
    """The real generation service (null engine) if it exists, else the contract fake."""
    if (REPO / "services/generation/__main__.py").exists() and (
        REPO / "services/generation/servicer.py"
    ).exists():
        return start_generation("--model", "default", "--null-engine", port=port)[0]
    fake = Path(__file__).parent / "fake_generation.py"
    return subprocess.Popen(
        [sys.executable, str(fake), str(port), "0.01"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_generation_killed_mid_stream(loop, model):
    port = free_port()
    proc = _generation_process(port)
    pre = Preprocess(loop, model, f"127.0.0.1:{port}")
    try:
        pre.wait_healthy(120)
        calls = [
            pre.stub.GenerateStream(
                api.GenerateStreamRequest(
                    input=pb.PreprocessInput(
                        text="a b c d",
                        model_kwargs=pb.ModelKwargs(
                            sampling=pb.SamplingParams(max_tokens=8000, ignore_eos=True)
                        ),
                    )
                ),
                timeout=60,
            )
            for _ in range(4)
        ]
        iters = [iter(c) for c in calls]
        for it in iters:
            assert next(it).HasField("accepted")
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        for it in iters:
            last = list(it)[-1]
            assert last.failed.code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert time.monotonic() - t0 < 5
        with pytest.raises(grpc.RpcError) as info:
            pre.stub.Generate(api.GenerateRequest(input=pb.PreprocessInput(text="x")), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        proc.kill()
        proc.wait()
        pre.close()


def test_file_path_traversal_rejected(loop, model, tmp_path):
    from fake_generation import start_fake

    root = tmp_path / "root"
    root.mkdir()
    (root / "ok.txt").write_text("allowed text")
    (root / "link").symlink_to("/etc/passwd")
    (root / "dirlink").symlink_to(tmp_path)
    (tmp_path / "secret.txt").write_text("secret")
    os.mkfifo(root / "fifo")
    (root / "big.txt").write_bytes(b"x" * 2048)
    server, _, port = loop.run(start_fake())
    from services.preprocess.limits import Limits

    pre = Preprocess(loop, model, f"127.0.0.1:{port}", file_root=root, limits=Limits(max_file_bytes=1024))
    pre.wait_healthy()

    def run(path):
        inp = pb.PreprocessInput(model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=2)))
        inp.prompt_parts.add(modality=pb.MODALITY_TEXT, file_path=path)
        return pre.stub.Generate(api.GenerateRequest(input=inp), timeout=10)

    try:
        assert run("ok.txt").text == "allowed text"
        assert run(str(root / "ok.txt")).text == "allowed text"
        for bad in [
            "/etc/passwd",
            "../secret.txt",
            "sub/../../secret.txt",
            "link",
            "dirlink/secret.txt",
            "fifo",
            "big.txt",
            str(tmp_path / "secret.txt"),
            "missing.txt",
        ]:
            with pytest.raises(grpc.RpcError) as info:
                run(bad)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, bad
        with pytest.raises(grpc.RpcError) as info:
            run("")  # out of the declared bounds (min_len 1): refused before the file reader
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        pre.close()
        loop.run(server.stop(None))
