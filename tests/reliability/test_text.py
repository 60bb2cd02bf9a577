"""R14–R16: text assembly under adversarial token boundaries, with the real tokenizer.

The per-token pipeline the preprocess service runs (Detokenizer -> StopMatcher, fed one token at
a time, exactly as RequestRun.events does) is checked against one-shot oracles over generated
texts; the end-to-end stream == unary property with stop strings runs on the real model (slow).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc

from services.preprocess.detokenizer import Detokenizer
from services.preprocess.model import load_model
from services.preprocess.stop import StopMatcher
from tests.reliability import probe
from tests.reliability.conftest import FUZZ_EXAMPLES

pytestmark = pytest.mark.reliability

REPLACEMENT = "\ufffd"
# Characters that tokenize into many shapes: ASCII, accents, CJK, emoji (4-byte, ZWJ sequences).
ALPHABET = st.sampled_from(list("ab ,.\n") + ["é", "ß", "中", "文", "字", "😀", "👩‍💻", "🇫🇷", "ñ", "→"])
TEXTS = st.lists(ALPHABET, min_size=1, max_size=40).map("".join)
# The pipeline is cheap; a tenth of the fuzz budget keeps the default run fast.
EXAMPLES = max(20, FUZZ_EXAMPLES // 10)


@pytest.fixture(scope="module")
def tok():
    return load_model("default").tokenizer


def _stream(tok, ids: list[int], stops: tuple[str, ...] = ()) -> tuple[list[str], str | None]:
    """Feed ids one at a time like RequestRun.events; return the emitted deltas and the stop."""
    detok, matcher, deltas = Detokenizer(tok.token_bytes), StopMatcher(stops), []
    for token in ids:
        result = matcher.feed(detok.feed([token]))
        deltas.append(result.text)
        if result.stop is not None:
            return deltas, result.stop
    result = matcher.feed(detok.finish())
    deltas += [result.text, matcher.finish()]
    return deltas, result.stop


def _expected_cut(text: str, stops: tuple[str, ...]) -> int:
    """Oracle: the stop occurrence that completes first (then starts first) cuts the text."""
    found = [(text.find(s) + len(s), text.find(s)) for s in stops if s and s in text]
    return min(found)[1] if found else len(text)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS, data=st.data())
def test_r14_stop_strings_across_token_boundaries(tok, text, data):
    ids = tok.encode(text)
    decoded = tok.decode(ids)
    # Stops cut from the decoded text itself: they start mid-token, span tokens, overlap each other.
    n = data.draw(st.integers(1, 3))
    stops = []
    for _ in range(n):
        start = data.draw(st.integers(0, len(decoded) - 1))
        stops.append(decoded[start:start + data.draw(st.integers(1, 6))])
    stops.append(data.draw(st.sampled_from(["zz", "a,", "中文", "😀a"])))  # may not occur at all
    deltas, stop = _stream(tok, ids, tuple(stops))
    cut = _expected_cut(decoded, tuple(stops))
    assert "".join(deltas) == decoded[:cut], (stops, deltas)
    assert (stop is not None) == (cut < len(decoded))
    # No prefix of the matched stop was ever streamed: nothing at or after the cut went out.
    assert sum(len(d) for d in deltas) == cut


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS)
def test_r15_multibyte_one_token_at_a_time(tok, text):
    ids = tok.encode(text)
    deltas, _ = _stream(tok, ids)
    assert "".join(deltas) == tok.decode(ids) == text
    assert all(REPLACEMENT not in d for d in deltas), deltas


def _byte_token(tok, byte: int) -> int:
    """The byte-level vocabulary has one token per byte value (byte fallback)."""
    hits = [t for t in range(tok.vocab_size) if tok.token_bytes(t) == bytes([byte])]
    assert hits, f"no single-byte token for {byte:#x}"
    return hits[0]


@pytest.mark.parametrize("bad,tail", [
    ([0xC3], "ok"),                    # a lead byte followed by ASCII instead of its continuation
    ([0x80], "ok"),                    # a lone continuation byte
    ([0xF0, 0x9F], "ok"),              # an emoji cut after 2 of its 4 bytes
    ([0xE4, 0xB8], ""),                # a CJK character cut at the very end of the output
])
def test_r16_invalid_bytes_become_replacement_and_stream_continues(tok, bad, tail):
    ids = [_byte_token(tok, b) for b in bad] + tok.encode(tail)
    deltas, _ = _stream(tok, ids)
    text = "".join(deltas)
    assert text == tok.decode(ids)
    assert text.startswith(REPLACEMENT) and text.endswith(tail)
    assert text.count(REPLACEMENT) == 1  # one U+FFFD per broken sequence (maximal subpart)


@pytest.mark.slow
def test_r14_stream_equals_unary_with_stops_on_the_real_model(model_rig):
    """Greedy output T; stops cut out of T at several offsets: every streamed concatenation
    equals the unary text, and both equal T up to the stop."""

    async def scenario():
        async with grpc.aio.insecure_channel(model_rig.grpc) as channel:
            stub = api_grpc.InferenceServiceStub(channel)
            prompt = "List five fruits, separated by commas:"
            base = await stub.Generate(api.GenerateRequest(input=probe.text_input(prompt, max_tokens=24)))
            full = base.text
            assert len(full) > 12, full
            stops = [full[k:k + 4] for k in (3, 7, len(full) // 2)]

            async def pair(stop):
                inp = probe.text_input(prompt, max_tokens=24, stop=[stop])
                unary = await stub.Generate(api.GenerateRequest(input=inp))
                record = await probe.collect_stream(stub.GenerateStream(api.GenerateStreamRequest(input=inp)))
                return stop, unary.text, record

            return full, await asyncio.gather(*(pair(s) for s in stops))

    full, results = model_rig.run(scenario(), timeout_s=180)
    for stop, unary_text, record in results:
        record.assert_one_terminal()
        assert record.text == unary_text == full[:full.find(stop)], (stop, record.text, unary_text)
        assert record.complete.stop_reason == stop
    model_rig.check_recovered()
