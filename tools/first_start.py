#!/usr/bin/env python3
"""Seconds from `python app.py` to the page answering, with an empty cache (a fresh CIS_CACHE_DIR): what a
new user waits on the first start. Usage: ``python tools/first_start.py [--runs 2]`` (extra environment, such
as CIS_BACKBONE, passes through to the app)."""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_start(timeout: float = 600.0) -> float:
    with tempfile.TemporaryDirectory(prefix="cis-first-start-") as cache:
        port = free_port()
        env = {**os.environ, "CIS_CACHE_DIR": cache, "GRADIO_SERVER_PORT": str(port)}
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            while time.perf_counter() - t0 < timeout:
                if proc.poll() is not None:
                    raise SystemExit(f"app.py exited with {proc.returncode}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                        if r.status == 200:
                            return time.perf_counter() - t0
                except OSError:
                    time.sleep(0.2)
            raise SystemExit("the page did not answer in time")
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    times = [one_start() for _ in range(args.runs)]
    print("first start (empty cache) to the page answering: " + ", ".join(f"{t:.1f} s" for t in times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
