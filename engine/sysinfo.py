"""Facts about this machine that reports print beside a measured figure (no engine imports)."""
from __future__ import annotations

import os
import platform
import socket
from pathlib import Path


def load_average(minutes: int = 1) -> str:
    """The 1-minute (or 1-, 5- and 15-minute, ``minutes=3``) load average from /proc: what else wanted the
    cores while a figure was measured; '?' where there is none."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:minutes])
    except OSError:
        return "?"


def machine() -> str:
    """CPU model, cores, GPU, torch and Python versions: the line every benchmark section carries."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return f"{cpu}, {os.cpu_count()} cores, GPU: {gpu}, torch {torch.__version__}, {platform.python_version()}"


def free_port() -> int:
    """A TCP port free on the loopback interface now (for a server this process starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
