"""Load test: N concurrent Gradio API clients against a local server for a fixed time.

    python -m engine loadtest --clients 20 --duration 60            # starts `python app.py` itself
    python -m engine loadtest --url http://127.0.0.1:7860/ --pid 1234   # an already running server

Each client is a ``gradio_client.Client`` in its own thread that calls the ``/search`` endpoint in a
loop with a mix of queries (text only, reference image + text, image only; several methods), uploading
real gallery photos as references. After ``--warmup`` seconds of load (caches fill, the allocator settles)
it measures ``--duration`` seconds and prints requests/s, p50/p95/p99 latency, the error count and the
server's peak resident memory, plus memory over time so that growth after warm-up is visible.
Only loopback servers are accepted: this is a local test tool, not a traffic generator.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional
from urllib.parse import urlparse

from .config import ROOT, Settings
from .errors import InputError
from .images import IMAGE_EXTENSIONS

TEXTS = ["the same but red", "as a dog", "at night", "a bigger one", "a photo of a cat", "in the snow",
         "with flowers", "a red apple", "the building at night", "made of wood"]


# -- measurements ---------------------------------------------------------------------------------
def percentile(values: List[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _children(pid: int) -> List[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def rss_bytes(pid: int, include_children: bool = True) -> int:
    """Resident memory of a process (and its descendants) from /proc; 0 when it has gone."""
    total = 0
    todo = [pid]
    seen = set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
        if include_children:
            todo.extend(_children(p))
    return total


class MemorySampler(threading.Thread):
    """Samples a process's RSS every ``every`` seconds into ``samples`` [(t, bytes)]."""

    def __init__(self, pid: int, every: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.samples: List[tuple] = []
        self._halt = threading.Event()
        self.t0 = time.perf_counter()

    def run(self):
        self.t0 = time.perf_counter()
        while not self._halt.is_set():
            self.samples.append((time.perf_counter() - self.t0, rss_bytes(self.pid)))
            self._halt.wait(self.every)

    def stop(self):
        self._halt.set()
        self.join(timeout=5)
        self.samples.append((time.perf_counter() - self.t0, rss_bytes(self.pid)))


@dataclass
class Stats:
    done: List[tuple] = field(default_factory=list)  # (finish time, latency s) of successful requests
    errors: List[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ok(self, dt: float):
        with self.lock:
            self.done.append((time.perf_counter(), dt))

    def fail(self, msg: str):
        with self.lock:
            self.errors.append(msg)


def memory_report(samples: List[tuple], warmup_s: float, end_s: Optional[float] = None) -> Dict[str, float]:
    """Peak RSS and growth after warm-up: the mean of the last quarter of the post-warm-up samples minus
    the mean of its first quarter (MB); a server that leaks shows a steadily positive growth."""
    mb = [(t, b / 2**20) for t, b in samples if b > 0]
    if not mb:
        return {"peak_mb": 0.0, "start_mb": 0.0, "end_mb": 0.0, "growth_mb": 0.0}
    after = [m for t, m in mb if t >= warmup_s and (end_s is None or t <= end_s)] or [m for _, m in mb]
    q = max(1, len(after) // 4)
    start, end = sum(after[:q]) / q, sum(after[-q:]) / q
    return {"peak_mb": max(m for _, m in mb), "start_mb": start, "end_mb": end, "growth_mb": end - start}


# -- the server ---------------------------------------------------------------------------------
def check_loopback(url: str) -> str:
    host = urlparse(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise InputError(f"the load test only targets a local server (127.0.0.1 / localhost), not {host!r}")
    return url if url.endswith("/") else url + "/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout: float, proc: Optional[subprocess.Popen] = None) -> float:
    """Seconds until the server answers its config route; raises if it exits or times out."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "config", timeout=5) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"the server at {url} was not ready within {timeout:.0f} s")


def spawn_app(port: int, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port),
               GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    log = open(log_path, "wb")
    return subprocess.Popen([sys.executable, "app.py"], cwd=str(ROOT), env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop_app(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


# -- the clients ----------------------------------------------------------------------------------
def gallery_images(folder: str, n: int = 64, seed: int = 0) -> List[str]:
    files = sorted(str(p) for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    random.Random(seed).shuffle(files)
    return files[:n]


class Deadline:
    """When the timed window ends; unset (infinite) while the clients connect."""

    def __init__(self):
        self.at = float("inf")

    def passed(self) -> bool:
        return time.perf_counter() >= self.at


def client_loop(url: str, deadline: Deadline, stats: Stats, images: List[str], methods: List[str], k: int,
                seed: int, ready: threading.Barrier) -> None:
    from gradio_client import Client, handle_file

    rng = random.Random(seed)
    try:
        client = Client(url, verbose=False, download_files=False)
    except Exception as exc:  # noqa: BLE001 - reported as an error of this client
        stats.fail(f"connect: {exc.__class__.__name__}: {str(exc)[:200]}")
        ready.abort()
        return
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        return
    while not deadline.passed():
        kind = rng.random()
        method = rng.choice(methods)
        text = rng.choice(TEXTS)
        image = handle_file(rng.choice(images)) if images and kind > 0.25 else None
        if image is None:
            method, text = "text", text
        elif kind > 0.9:
            method, text = "image", ""
        t = time.perf_counter()
        try:
            out = client.predict(image=image, text=text, method=method, k=k, api_name="/search")
            raw = json.loads(out[2]) if isinstance(out, (list, tuple)) and len(out) > 2 else None
            if raw is not None and len(raw.get("results", [])) == 0:
                raise RuntimeError("empty result list")
            stats.ok(time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001 - every failure counts as an error
            stats.fail(f"{exc.__class__.__name__}: {str(exc)[:200]}")


def run_load(url: str, clients: int, duration: float, pid: Optional[int], images: List[str],
             methods: List[str], k: int = 12, warmup: float = 60.0, sample_every: float = 1.0,
             out=None) -> dict:
    """Drive the server for ``warmup`` + ``duration`` seconds and return the summary (also printed).

    Throughput and latency count the requests that finished inside the measured window (after the
    warm-up); errors count every failed request, warm-up and the in-flight tail included. Memory is
    sampled from the start; its growth figure covers the measured window."""
    stats = Stats()
    sampler = MemorySampler(pid, sample_every) if pid else None
    ready = threading.Barrier(clients + 1)  # clients connect first, then all start together
    deadline = Deadline()
    threads = []

    def worker(i):
        client_loop(url, deadline, stats, images, methods, k, seed=1000 + i, ready=ready)

    for i in range(clients):
        th = threading.Thread(target=worker, args=(i,), daemon=True)
        th.start()
        threads.append(th)
    try:
        ready.wait(timeout=120)
    except threading.BrokenBarrierError:
        pass
    if sampler:
        sampler.start()
    t0 = time.perf_counter()
    window = (t0 + warmup, t0 + warmup + duration)
    deadline.at = window[1]
    for th in threads:
        th.join(timeout=warmup + duration + 120)
    if sampler:
        sampler.stop()
    lat = [dt * 1e3 for end, dt in stats.done if window[0] <= end <= window[1]]
    mem = memory_report(sampler.samples if sampler else [], warmup, warmup + duration)
    summary = {
        "clients": clients, "warmup_s": warmup, "duration_s": duration, "requests": len(lat),
        "requests_total": len(stats.done), "errors": len(stats.errors),
        "requests_per_s": round(len(lat) / duration, 2),
        "latency_ms": {"p50": round(percentile(lat, 50), 1), "p95": round(percentile(lat, 95), 1),
                       "p99": round(percentile(lat, 99), 1), "max": round(max(lat), 1) if lat else float("nan")},
        "server_rss_mb": {k_: round(v, 1) for k_, v in mem.items()},
        "rss_timeline_mb": [(round(t, 1), round(b / 2**20, 1)) for t, b in (sampler.samples if sampler else [])],
        "error_examples": sorted(set(stats.errors))[:5],
    }
    print_summary(summary, warmup, out)
    return summary


def print_summary(s: dict, warmup: float, out=None) -> None:
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"clients            {s['clients']}")
    p(f"duration           {s['duration_s']:g} s measured after {s['warmup_s']:g} s of warm-up load")
    p(f"requests           {s['requests']} in the measured window ({s['requests_per_s']} requests/s), "
      f"{s['requests_total']} in all")
    p(f"errors             {s['errors']} (all requests, warm-up included)")
    lat = s["latency_ms"]
    p(f"latency (ms)       p50 {lat['p50']}  p95 {lat['p95']}  p99 {lat['p99']}  max {lat['max']}")
    m = s["server_rss_mb"]
    if s["rss_timeline_mb"]:
        p(f"server RSS (MB)    peak {m['peak_mb']}  measured window: first quarter {m['start_mb']} -> last quarter "
          f"{m['end_mb']} (growth {m['growth_mb']:+.1f})")
        tl = s["rss_timeline_mb"]
        step = max(1, len(tl) // 12)
        p("RSS over time      " + "  ".join(f"{t:g}s:{mb:g}" for t, mb in tl[::step]))
    for e in s["error_examples"]:
        p(f"error example      {e}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine loadtest", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="a running local server; default: start `python app.py` on a free port")
    p.add_argument("--pid", type=int, default=None, help="process id of the server at --url, for its memory")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--warmup", type=float, default=60.0,
                   help="seconds of load before the measured window (excluded from every figure but errors)")
    p.add_argument("--methods", default="sum,image,text", help="comma-separated composers to mix")
    p.add_argument("--k", type=int, default=12)
    p.add_argument("--images", default=None, help="folder of reference photos (default: the gallery)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for a started server")
    p.add_argument("--json", default=None, help="also write the summary to this JSON file")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.clients < 1 or args.duration <= 0 or args.warmup < 0:
        raise InputError("--clients must be >= 1, --duration > 0 and --warmup >= 0")
    images = gallery_images(args.images or Settings().gallery)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    proc = None
    pid = args.pid
    try:
        if args.url:
            url = check_loopback(args.url)
            wait_ready(url, 30)
        else:
            port = free_port()
            url = f"http://127.0.0.1:{port}/"
            log_path = Path(tempfile.gettempdir()) / f"cis-loadtest-server-{port}.log"
            proc = spawn_app(port, log_path)
            pid = proc.pid
            ready_s = wait_ready(url, args.startup_timeout, proc)
            print(f"server             python app.py, ready in {ready_s:.1f} s, RSS at ready "
                  f"{rss_bytes(pid) / 2**20:.0f} MB (log: {log_path.name})")
        summary = run_load(url, args.clients, args.duration, pid, images, methods, k=args.k, warmup=args.warmup)
    finally:
        if proc is not None:
            stop_app(proc)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0 if summary["errors"] == 0 and summary["requests"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
