"""Issue #27's attacks against a running ``python app.py``, measured from outside the server.

    python tools/hardening_bench.py                      # starts app.py on a free loopback port (packaged backbone)
    python tools/hardening_bench.py --url http://127.0.0.1:7860/ --pid 1234   # a server already running
    python tools/hardening_bench.py --only bodies,triplets --lines 100000

Sections (``--only``): ``attacks`` (each hostile image through the Gradio queue as a ``data:`` URL, as an
uploaded file, and through ``POST /api/search`` as base64; the server's peak RSS growth, the time and the
sentence it answered, then a normal search), ``bodies`` (40 concurrent 26.4 MB JSON bodies), ``triplets``
(``python -m engine eval triplets`` on a 1000-line and a ``--lines`` file: peak RSS of each run and the
difference, which is what the file's length costs). The server's peak RSS is its VmHWM, reset before each
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


def triplet_file(path: Path, lines: int, index_dir: Path, bad_every: int = 0) -> Path:
    """``lines`` queries over the index's items (gallery references cycle over 40 items, targets over all);
    with ``bad_every``, every such line is not JSON."""
    from engine.index.store import GalleryIndex

    items = GalleryIndex.load(index_dir, build_vectors=False).items
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lines):
            if bad_every and i % bad_every == bad_every - 1:
                f.write("{not json\n")
                continue
            f.write(json.dumps({"reference": f"gallery:{i % 40}", "text": "at night",
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
    small = run_triplets_once(index_dir, triplet_file(folder / "q-1k.jsonl", 1000, index_dir))
    big = run_triplets_once(index_dir, triplet_file(folder / "q-big.jsonl", lines, index_dir))
    progress = "queries:" in big["stderr"] and "it/s" in big["stderr"] or "line/s" in big["stderr"]
    return {"lines": lines, "peak_1k_mb": small["peak_mb"], "peak_mb": big["peak_mb"],
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running server (default: start python app.py)")
    p.add_argument("--pid", type=int, help="the running server's process id (with --url)")
    p.add_argument("--only", default="attacks,bodies,triplets")
    p.add_argument("--lines", type=int, default=100_000, help="lines of the large eval triplets file")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    only = set(args.only.split(","))
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="cis-hardening-") as tmp:
        tmp = Path(tmp)
        index_dir = private_index(tmp)
        proc = None
        if (only & {"attacks", "bodies"}) and not args.url:
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
        finally:
            if proc is not None:
                log = (tmp / "server.log").read_text(errors="replace")
                out["server_tracebacks"] = log.count("Traceback")
                print(f"server log: {out['server_tracebacks']} tracebacks")
                stop_server(proc)
        if "triplets" in only:
            if not (index_dir / "CURRENT").exists():
                from engine.backbones import create_backbone
                from engine.index.build import index_source

                index_source(ROOT / "assets" / "gallery", index_dir, create_backbone("packaged", "cpu"))
            out["triplets"] = t = run_triplets(index_dir, args.lines, tmp)
            print(f"eval triplets, {t['lines']} lines: peak RSS {t['peak_mb']} MB against {t['peak_1k_mb']} MB for "
                  f"1000 lines (growth {t['growth_mb']} MB), {t['seconds']} s, exit {t['rc']}, progress bar: "
                  f"{'shown' if t['progress_shown'] else 'not shown'}")
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
