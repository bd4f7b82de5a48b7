"""Issue #27's and #35's attacks against a running ``python app.py``, measured from outside the server.

    python tools/hardening_bench.py                      # starts app.py on a free loopback port (packaged backbone)
    python tools/hardening_bench.py --url http://127.0.0.1:7860/ --pid 1234   # a server already running
    python tools/hardening_bench.py --only bodies,triplets --lines 100000

Sections (``--only``): ``attacks`` (each hostile image through the Gradio queue as a ``data:`` URL, as an
uploaded file, and through ``POST /api/search`` as base64; the server's peak RSS growth, the time and the
sentence it answered, then a normal search), ``bodies`` (40 concurrent 26.4 MB JSON bodies), ``triplets``
(``python -m engine eval triplets`` on a 1000-line and a ``--lines`` file: peak RSS of each run and the
difference, which is what the file's length costs; its references cycle over every gallery item), and issue
#35's: ``concurrent`` (10 concurrent valid 5000x5000 PNGs, 10 progressive CMYK JPEGs), ``slow`` (two slow
senders while normal searches go on), ``expand`` (26.7 MB of ``[[],...]``), ``headers`` (a header line every
2 s), ``disconnect`` (a client gone mid-body), ``soak`` (``--soak-minutes`` of 10 clients, 60 % JSON, 40 %
Gradio API: RSS each minute), ``starts`` (a start with each damaged file). The server's peak RSS is its VmHWM, reset before each
request through ``/proc/PID/clear_refs`` (sampled VmRSS where that is not allowed).

The payloads are made small: PNGs of huge dimensions whose rows compress to almost nothing.
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from any folder
    sys.path.insert(0, str(ROOT))
MB = 1 << 20


# -- payloads ------------------------------------------------------------------------------------------
def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(w: int, h: int, depth: int = 8, colour: int = 0, tag: bytes = b"") -> bytes:
    """A valid, fully decodable w x h PNG of zeros (colour type ``colour``: 0 gray, 2 RGB, 3 palette,
    4 gray+alpha, 6 RGBA; ``depth`` bits a sample), compressed a row at a time so making it holds no image.
    ``tag`` goes into a text chunk: the same pixels with other bytes (a server's feature cache misses)."""
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    row = b"\0" * (1 + (w * channels * depth + 7) // 8)
    comp = zlib.compressobj(9)
    body = b"".join(comp.compress(row) for _ in range(h)) + comp.flush()
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0))
    if colour == 3:
        out += _chunk(b"PLTE", bytes(range(256)) * 3)
    if tag:
        out += _chunk(b"tEXt", b"Comment\0" + tag)
    return out + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def rle_bmp(w: int, h: int) -> bytes:
    """A valid w x h 8-bit run-length compressed (RLE8) BMP: runs of 255 pixels, a few bytes a row."""
    runs = b"".join(bytes([255, i % 256]) for i in range(w // 255)) + (bytes([w % 255, 7]) if w % 255 else b"")
    pixels = (runs + b"\x00\x00") * h + b"\x00\x01"
    palette = b"".join(bytes([i, i, i, 0]) for i in range(256))
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 8, 1, len(pixels), 2835, 2835, 256, 0)
    offset = 14 + len(info) + len(palette)
    return b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + info + palette + pixels


def progressive_jpeg(w: int, h: int, mode: str = "CMYK") -> bytes:
    """A w x h progressive JPEG of one flat colour (a few hundred kB even at 40 MP); making it holds the image
    once, in this process."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, (w, h), (10, 200, 30, 0)[:len(mode)] if mode != "L" else 90).save(buf, "JPEG", progressive=True,
                                                                                        quality=70)
    return buf.getvalue()


def header_only_png() -> bytes:
    return png(64, 64)[:33]  # signature + IHDR, no pixel data


def jpeg_photo() -> bytes:
    return sorted((ROOT / "assets" / "gallery").rglob("*.jpg"))[0].read_bytes()


_MADE: Dict[str, bytes] = {}


def _cached(name: str, make) -> bytes:
    if name not in _MADE:
        _MADE[name] = make()
    return _MADE[name]


def attacks(tag: str = "") -> Dict[str, Tuple[bytes, str, str]]:
    """name -> (file bytes, file name, a part of the sentence the server must answer with, or "" when
    the image is valid and must be searched). ``tag`` makes the bytes differ (not the pixels)."""
    t = tag.encode()
    return {
        "12000x12000 grayscale PNG": (png(12000, 12000, tag=t), "gray.png", "12000x12000 pixels"),
        "6300x6300 16-bit RGBA PNG": (png(6300, 6300, 16, 6, tag=t), "rgba16.png", "needs"),
        "6300x6300 16-bit gray+alpha PNG": (png(6300, 6300, 16, 4, tag=t), "la16.png", "needs"),
        "6300x6300 palette PNG": (png(6300, 6300, 8, 3, tag=t), "palette.png", ""),
        "6300x6300 1-bit PNG": (png(6300, 6300, 1, 0, tag=t), "bits.png", ""),
        "6300x6300 16-bit grayscale PNG": (png(6300, 6300, 16, 0, tag=t), "gray16.png", ""),
        "6300x6300 progressive CMYK JPEG": (_cached("pjpeg", lambda: progressive_jpeg(6300, 6300)) + t,
                                            "cmyk.jpg", "needs"),
        "6300x6300 RLE-compressed BMP": (rle_bmp(6300, 6300), "rle.bmp", "run-length"),
        "header-only PNG": (header_only_png(), "header.png", "not an image"),
        "text file named .jpg": (b"this is not an image " + t, "note.jpg", "not an image"),
    }


# -- the server's memory, from outside -------------------------------------------------------------------
def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for process {pid}")


class Peak:
    """Peak RSS growth of process ``pid`` during the block, in bytes (VmHWM after a reset, else sampled)."""

    def __init__(self, pid: int):
        self.pid = pid

    def __enter__(self):
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            self.exact = True
        except OSError:
            self.exact = False
        self.before = _status(self.pid, "VmRSS")
        self.sampled, self._stop = self.before, threading.Event()
        if not self.exact:
            threading.Thread(target=self._sample, daemon=True).start()
        self.t0 = time.perf_counter()
        return self

    def _sample(self):
        while not self._stop.is_set():
            try:
                self.sampled = max(self.sampled, _status(self.pid, "VmRSS"))
            except (OSError, RuntimeError):
                return
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self._stop.set()
        self.after = _status(self.pid, "VmRSS")
        peak = _status(self.pid, "VmHWM") if self.exact else max(self.sampled, self.after)
        self.growth = peak - self.before


# -- a server of its own -------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(index_dir: Path, log_path: Path, env: Optional[dict] = None, timeout: float = 300.0):
    """``python app.py`` on a free loopback port with the packaged backbone over the bundled gallery, its
    index at ``index_dir``; returns (process, base URL) once it answers."""
    from engine.loadtest import wait_ready

    port = free_port()
    full = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), CIS_BACKBONE="packaged",
                CIS_INDEX_DIR=str(index_dir), CIS_PREPARE="off", CIS_DEVICE="cpu", HF_HUB_OFFLINE="1",
                GRADIO_ANALYTICS_ENABLED="False", **(env or {}))
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=str(ROOT), env=full, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_ready(url, timeout, proc)
    except Exception:
        stop_server(proc)
        raise
    return proc, url


def stop_server(proc) -> None:
    from engine.loadtest import stop_app

    stop_app(proc)


# -- requests ------------------------------------------------------------------------------------------------
def _conn(url: str, timeout: float = 120.0) -> http.client.HTTPConnection:
    u = urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def post_json(url: str, payload, raw: Optional[bytes] = None) -> Tuple[int, dict]:
    body = raw if raw is not None else json.dumps(payload).encode()
    c = _conn(url)
    try:
        c.request("POST", "/api/search", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
    finally:
        c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, {"raw": data[:200].decode("latin-1")}


def upload(url: str, name: str, data: bytes) -> dict:
    boundary = "cis27boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    c = _conn(url)
    try:
        c.request("POST", "/gradio_api/upload", body=body,
                  headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        r = c.getresponse()
        out = json.loads(r.read())
    finally:
        c.close()
    return {"path": out[0], "orig_name": name, "meta": {"_type": "gradio.FileData"}}


def data_url_file(name: str, data: bytes) -> dict:
    return {"path": None, "url": "data:image/png;base64," + base64.b64encode(data).decode(), "orig_name": name,
            "meta": {"_type": "gradio.FileData"}}


def gradio_search(url: str, image, text: str = "") -> Tuple[str, str]:
    """(event, message) of ``/search`` through Gradio's queue: "complete" or "error" and its sentence."""
    args = [image, text, "sum" if text else "image", 0.5, 3, False, "none", 64, True]
    event, payload = gradio_call(url, "search", args)
    return event, (payload.get("error") if isinstance(payload, dict) else "") or ""


def gradio_call(url: str, api: str, args: list, timeout: float = 300.0):
    """(event, decoded data) of a call through Gradio's queue API: "complete" with the outputs, or "error"
    with ``{"error": sentence}``."""
    c = _conn(url, timeout)
    try:
        c.request("POST", f"/gradio_api/call/{api}", body=json.dumps({"data": args}).encode(),
                  headers={"Content-Type": "application/json"})
        event_id = json.loads(c.getresponse().read())["event_id"]
        c.request("GET", f"/gradio_api/call/{api}/{event_id}")
        r = c.getresponse()
        event = None
        while True:
            line = r.readline()
            if not line:
                return event or "closed", None
            line = line.decode().strip()
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event in ("complete", "error"):
                return event, json.loads(line.split(":", 1)[1].strip() or "null")
    finally:
        c.close()


def normal_search_ok(url: str) -> bool:
    status, body = post_json(url, {"text": "a red car", "k": 3})
    return status == 200 and len(body.get("results", [])) == 3


# -- sections ------------------------------------------------------------------------------------------------
def run_attacks(url: str, pid: int, names: Optional[List[str]] = None) -> List[dict]:
    rows = []
    routes = ("gradio data: URL", "gradio upload", "POST /api/search")
    variants = {route: attacks(f"{route} {time.time_ns()}") for route in routes}  # no feature-cache hits
    for name in attacks():
        if names and name not in names:
            continue
        for route in routes:
            data, fname, expect = variants[route][name]
            image = upload(url, fname, data) if route == "gradio upload" else None
            with Peak(pid) as p:
                if route == "POST /api/search":
                    status, body = post_json(url, {"image": base64.b64encode(data).decode(), "text": "", "k": 3})
                    ok, msg = status == 200, body.get("error", "")
                else:
                    event, msg = gradio_search(url, data_url_file(fname, data) if image is None else image)
                    ok = event == "complete"
            rows.append({"attack": name, "kB": round(len(data) / 1e3, 1), "route": route, "searched": ok,
                         "message": msg, "expected": expect, "growth_mb": round(p.growth / MB, 1),
                         "seconds": round(p.seconds, 2), "normal_search_after": normal_search_ok(url)})
    return rows


def run_bodies(url: str, pid: int, clients: int = 40, body_mb: float = 19.8) -> dict:
    """``clients`` concurrent JSON bodies of a base64 image of ``body_mb`` MB (26.4 MB each for 19.8)."""
    body = json.dumps({"image": base64.b64encode(os.urandom(int(body_mb * 1e6))).decode(), "text": "x"}).encode()
    codes: List = []
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def one():
        c = _conn(url)
        try:
            start.wait(30)
            c.request("POST", "/api/search", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            code = r.status
        except Exception as exc:  # noqa: BLE001 - a reset is a result here
            code = type(exc).__name__
        finally:
            c.close()
        with lock:
            codes.append(code)

    with Peak(pid) as p:
        threads = [threading.Thread(target=one) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    time.sleep(2.0)
    held = _status(pid, "VmRSS") - p.before
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return {"clients": clients, "body_mb": round(len(body) / 1e6, 1), "codes": dict(Counter(map(str, codes))),
            "peak_growth_mb": round(p.growth / MB, 1), "held_after_mb": round(held / MB, 1),
            "seconds": round(p.seconds, 1), "open_fds_after": fds, "normal_search_after": normal_search_ok(url)}


# -- issue #35: concurrency, slow and expanding bodies, headers, disconnects -----------------------------------
def run_concurrent_images(url: str, pid: int, clients: int = 10) -> List[dict]:
    """``clients`` concurrent valid (or costly) images through POST /api/search at once: the decode budget
    bounds what they add together."""
    cases = {"5000x5000 grayscale PNG (valid)": lambda i: png(5000, 5000, tag=f"c{i} {time.time_ns()}".encode()),
             "6300x6300 progressive CMYK JPEG": lambda i: _cached("pjpeg", lambda: progressive_jpeg(6300, 6300))
             + f"{i} {time.time_ns()}".encode()}
    rows = []
    for name, make in cases.items():
        bodies = [json.dumps({"image": base64.b64encode(make(i)).decode(), "text": "", "k": 3}).encode()
                  for i in range(clients)]
        answers: List = []
        lock = threading.Lock()
        start = threading.Barrier(clients)

        def one(body):
            c = _conn(url)
            try:
                start.wait(30)
                c.request("POST", "/api/search", body=body, headers={"Content-Type": "application/json"})
                r = c.getresponse()
                out = (r.status, json.loads(r.read() or b"{}").get("error", ""))
            except Exception as exc:  # noqa: BLE001 - a reset is a result here
                out = (type(exc).__name__, "")
            finally:
                c.close()
            with lock:
                answers.append(out)

        with Peak(pid) as p:
            threads = [threading.Thread(target=one, args=(b,)) for b in bodies]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        rows.append({"case": f"{clients} concurrent {name}", "codes": dict(Counter(str(a[0]) for a in answers)),
                     "messages": sorted({a[1] for a in answers if a[1]}), "growth_mb": round(p.growth / MB, 1),
                     "seconds": round(p.seconds, 2), "normal_search_after": normal_search_ok(url)})
    return rows


def run_slow_bodies(url: str, pid: int, senders: int = 2, seconds: float = 40.0) -> dict:
    """``senders`` connections each declare a 26 MB body and send one byte every 5 s; meanwhile a normal search
    is sent every second: how many were answered 200, and when the slow ones were closed."""
    u = urlparse(url)
    closed_after: List[float] = []
    stop = threading.Event()

    def slow():
        s = socket.create_connection((u.hostname, u.port), timeout=60)
        t0 = time.perf_counter()
        try:
            s.sendall(b"POST /api/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 26000000\r\n\r\n{")
            s.settimeout(5.0)
            while not stop.is_set():
                try:
                    if s.recv(4096):
                        break  # answered (408)
                    break
                except socket.timeout:
                    s.sendall(b" ")
        except OSError:
            pass
        finally:
            closed_after.append(round(time.perf_counter() - t0, 1))
            s.close()

    threads = [threading.Thread(target=slow, daemon=True) for _ in range(senders)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    codes: Counter = Counter()
    with Peak(pid) as p:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            try:
                status, _ = post_json(url, {"text": "a red car", "k": 3})
            except OSError as exc:
                status = type(exc).__name__
            codes[str(status)] += 1
            time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(10)
    return {"case": f"{senders} slow senders (26 MB declared, 1 byte / 5 s)", "normal_searches": dict(codes),
            "slow_closed_after_s": closed_after, "growth_mb": round(p.growth / MB, 1)}


def run_expanding_json(url: str, pid: int, mb: float = 26.7) -> dict:
    body = b"[" + b"[]," * int(mb * 1e6 / 3) + b"[]]"
    with Peak(pid) as p:
        status, answer = post_json(url, None, raw=body)
    return {"case": f"{len(body) / 1e6:.1f} MB of [[],[],...]", "status": status, "message": answer.get("error", ""),
            "growth_mb": round(p.growth / MB, 1), "seconds": round(p.seconds, 2)}


def run_slow_headers(url: str, every: float = 2.0, limit: float = 120.0) -> dict:
    """A header line every ``every`` seconds: seconds until the server closes the connection."""
    u = urlparse(url)
    s = socket.create_connection((u.hostname, u.port), timeout=limit)
    t0 = time.perf_counter()
    try:
        s.sendall(b"GET /config HTTP/1.1\r\n")
        s.settimeout(every)
        i = 0
        while time.perf_counter() - t0 < limit:
            try:
                if s.recv(4096) == b"":
                    break
            except socket.timeout:
                s.sendall(f"X-Slow-{i}: 1\r\n".encode())
                i += 1
    except OSError:
        pass
    finally:
        s.close()
    return {"case": f"header lines one every {every:g} s", "closed_after_s": round(time.perf_counter() - t0, 1)}


def run_disconnect(url: str, log_path: Path) -> dict:
    """A client that declares 5 MB, sends 1 MB and goes away: the server log lines it caused."""
    before = log_path.read_text(errors="replace") if log_path.exists() else ""
    u = urlparse(url)
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    s.sendall(b"POST /api/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000000"
              b"\r\n\r\n{\"image\": \"" + b"A" * 1_000_000)
    time.sleep(0.5)
    s.close()
    time.sleep(1.0)
    added = (log_path.read_text(errors="replace") if log_path.exists() else "")[len(before):]
    return {"case": "client gone mid-body", "log_lines": len(added.splitlines()),
            "tracebacks": added.count("Traceback"), "normal_search_after": normal_search_ok(url)}


def run_soak(url: str, pid: int, minutes: float = 3.0, clients: int = 10, json_share: float = 0.6) -> dict:
    """``clients`` callers for ``minutes``: ``json_share`` of the calls through POST /api/search, the rest
    through the page's Gradio API (text-only searches); the server's RSS at the end of each minute."""
    stop = time.perf_counter() + minutes * 60
    calls: Counter = Counter()
    lock = threading.Lock()

    def client(k: int):
        i = 0
        while time.perf_counter() < stop:
            i += 1
            text = f"a red car {k} {i}"
            try:
                if (i * 7 + k) % 10 < json_share * 10:
                    status, _ = post_json(url, {"text": text, "k": 3})
                    key = f"json {status}"
                else:
                    key = "gradio " + gradio_search(url, None, text)[0]
            except Exception as exc:  # noqa: BLE001
                key = type(exc).__name__
            with lock:
                calls[key] += 1

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    rss = [round(_status(pid, "VmRSS") / MB, 1)]
    for t in threads:
        t.start()
    for _ in range(int(round(minutes))):
        time.sleep(60)
        rss.append(round(_status(pid, "VmRSS") / MB, 1))
    for t in threads:
        t.join(120)
    return {"case": f"{minutes:g}-minute soak, {clients} clients", "rss_mb_per_minute": rss, "calls": dict(calls),
            "end_minus_first_minute_mb": round(rss[-1] - rss[1], 1) if len(rss) > 2 else None}


# -- issue #35: a start with each damaged file -----------------------------------------------------------------
DAMAGES = ("long CURRENT", "NaN cache row", "reversed cache rows", "garbage thumbnail", "rtic bad config",
           "rtic wrong shapes", "rtic NaN anchor", "defaults non-integer nQE", "defaults nqe list",
           "defaults nqe_fraction 1e308")


def run_starts(index_dir: Path, folder: Path, damages=DAMAGES) -> List[dict]:
    """``python -c 'load_default_engine(Settings()); search'`` on a copy of the index (and a checkpoints folder) with one
    damaged file each: exit code, seconds, the warning lines, whether a search answered."""
    import shutil

    rows = []
    for damage in damages:
        case = folder / damage.replace(" ", "-")
        idx, ck = case / "index", case / "checkpoints"
        shutil.copytree(index_dir, idx)
        ck.mkdir(parents=True)
        _damage(damage, idx, ck)
        code = ("import logging, sys; logging.basicConfig(level=logging.WARNING, format='%(message)s');"
                "from engine.config import Settings; from engine.service import load_default_engine;"
                "from engine.search import search; s = Settings(); e = load_default_engine(s);"
                "r = search(e, image=0, text='in red', k=3); print('searched', len(r.results), e.composers.keys())")
        env = dict(os.environ, CIS_BACKBONE="packaged", CIS_DEVICE="cpu", HF_HUB_OFFLINE="1", CIS_INDEX_DIR=str(idx),
                   CIS_CHECKPOINTS=str(ck), CIS_PREPARED_DIR=str(case / "prepared"))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True,
                              timeout=900)
        err = proc.stderr.strip().splitlines()
        rows.append({"damage": damage, "rc": proc.returncode, "seconds": round(time.perf_counter() - t0, 1),
                     "searched": "searched 3" in proc.stdout, "tracebacks": proc.stderr.count("Traceback"),
                     "lines": [ln for ln in err if "Warning" not in ln][-3:]})
    return rows


def _damage(damage: str, idx: Path, ck: Path) -> None:
    import numpy as np

    from engine.index.shards import read_shards, write_shard_file

    slug = "packaged-efficientnet-lite0-all-minilm-l6-v2"
    bundled = ROOT / "assets" / "checkpoints"
    if damage == "long CURRENT":
        (idx / "CURRENT").write_text("v" * 300 + "\n")
    elif damage in ("NaN cache row", "reversed cache rows"):
        from engine.index.shards import cache_folder
        from engine.index.store import GalleryIndex

        cache = cache_folder(idx, GalleryIndex.load(idx, build_vectors=False).fingerprint)
        known = read_shards(cache)
        hashes = sorted(known)
        embs = np.stack([known[h][0] for h in (reversed(hashes) if damage.startswith("reversed") else hashes)])
        if damage.startswith("NaN"):
            embs[0] = np.nan
        for old in cache.glob("shard-*.npz"):
            old.unlink()
        write_shard_file(cache / "shard-0-prebuilt.npz", hashes, embs, [known[h][1] for h in hashes])
        (idx / "CURRENT").unlink()  # the first start of a cache seeded with this file
    elif damage == "garbage thumbnail":
        for t in sorted((idx / "thumbs").glob("*.jpg"))[:5]:
            t.write_bytes(b"garbage")
    elif damage.startswith("rtic"):
        from safetensors import safe_open
        from safetensors.torch import save_file

        src = bundled / f"rtic-{slug}.safetensors"
        with safe_open(str(src), framework="pt") as f:
            meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        key = "cis_checkpoint" if "cis_checkpoint" in meta else "rtic"
        record = json.loads(meta[key])
        if damage.endswith("bad config"):
            record["config"]["n_blocks"] = "four"
        elif damage.endswith("NaN anchor"):
            record["anchor"]["weight"] = float("nan")
        else:
            name = next(k for k, v in tensors.items() if v.ndim == 2 and not k.startswith("anchor"))
            tensors[name] = tensors[name][:-1].clone()
        save_file(tensors, str(ck / src.name), metadata={**meta, key: json.dumps(record)})
    else:
        from engine.backbones import create_backbone

        fp = create_backbone("packaged", "cpu").fingerprint
        bad = {"defaults non-integer nQE": {"nqe": {"lattqe": "four"}}, "defaults nqe list": {"nqe": [4]},
               "defaults nqe_fraction 1e308": {"nqe_fraction": 1e308}}[damage]
        (ck / f"defaults-{slug}.json").write_text(json.dumps({"kind": "defaults", "backbone_fingerprint": fp,
                                                              "method": "sum", "nqe": {"lattqe": 4}, **bad}))



def triplet_file(path: Path, lines: int, index_dir: Path, bad_every: int = 0, distinct: int = 40) -> Path:
    """``lines`` queries over the index's items (gallery references cycle over ``distinct`` items, targets over
    all); with ``bad_every``, every such line is not JSON."""
    from engine.index.store import GalleryIndex

    items = GalleryIndex.load(index_dir, build_vectors=False).items
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lines):
            if bad_every and i % bad_every == bad_every - 1:
                f.write("{not json\n")
                continue
            f.write(json.dumps({"reference": f"gallery:{i % distinct}", "text": "at night",
                                "targets": [items[(i * 7) % len(items)]["path"]]}) + "\n")
    return path


def run_triplets_once(index_dir: Path, queries: Path, timeout: float = 1800) -> dict:
    cmd = [sys.executable, "-m", "engine", "eval", "triplets", "--index", str(index_dir), "--queries", str(queries),
           "--methods", "image", "--expansions", "none", "--json"]
    env = dict(os.environ, CIS_BACKBONE="packaged", CIS_DEVICE="cpu", HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=err)
        peak, out = 0, []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
        reader.start()
        while proc.poll() is None:
            try:
                peak = max(peak, _status(proc.pid, "VmHWM"))
            except (OSError, RuntimeError):
                pass
            time.sleep(0.2)
        reader.join(10)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    return {"rc": proc.returncode, "peak_mb": round(peak / MB, 1), "seconds": round(time.perf_counter() - t0, 1),
            "stdout": (out[0] if out else b"").decode(), "stderr": stderr}


def run_triplets(index_dir: Path, lines: int, folder: Path) -> dict:
    """A 1000-line file and a ``lines``-line one whose references cycle over every gallery item (each distinct
    reference is encoded once per run)."""
    from engine.index.store import GalleryIndex

    every = len(GalleryIndex.load(index_dir, build_vectors=False).items)
    small = run_triplets_once(index_dir, triplet_file(folder / "q-1k.jsonl", 1000, index_dir, distinct=every))
    big = run_triplets_once(index_dir, triplet_file(folder / "q-big.jsonl", lines, index_dir, distinct=every))
    progress = "queries:" in big["stderr"] and "it/s" in big["stderr"] or "line/s" in big["stderr"]
    return {"lines": lines, "distinct_references": every, "seconds_1k": small["seconds"], "peak_1k_mb": small["peak_mb"], "peak_mb": big["peak_mb"],
            "growth_mb": round(big["peak_mb"] - small["peak_mb"], 1), "seconds": big["seconds"], "rc": big["rc"],
            "progress_shown": bool(progress),
            "queries": json.loads(big["stdout"])["queries"] if big["rc"] == 0 else None}


# -- command line ---------------------------------------------------------------------------------------------
def private_index(folder: Path) -> Path:
    """A copy of the tests' gallery index (built with the packaged backbone) that this run may change."""
    import shutil

    from engine.config import cache_dir

    src = cache_dir() / "test-gallery-index"
    out = folder / "index"
    if src.is_dir() and (src / "CURRENT").exists():
        shutil.copytree(src, out)
    return out  # otherwise the app builds it (first start)


SERVER_SECTIONS = {"attacks", "bodies", "concurrent", "slow", "expand", "headers", "disconnect", "soak"}


def _server_sections(out: dict, only: set, url: str, pid: int, log_path: Path, args) -> None:
    if "concurrent" in only:
        out["concurrent"] = run_concurrent_images(url, pid)
        for r in out["concurrent"]:
            print(f"{r['case']}: answered {r['codes']}, peak +{r['growth_mb']} MB, {r['seconds']} s, "
                  f"said {r['messages']}, normal search after: {'ok' if r['normal_search_after'] else 'FAILED'}")
    if "slow" in only:
        out["slow"] = r = run_slow_bodies(url, pid)
        print(f"{r['case']}: normal searches meanwhile {r['normal_searches']}, slow ones closed after "
              f"{r['slow_closed_after_s']} s, peak +{r['growth_mb']} MB")
    if "expand" in only:
        out["expand"] = r = run_expanding_json(url, pid)
        print(f"{r['case']}: {r['status']} in {r['seconds']} s, peak +{r['growth_mb']} MB: {r['message']}")
    if "headers" in only:
        out["headers"] = r = run_slow_headers(url)
        print(f"{r['case']}: connection closed after {r['closed_after_s']} s")
    if "disconnect" in only:
        out["disconnect"] = r = run_disconnect(url, log_path)
        print(f"{r['case']}: {r['log_lines']} log lines, {r['tracebacks']} tracebacks, normal search after: "
              f"{'ok' if r['normal_search_after'] else 'FAILED'}")
    if "soak" in only:
        out["soak"] = r = run_soak(url, pid, minutes=args.soak_minutes)
        print(f"{r['case']}: RSS by minute {r['rss_mb_per_minute']} MB (end - first minute "
              f"{r['end_minus_first_minute_mb']} MB), calls {r['calls']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running server (default: start python app.py)")
    p.add_argument("--pid", type=int, help="the running server's process id (with --url)")
    p.add_argument("--only", default="attacks,bodies,concurrent,slow,expand,headers,disconnect,soak,starts,triplets")
    p.add_argument("--soak-minutes", type=float, default=3.0)
    p.add_argument("--lines", type=int, default=100_000, help="lines of the large eval triplets file")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    only = set(args.only.split(","))
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="cis-hardening-") as tmp:
        tmp = Path(tmp)
        index_dir = private_index(tmp)
        proc = None
        if (only & SERVER_SECTIONS) and not args.url:
            proc, url = start_server(index_dir, tmp / "server.log")
            pid = proc.pid
        else:
            url, pid = args.url, args.pid
        try:
            if "attacks" in only:
                gradio_search(url, None, "warm up")
                out["attacks"] = run_attacks(url, pid)
                for r in out["attacks"]:
                    print(f"{r['attack']:<34} {r['kB']:>7} kB  {r['route']:<18} +{r['growth_mb']:>6} MB "
                          f"{r['seconds']:>6} s  {'searched' if r['searched'] else 'refused: ' + r['message']}"
                          f"  (normal search after: {'ok' if r['normal_search_after'] else 'FAILED'})")
            if "bodies" in only:
                out["bodies"] = b = run_bodies(url, pid)
                print(f"{b['clients']} concurrent {b['body_mb']} MB JSON bodies: answered {b['codes']}, peak "
                      f"+{b['peak_growth_mb']} MB, +{b['held_after_mb']} MB held 2 s after, {b['seconds']} s, "
                      f"{b['open_fds_after']} open descriptors after, normal search after: "
                      f"{'ok' if b['normal_search_after'] else 'FAILED'}")
            _server_sections(out, only, url, pid, tmp / "server.log", args)
        finally:
            if proc is not None:
                log = (tmp / "server.log").read_text(errors="replace")
                out["server_tracebacks"] = log.count("Traceback")
                print(f"server log: {out['server_tracebacks']} tracebacks")
                stop_server(proc)
        if "starts" in only and (index_dir / "CURRENT").exists():
            out["starts"] = run_starts(index_dir, tmp / "starts")
            for r in out["starts"]:
                print(f"start with {r['damage']:<28} exit {r['rc']}  {r['seconds']:>6} s  searched: {r['searched']}  "
                      f"tracebacks: {r['tracebacks']}  said: {' | '.join(r['lines'])[:300]}")
        if "triplets" in only:
            if not (index_dir / "CURRENT").exists():
                from engine.backbones import create_backbone
                from engine.index.build import index_source
                from engine.config import Settings

                index_source(ROOT / "assets" / "gallery", index_dir, create_backbone("packaged", "cpu"), settings=Settings())
            out["triplets"] = t = run_triplets(index_dir, args.lines, tmp)
            print(f"eval triplets, {t['lines']} lines: peak RSS {t['peak_mb']} MB against {t['peak_1k_mb']} MB for "
                  f"1000 lines (growth {t['growth_mb']} MB), {t['seconds']} s, exit {t['rc']}, progress bar: "
                  f"{'shown' if t['progress_shown'] else 'not shown'}")
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
