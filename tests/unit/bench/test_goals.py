"""bench/goals.py: issue 12's targets evaluated on a run's results dict."""

from __future__ import annotations

from bench import goals


def _row(c: int, tok_s: float, itl: float = 10.0, rss: float | None = None, errors: int = 0) -> dict:
    return {"concurrency": c, "tok_s": tok_s, "itl_p50_ms": itl, "rss_peak_mb": rss, "errors": errors}


def _results(**over) -> dict:
    res = {
        "mstar": {"http": [_row(1, 100, itl=9.0, rss=900), _row(16, 450, rss=1200), _row(64, 400, rss=1500)],
                  "startup_s": 25.0},
        "llama_server": {"http": [_row(1, 110, itl=8.0, rss=500), _row(16, 300, rss=600), _row(64, 300, rss=700)]},
        "transport": {"bare": [_row(1, 1000), _row(64, 2000)], "stack": [_row(1, 400), _row(64, 1500)]},
    }
    res.update(over)
    return res


def _by_start(verdicts, prefix: str):
    return next(v for v in verdicts if v.target.startswith(prefix))


def test_every_target_is_listed_with_its_ratio_and_verdict():
    v = goals.evaluate(_results())
    tok1 = _by_start(v, "tok/s through Envoy vs llama-server at 1 stream")
    assert round(tok1.ratio, 3) == round(100 / 110, 3) and tok1.met is False and tok1.verdict == "missed"
    itl1 = _by_start(v, "ITL p50")
    assert itl1.ratio == 8.0 / 9.0 and itl1.met is False
    tok16 = _by_start(v, "tok/s through Envoy vs llama-server at 16")
    assert tok16.ratio == 1.5 and tok16.met is True  # exactly the target is met
    tok64 = _by_start(v, "tok/s through Envoy vs llama-server at 64")
    assert round(tok64.ratio, 3) == 1.333 and tok64.met is False
    rss = _by_start(v, "RSS")
    assert rss.ratio == 1500 / 700 and rss.met is False and "64 streams" in rss.value  # the worst level
    transport = _by_start(v, "transport")
    assert transport.ratio == 0.4 and transport.met is False and "1 stream" in transport.value
    ready = _by_start(v, "`make run` ready")
    assert ready.met is True and ready.ratio == 25.0 / 30.0
    assert ready.value == "25.0 s"
    engine = _by_start(v, "engine alone")
    assert engine.met is None and engine.verdict == "not measured"


def test_faster_itl_and_lean_memory_meet_their_targets():
    res = _results()
    res["mstar"]["http"][0] = _row(1, 120, itl=6.0, rss=900)
    res["llama_server"]["http"] = [_row(1, 110, itl=8.0, rss=500), _row(16, 300, rss=600), _row(64, 300, rss=750)]
    v = goals.evaluate(res)
    assert _by_start(v, "tok/s through Envoy vs llama-server at 1 stream").met is True
    assert _by_start(v, "ITL p50").met is True
    assert _by_start(v, "RSS").ratio == 2.0 and _by_start(v, "RSS").met is True


def test_rss_pairs_each_round_with_the_same_round_of_the_peer():
    # Both systems grow from round 1 to round 2; the best-round rows (by tok/s) can be different
    # rounds. Round 1 here is 2.2x although round 2 and the best rows are under 2x.
    res = _results()
    res["mstar"]["http"] = [dict(_row(1, 100, rss=950), rounds=[_row(1, 90, rss=880), _row(1, 100, rss=950)])]
    res["llama_server"]["http"] = [dict(_row(1, 110, rss=700), rounds=[_row(1, 110, rss=400), _row(1, 105, rss=700)])]
    rss = _by_start(goals.evaluate(res), "RSS")
    assert rss.ratio == 880 / 400 and rss.met is False and rss.value.startswith("worst at 1 stream, round 1")


def test_missing_or_failed_measurements_are_not_measured_never_met():
    res = _results(llama_server={"skipped": "not built"}, transport={})
    res["mstar"]["http"][1]["errors"] = 3
    del res["mstar"]["startup_s"]
    v = goals.evaluate(res)
    for prefix in ("tok/s", "ITL p50", "RSS", "transport", "`make run` ready"):
        assert all(x.met is None and x.ratio is None for x in v if x.target.startswith(prefix)), prefix


def test_a_start_on_the_cache_as_found_says_so():
    res = _results()
    res["mstar"]["startup_kind"] = "as found"
    assert _by_start(goals.evaluate(res), "`make run` ready").value == "25.0 s (as found)"


def test_grpc_is_compared_when_http_failed():
    res = _results()
    res["mstar"]["grpc"] = res["mstar"].pop("http")
    assert _by_start(goals.evaluate(res), "tok/s through Envoy vs llama-server at 16").ratio == 1.5


def test_the_table_has_one_line_per_target():
    lines = goals.render(_results())
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| target")]
    assert len(rows) == len(goals.evaluate(_results())) == 8
    assert any("**met**" in ln for ln in rows) and any("**missed**" in ln for ln in rows)
    assert any("not measured" in ln for ln in rows)
