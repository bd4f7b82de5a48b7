"""The load-test tool (a very short run against an in-process server) and the Gradio queue limits."""
from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest


def test_percentile_matches_numpy_and_memory_growth():
    from engine.loadtest import memory_report, percentile

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 1001):
        v = rng.exponential(100, n).tolist()
        for q in (0, 50, 95, 99, 100):
            assert percentile(v, q) == pytest.approx(float(np.percentile(v, q)))
    mb = 2**20
    flat = [(t, 500 * mb) for t in range(20)]
    assert memory_report(flat, warmup_s=5)["growth_mb"] == pytest.approx(0.0)
    leak = [(t, (500 + 2 * t) * mb) for t in range(20)]  # 2 MB/s
    rep = memory_report(leak, warmup_s=4)
    after = [500 + 2 * t for t in range(4, 20)]  # 16 samples, quarters of 4
    assert rep["growth_mb"] == pytest.approx(np.mean(after[-4:]) - np.mean(after[:4]))
    assert rep["peak_mb"] == pytest.approx(538)


def test_only_loopback_servers_are_accepted():
    from engine.errors import InputError
    from engine.loadtest import check_loopback

    assert check_loopback("http://127.0.0.1:7860") == "http://127.0.0.1:7860/"
    assert check_loopback("http://localhost:1/x/") == "http://localhost:1/x/"
    assert check_loopback("http://[::1]:7860/")
    for url in ("http://example.com/", "http://10.0.0.2:7860/", "http://0.0.0.0:7860/", "https://hf.space/x"):
        with pytest.raises(InputError, match="local server"):
            check_loopback(url)


def test_short_load_run_reports_throughput_latency_and_memory(gallery_engine, tmp_path, capsys):
    """Both routes of one server (POST /api/search, then /search through Gradio's queue), one compute limit."""
    from demo.launch import serve_in_process
    from demo.ui import build_demo
    from engine.loadtest import main

    demo = build_demo(gallery_engine.settings, engine=gallery_engine)
    url = serve_in_process(demo, gallery_engine)
    try:
        out = tmp_path / "summary.json"
        rc = main(["--url", url, "--pid", str(os.getpid()), "--clients", "2", "--duration", "4", "--warmup", "1",
                   "--json", str(out), "--compute-seconds", "1"], engine=gallery_engine)
    finally:
        demo.close()
    printed = capsys.readouterr().out
    full = json.loads(out.read_text())
    assert rc == 0 and list(full["routes"]) == ["rest", "gradio"], printed
    c = full["compute"]  # the compute limit measured in the same run: cores / the mean single-query time
    assert c["queries"] >= 40 and c["ms_per_query"] > 0 and c["cores"] >= 1
    assert c["limit_qps"] == pytest.approx(c["cores"] * 1e3 / c["ms_per_query"], rel=0.02)
    for route, s in full["routes"].items():
        assert s["route"] == route and s["errors"] == 0 and s["requests"] >= 2, (s, printed)
        assert s["requests_per_s"] == pytest.approx(s["requests"] / s["duration_s"], rel=0.05)
        lat = s["latency_ms"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
        assert s["server_rss_mb"]["peak_mb"] > 100  # this process holds torch and the backbone
        assert len(s["rss_timeline_mb"]) >= 3
        assert s["compute"] == c
        assert s["served_limit_ratio"] == pytest.approx(s["requests_per_s"] / c["limit_qps"], rel=0.05)
        assert f"served/limit ratio {s['served_limit_ratio']}" in printed
        assert 0 <= s["generator_cpu_cores"] < 4 and len(s["load_average"]) == 2
    for word in ("requests/s", "p50", "p95", "p99", "errors", "peak", "compute limit", "load generator CPU",
                 "route              rest: POST /api/search", "route              gradio: /search",
                 "load average", "targets"):
        assert word in printed
    table = printed[printed.index("route    requests/s"):].splitlines()
    assert table[1].startswith("rest ") and table[2].startswith("gradio ")


def test_a_full_queue_answers_busy_and_the_server_recovers(gallery_engine, launch_demo, monkeypatch):
    """With CIS_QUEUE_MAX=1 and slow searches, extra requests get HTTP 503 "Queue is full" at once,
    the accepted ones finish, and a request after the burst succeeds."""
    import httpx

    import demo.handlers as h
    from demo.ui import build_demo
    from engine.config import Settings

    real_search = h.run_request

    def slow_search(*args, **kwargs):
        time.sleep(1.5)
        return real_search(*args, **kwargs)

    monkeypatch.setattr(h, "run_request", slow_search)
    monkeypatch.setenv("CIS_QUEUE_MAX", "1")
    demo = build_demo(Settings(), engine=gallery_engine)  # CIS_QUEUE_MAX reaches the page through Settings
    url = launch_demo(demo, gallery_engine) + "/"
    data = [None, "a red apple", "text", 0.5, 2, False, "none", 64, True]  # raw HTTP sends every input
    codes, bodies, lock = [], [], threading.Lock()

    def submit():
        r = httpx.post(f"{url}gradio_api/call/search", json={"data": data}, timeout=30)
        with lock:
            codes.append(r.status_code)
            bodies.append(r.text)

    try:
        threads = [threading.Thread(target=submit) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert codes.count(503) >= 1, codes
        assert all("Queue is full" in b for c, b in zip(codes, bodies) if c == 503)
        assert codes.count(200) >= 1, codes
        accepted = [json.loads(b)["event_id"] for c, b in zip(codes, bodies) if c == 200]
        with httpx.stream("GET", f"{url}gradio_api/call/search/{accepted[0]}", timeout=120) as s:
            events = [line for line in s.iter_lines() if line.startswith("event:")]
        assert events and events[-1].strip() == "event: complete", events
        deadline = time.time() + 30  # once the burst has drained, requests are accepted again
        while True:
            after = httpx.post(f"{url}gradio_api/call/search", json={"data": data}, timeout=30)
            if after.status_code == 200 or time.time() > deadline:
                break
            time.sleep(0.5)
        assert after.status_code == 200
    finally:
        demo.close()
