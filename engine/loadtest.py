"""Load test: N concurrent API clients against a local server for a fixed time, beside the compute limit.

    python -m engine loadtest --clients 20 --duration 45            # starts `python app.py` itself
    python -m engine loadtest --url http://127.0.0.1:7860/ --pid 1234   # an already running server

Each client is a thread with one keep-alive HTTP connection that calls the ``/search`` endpoint through
Gradio's queue (``POST /gradio_api/call/search``, then its event stream) in a loop with a mix of queries
(text only, reference image + text, image only; several methods), the reference photos uploaded once at the
start as a browser does once per chosen photo. Plain ``http.client`` on loopback keeps the generator's own
CPU low (``gradio_client`` spent over a core creating SSL contexts); the generator reports its CPU use.

Before the load, the same query mix runs in this process on the same engine, one query at a time on one
thread with the image features cached (as the server's are after warm-up): its mean time per query gives
the compute limit, ``cores / time``, the most queries per second this machine could answer. After
``--warmup`` seconds of load (caches fill, the allocator settles) it measures ``--duration`` seconds and
prints requests/s, p50/p95/p99 latency, the error count, the compute limit, the line
``served/limit ratio R``, the generator's CPU use and the server's peak resident memory, plus memory over
time so that growth after warm-up is visible. Only loopback servers are accepted: this is a local test
tool, not a traffic generator.
"""
from __future__ import annotations

import argparse
import base64
import http.client
import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional
from urllib.parse import urlparse

from .config import ROOT, Settings, child_environment
from .errors import InputError
from .images import IMAGE_EXTENSIONS, configure as configure_decoding
from .sysinfo import free_port, load_average

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
    env = child_environment(GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port),
                            GRADIO_ANALYTICS_ENABLED="False")
    env.setdefault("HF_HUB_OFFLINE", "1")  # the server never waits for the hub unless the caller set it
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


class ApiClient:
    """One keep-alive HTTP connection to a local Gradio server's queue API (no SSL, no per-call set-up)."""

    def __init__(self, url: str, timeout: float = 300.0):
        u = urlparse(url)
        self.host, self.port, self.prefix = u.hostname, u.port or 80, u.path.rstrip("/")
        self.timeout, self.conn = timeout, None
        self.session = uuid.uuid4().hex[:11]  # one Gradio session per client, as one browser tab keeps

    def _request(self, method: str, path: str, body: bytes = None, headers: dict = None):
        for attempt in (0, 1):  # a kept-alive connection the server has closed is reopened once
            reused = self.conn is not None
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, self.prefix + path, body=body, headers=headers or {})
                r = self.conn.getresponse()
                return r.status, r.read()
            except (http.client.HTTPException, OSError):
                self.close()
                if attempt or not reused:
                    raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def upload(self, path: str) -> dict:
        """Upload a file; returns the FileData the API takes for it."""
        boundary = uuid.uuid4().hex
        name = Path(path).name
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + Path(path).read_bytes() + \
            f"\r\n--{boundary}--\r\n".encode()
        status, data = self._request("POST", "/gradio_api/upload", body,
                                     {"Content-Type": f"multipart/form-data; boundary={boundary}"})
        if status != 200:
            raise RuntimeError(f"upload: HTTP {status}")
        return {"path": json.loads(data)[0], "orig_name": name, "meta": {"_type": "gradio.FileData"}}

    def call(self, api: str, data: list):
        """Submit to the queue and read the event stream; returns the output list or raises."""
        status, body = self._request("POST", f"/gradio_api/call/{api}", json.dumps({"data": data, "session_hash": self.session}).encode(),
                                     {"Content-Type": "application/json"})
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:120].decode(errors='replace')}")
        event_id = json.loads(body)["event_id"]
        status, stream = self._request("GET", f"/gradio_api/call/{api}/{event_id}")
        event = None
        for line in stream.decode(errors="replace").splitlines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event in ("complete", "error"):
                payload = line.split(":", 1)[1].strip()
                if event == "error":
                    raise RuntimeError(f"error event: {payload[:160]}")
                return json.loads(payload)
        raise RuntimeError(f"no result in the event stream (HTTP {status})")

    def post_json(self, path: str, payload: dict) -> dict:
        """POST a JSON body (the REST route ``/api/search``); returns the decoded reply or raises."""
        status, body = self._request("POST", path, json.dumps(payload).encode(), {"Content-Type": "application/json"})
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:160].decode(errors='replace')}")
        return json.loads(body)


def query_mix(rng: random.Random, images: List, methods: List[str]):
    """One query of the mix: (reference or None, text, method). A quarter text only, a tenth image only,
    the rest reference + text with one of ``methods``."""
    kind = rng.random()
    method, text = rng.choice(methods), rng.choice(TEXTS)
    image = rng.choice(images) if images and kind > 0.25 else None
    if image is None:
        return None, text, "text"
    if kind > 0.9:
        return image, "", "image"
    return image, text, method


def client_loop(url: str, deadline: Deadline, stats: Stats, images: List, methods: List[str], k: int,
                seed: int, ready: threading.Barrier, route: str = "gradio") -> None:
    rng = random.Random(seed)
    client = ApiClient(url)
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        return
    while not deadline.passed():
        image, text, method = query_mix(rng, images, methods)
        t = time.perf_counter()
        try:
            if route == "rest":  # the same arguments as the page's search: explanation on, reference left out
                raw = client.post_json("/api/search", {"image": image, "text": text, "method": method, "alpha": 0.5,
                                                       "k": k, "expand": "none", "nqe": 64, "explain": True})
            else:
                out = client.call("search", [image, text, method, 0.5, k, False, "none", 64, True])
                raw = json.loads(out[2]) if isinstance(out, list) and len(out) > 2 and out[2] else None
            if raw is None or len(raw.get("results", [])) == 0:
                raise RuntimeError("empty result list")
            stats.ok(time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001 - every failure counts as an error
            stats.fail(f"{exc.__class__.__name__}: {str(exc)[:200]}")
    client.close()


def measure_compute(engine, images: List[str], methods: List[str], k: int = 12, seconds: float = 8.0,
                    min_queries: int = 40, seed: int = 7) -> dict:
    """The single-query compute time of the load's query mix, in this process on ``engine``: one query at a
    time, one thread, image features cached (every reference is encoded once first, untimed). Returns
    {"ms_per_query", "queries", "cores", "limit_qps"}, where the limit is cores / time per query."""
    import torch

    from .search import search

    def run(image, text, method):
        search(engine, image=image, text=text or None, method=method, alpha=0.5, k=k, explain=True,
               exclude_reference=True)  # as the app's /search asks for it

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for path in images:  # warm the feature cache as the server's is after its warm-up
            run(path, "", "image")
        rng, times = random.Random(seed), []
        t_end = time.perf_counter() + seconds
        while len(times) < min_queries or time.perf_counter() < t_end:
            image, text, method = query_mix(rng, images, methods)
            t = time.perf_counter()
            run(image, text, method)
            times.append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ms = 1e3 * sum(times) / len(times)
    return {"ms_per_query": round(ms, 2), "queries": len(times), "cores": cores,
            "limit_qps": round(cores / (ms / 1e3), 2)}


ROUTES = {"rest": "POST /api/search (JSON, thread pool)", "gradio": "/search through Gradio's queue"}


def run_load(url: str, clients: int, duration: float, pid: Optional[int], images: List[str],
             methods: List[str], k: int = 12, warmup: float = 60.0, sample_every: float = 1.0,
             out=None, compute: Optional[dict] = None, route: str = "gradio") -> dict:
    """Drive the server's ``route`` (``gradio``: the ``/search`` event through Gradio's queue; ``rest``:
    ``POST /api/search``) for ``warmup`` + ``duration`` seconds and return the summary (also printed).

    Throughput and latency count the requests that finished inside the measured window (after the
    warm-up); errors count every failed request, warm-up and the in-flight tail included. Memory is
    sampled from the start; its growth figure covers the measured window."""
    if route not in ROUTES:
        raise InputError(f"unknown route {route!r}; choose one of {', '.join(ROUTES)}")
    stats = Stats()
    if route == "gradio":
        uploader = ApiClient(url)
        try:
            images = [uploader.upload(p) for p in images]  # once, as a browser uploads a chosen photo once
        finally:
            uploader.close()
    else:  # the file's bytes in the request, encoded once here as a program holding the photo would
        images = [base64.b64encode(Path(p).read_bytes()).decode() for p in images]
    sampler = MemorySampler(pid, sample_every) if pid else None
    ready = threading.Barrier(clients + 1)  # clients connect first, then all start together
    deadline = Deadline()
    threads = []

    def worker(i):
        client_loop(url, deadline, stats, images, methods, k, seed=1000 + i, ready=ready, route=route)

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
    time.sleep(max(0.0, window[0] - time.perf_counter()))
    cpu0 = time.process_time()  # the generator's own CPU over the measured window (all its threads)
    loads = [load_average()]
    time.sleep(max(0.0, window[1] - time.perf_counter()))
    gen_cores = (time.process_time() - cpu0) / duration
    loads.append(load_average())
    for th in threads:
        th.join(timeout=warmup + duration + 120)
    if sampler:
        sampler.stop()
    lat = [dt * 1e3 for end, dt in stats.done if window[0] <= end <= window[1]]
    mem = memory_report(sampler.samples if sampler else [], warmup, warmup + duration)
    summary = {
        "route": route, "route_name": ROUTES[route], "load_average": loads,
        "clients": clients, "warmup_s": warmup, "duration_s": duration, "requests": len(lat),
        "requests_total": len(stats.done), "errors": len(stats.errors),
        "requests_per_s": round(len(lat) / duration, 2),
        "latency_ms": {"p50": round(percentile(lat, 50), 1), "p95": round(percentile(lat, 95), 1),
                       "p99": round(percentile(lat, 99), 1), "max": round(max(lat), 1) if lat else float("nan")},
        "generator_cpu_cores": round(gen_cores, 3),
        "compute": compute,
        "served_limit_ratio": (round(len(lat) / duration / compute["limit_qps"], 3)
                               if compute and compute.get("limit_qps") else None),
        "server_rss_mb": {k_: round(v, 1) for k_, v in mem.items()},
        "rss_timeline_mb": [(round(t, 1), round(b / 2**20, 1)) for t, b in (sampler.samples if sampler else [])],
        "error_examples": sorted(set(stats.errors))[:5],
    }
    print_summary(summary, warmup, out)
    return summary


def print_summary(s: dict, warmup: float, out=None) -> None:
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    if s.get("route"):
        p(f"route              {s['route']}: {s['route_name']}")
    p(f"clients            {s['clients']}")
    p(f"duration           {s['duration_s']:g} s measured after {s['warmup_s']:g} s of warm-up load")
    p(f"requests           {s['requests']} in the measured window ({s['requests_per_s']} requests/s), "
      f"{s['requests_total']} in all")
    p(f"errors             {s['errors']} (all requests, warm-up included)")
    lat = s["latency_ms"]
    p(f"latency (ms)       p50 {lat['p50']}  p95 {lat['p95']}  p99 {lat['p99']}  max {lat['max']}")
    c = s.get("compute")
    if c:
        p(f"compute limit      {c['limit_qps']} queries/s = {c['cores']} cores / {c['ms_per_query']} ms per query "
          f"(the same query mix in-process, 1 thread, image features cached, {c['queries']} queries)")
        p(f"served/limit ratio {s['served_limit_ratio']}")
    p(f"load generator CPU {s['generator_cpu_cores']} cores over the measured window")
    if s.get("load_average"):
        p(f"load average       {' -> '.join(s['load_average'])} (1-minute, /proc/loadavg, start -> end of the window)")
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
    p.add_argument("--routes", default="rest,gradio",
                   help="routes to load, one after the other on the same server: rest (POST /api/search), "
                        "gradio (/search through Gradio's queue)")
    p.add_argument("--k", type=int, default=12)
    p.add_argument("--images", default=None, help="folder of reference photos (default: the gallery)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for a started server")
    p.add_argument("--json", default=None, help="also write the summary to this JSON file")
    p.add_argument("--compute-seconds", type=float, default=8.0,
                   help="seconds of the in-process single-query measurement that gives the compute limit")
    p.add_argument("--no-compute", action="store_true", help="skip the compute limit (no models loaded here)")
    return p


def main(argv=None, engine=None) -> int:
    """``engine``: the engine the compute limit is measured on (default: the app's, loaded here)."""
    args = build_parser().parse_args(argv)
    if args.clients < 1 or args.duration <= 0 or args.warmup < 0:
        raise InputError("--clients must be >= 1, --duration > 0 and --warmup >= 0")
    settings = Settings()
    configure_decoding(settings)  # the compute limit is measured in this process, under app.py's decode budget
    images = gallery_images(args.images or settings.gallery)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    if not routes or any(r not in ROUTES for r in routes):
        raise InputError(f"--routes takes a comma-separated list of {', '.join(ROUTES)}")
    compute = None
    if not args.no_compute:  # before the load, with the server idle (or not started yet)
        if engine is None:
            from .service import load_default_engine

            engine = load_default_engine(settings)
        compute = measure_compute(engine, images, methods, k=args.k, seconds=args.compute_seconds)
        engine = None
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
        runs = {}
        for route in routes:
            print("", flush=True)
            runs[route] = run_load(url, args.clients, args.duration, pid, images, methods, k=args.k,
                                   warmup=args.warmup, compute=compute, route=route)
    finally:
        if proc is not None:
            stop_app(proc)
    print_comparison(runs)
    summary = {"compute": compute, "routes": runs}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0 if all(r["errors"] == 0 and r["requests"] > 0 for r in runs.values()) else 1


def print_comparison(runs: Dict[str, dict], out=None) -> None:
    """One row per route measured in this run, beside the targets of issue #16."""
    out = out or sys.stdout
    print("", file=out)
    print("route    requests/s  p50 ms   p95 ms   errors  served/limit  generator CPU  load average", file=out)
    for name, r in runs.items():
        lat = r["latency_ms"]
        print(f"{name:<8} {r['requests_per_s']:<11} {lat['p50']:<8} {lat['p95']:<8} {r['errors']:<7} "
              f"{r['served_limit_ratio'] if r['served_limit_ratio'] is not None else '-':<13} "
              f"{r['generator_cpu_cores']:<14} {' -> '.join(r['load_average'])}", file=out)
    print("targets  (20 clients) p50 <= 1000 ms, 0 errors, served/limit >= 0.6, generator CPU < 0.5", file=out)


if __name__ == "__main__":
    sys.exit(main())
