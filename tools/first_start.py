#!/usr/bin/env python3
"""Seconds from `python app.py` to the page answering, with an empty cache (a fresh CIS_CACHE_DIR): what a
new user waits on the first start. Usage: ``python tools/first_start.py [--runs 2] [--log DIR]`` (extra
environment, such as CIS_BACKBONE or a fresh XDG_CACHE_HOME for a machine without the open_clip weights,
passes through to the app). Each figure is printed with the CPU seconds the app had used by then and the
machine's 1-minute load average when the run ended (other work on the cores slows a start; its CPU seconds
hardly change with it); ``--log DIR`` keeps each run's log (what a first start says) as DIR/run-N.log."""
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
from typing import Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU seconds of a running process, all its threads (Linux /proc; None elsewhere): what the
    start costs whatever else the cores are doing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def one_start(timeout: float = 600.0, log: Optional[Path] = None) -> Tuple[float, Optional[float]]:
    with tempfile.TemporaryDirectory(prefix="cis-first-start-") as cache, \
            (open(log, "wb") if log else open(os.devnull, "wb")) as out:
        port = free_port()
        env = {**os.environ, "CIS_CACHE_DIR": cache, "GRADIO_SERVER_PORT": str(port)}
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while time.perf_counter() - t0 < timeout:
                if proc.poll() is not None:
                    raise SystemExit(f"app.py exited with {proc.returncode}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                        if r.status == 200:
                            return time.perf_counter() - t0, cpu_seconds(proc.pid)
                except OSError:
                    time.sleep(0.2)
            raise SystemExit("the page did not answer in time")
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--log", type=Path, default=None, help="folder for each run's log (run-N.log)")
    args = ap.parse_args()
    if args.log:
        args.log.mkdir(parents=True, exist_ok=True)
    figures = []
    for n in range(1, args.runs + 1):
        t, cpu = one_start(log=args.log / f"run-{n}.log" if args.log else None)
        used = f"{cpu:.1f} s CPU, " if cpu is not None else ""
        figures.append(f"{t:.1f} s ({used}load {os.getloadavg()[0]:.1f})")
    print("first start (empty cache) to the page answering: " + ", ".join(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
