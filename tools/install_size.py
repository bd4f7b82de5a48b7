#!/usr/bin/env python3
"""Bytes installed by a requirements file in this environment: the installed files of its dependency closure,
and how much of that is CUDA (nvidia-*, cuda-*, triton) and the torch / torchvision / FAISS builds.
Usage: ``python tools/install_size.py [requirements.txt]`` (run where that file was installed)."""
from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_runtime_requirements import runtime_closure  # noqa: E402  (the closure the tests already compute)


def dist_size(name: str) -> int:
    d = md.distribution(name)
    total = 0
    for f in d.files or []:
        p = Path(d.locate_file(f))
        if p.is_file():
            total += p.stat().st_size
    return total


def main() -> int:
    req = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "requirements.txt"
    sizes = {n: dist_size(n) for n in sorted(runtime_closure(req))}
    cuda = {n: v for n, v in sizes.items() if n.startswith(("nvidia-", "cuda-")) or n == "triton"}
    builds = {n: v for n, v in sizes.items() if n in ("torch", "torchvision", "faiss-gpu", "faiss-cpu")}
    total = sum(sizes.values())
    print(f"{req.name}: {len(sizes)} distributions, {total / 1e9:.2f} GB installed")
    print(f"  CUDA packages: {sum(cuda.values()) / 1e9:.2f} GB; " +
          ", ".join(f"{n} {v / 1e9:.2f} GB" for n, v in builds.items()))
    print(f"  everything else: {(total - sum(cuda.values()) - sum(builds.values())) / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
