"""Stop strings: hold-back never leaks a prefix; results do not depend on chunking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.preprocess.stop import StopMatcher


def _run(stops, chunks, include=False):
    """Feed chunks; returns (emitted deltas, matched stop)."""
    matcher = StopMatcher(stops, include)
    out, stop = [], None
    for chunk in chunks:
        result = matcher.feed(chunk)
        out.append(result.text)
        if result.stop is not None:
            stop = result.stop
            break
    else:
        out.append(matcher.finish())
    return out, stop


def reference(stops, text, include=False):
    """Whole-text semantics: first end position wins, then earliest start."""
    best = None
    for s in stops:
        if s and (i := text.find(s)) >= 0:
            key = (i + len(s), i, s)
            best = key if best is None or key[:2] < best[:2] else best
    if best is None:
        return text, None
    end, start, s = best
    return text[: end if include else start], s


def test_stop_spanning_chunks():
    out, stop = _run(["STOP"], ["abc ST", "O", "P tail"])
    assert (out, stop) == (["abc ", "", ""], "STOP")


def test_stop_starting_mid_chunk_and_include():
    out, stop = _run(["</s>"], ["x</", "s>y"], include=True)
    assert ("".join(out), stop) == ("x</s>", "</s>")


def test_prefix_not_a_stop_is_released():
    out, stop = _run(["STOP"], ["abc ST", "ART"])
    assert out == ["abc ", "START", ""] and stop is None


def test_held_prefix_flushed_at_finish():
    out, stop = _run(["STOP"], ["abc ST"])
    assert out == ["abc ", "ST"] and stop is None


def test_overlapping_stops_first_end_wins():
    # "bc" completes before "abcd" would; "abc" and "bc" end together: earliest start wins.
    assert _run(["abcd", "bc"], ["xabcd"])[1] == "bc"
    assert _run(["bc", "abc"], ["xab", "cd"]) == (["x", ""], "abc")


def test_repeated_stop_prefix():
    out, stop = _run(["aab"], ["a", "a", "a", "b"])
    assert ("".join(out), stop) == ("a", "aab")


@pytest.mark.parametrize("text", ["hello world", "日本語のテキスト😀", "aaaaab"])
def test_every_split_point_equals_reference(text):
    stops = ["wor", "テキ", "😀", "aab", "ld"]
    for cut in range(len(text) + 1):
        out, stop = _run(stops, [text[:cut], text[cut:]])
        assert ("".join(out), stop) == reference(stops, text)


stop_strings = st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=4)


@settings(max_examples=500, deadline=None)
@given(stop_strings, st.text(alphabet="abcd", max_size=30), st.lists(st.integers(0, 30)), st.booleans())
def test_property_chunking_invariant_and_no_leak(stops, text, cuts, include):
    points = sorted({c for c in cuts if c <= len(text)})
    chunks = [text[a:b] for a, b in zip([0] + points, points + [len(text)], strict=True)]
    out, stop = _run(stops, chunks, include)
    assert ("".join(out), stop) == reference(stops, text, include)
    # Never leak: at every moment, what was emitted is a prefix of the final text and, if a
    # stop matched, contains no part of it (unless included).
    emitted = ""
    final, _ = reference(stops, text, include)
    for delta in out:
        emitted += delta
        assert final.startswith(emitted)
