"""Compare mode: one query (reference + text) through every available method, side by side.

Each column is one call of the engine's one :func:`engine.search.search`; with LAttQE available each
method is also run with LAttQE expansion. The reference image's features are computed once (the
engine's feature cache serves the other columns). Results found by more than one column are listed
in ``shared`` so a UI can mark them.

CLI: ``python -m engine compare --index DIR --image P --text T [--json]``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from .backbones import create_backbone
from .config import Settings
from .errors import EngineError, InputError
from .labels import expand_label, method_label
from .search import DEFAULT_NQE, SearchEngine, SearchResponse, open_engine, search


def column_key(method: str, expand: str = "none") -> str:
    """``sum``, or ``sum+lattqe`` for a method run with an expansion."""
    return method if expand in (None, "", "none") else f"{method}+{expand}"


def column_label(method: str, expand: str = "none") -> str:
    label = method_label(method)
    return label if expand in (None, "", "none") else f"{label} + {expand_label(expand)}"


@dataclass
class CompareColumn:
    key: str
    method: str
    expand: str
    label: str
    wall_ms: float
    response: Optional[SearchResponse] = None
    error: Optional[str] = None

    @property
    def ids(self) -> List[int]:
        return [r.id for r in self.response.results] if self.response else []

    def to_json(self) -> dict:
        return {"key": self.key, "method": self.method, "expand": self.expand, "label": self.label,
                "wall_ms": round(self.wall_ms, 3), "error": self.error,
                "response": self.response.to_json() if self.response else None}


@dataclass
class CompareResult:
    columns: List[CompareColumn]
    query: Dict[str, Any]
    wall_ms: float
    shared: Dict[int, List[str]] = field(default_factory=dict)  # gallery id -> keys of the columns with it
    reference_hash: Optional[str] = None

    def column(self, key: str) -> CompareColumn:
        for c in self.columns:
            if c.key == key:
                return c
        raise KeyError(key)

    def to_json(self) -> dict:
        return {"query": self.query, "wall_ms": round(self.wall_ms, 3), "reference_hash": self.reference_hash,
                "columns": [c.to_json() for c in self.columns],
                "shared": {str(i): keys for i, keys in sorted(self.shared.items())}}


def compare_plan(engine: SearchEngine, lattqe: Optional[bool] = None,
                 methods: Optional[Sequence[str]] = None) -> List[tuple]:
    """The (method, expand) pairs a compare run makes: every available method, and with ``lattqe``
    (None: when the LAttQE expander is available) each of them again with LAttQE."""
    names = list(methods) if methods else list(engine.composers)
    plan = [(m, "none") for m in names]
    with_lattqe = ("lattqe" in engine.expanders) if lattqe is None else bool(lattqe)
    if with_lattqe:
        plan += [(m, "lattqe") for m in names]
    return plan


def compare(engine: SearchEngine, image=None, text: Optional[str] = None, alpha: float = 0.5, k: int = 12,
            nqe: int = DEFAULT_NQE, lattqe: Optional[bool] = None, methods: Optional[Sequence[str]] = None,
            explain: bool = True, exclude_reference: bool = False) -> CompareResult:
    """Runs the query through every method of :func:`compare_plan`; one column each, in plan order.

    A column whose method cannot take this query (e.g. *image only* without an image) carries the
    reason in ``error`` instead of results. Errors that concern the whole query (no input at all, a bad
    image) are raised.
    """
    if image is None and not (text or "").strip():
        raise InputError("give a reference image, a modification text, or both")
    t0 = time.perf_counter()
    ref_hash = None
    if image is not None:
        # encode once up front: bad images fail here, and every column gets a cache hit
        ref_hash = engine.reference_features(image)[0]
        if not isinstance(image, int):
            gid = engine.find_item(ref_hash)
            image = gid if gid is not None else image
    columns: List[CompareColumn] = []
    for method, expand in compare_plan(engine, lattqe, methods):
        t = time.perf_counter()
        col = CompareColumn(column_key(method, expand), method, expand, column_label(method, expand), 0.0)
        try:
            col.response = search(engine, image=image, text=text, method=method, alpha=alpha, k=k, expand=expand,
                                  nqe=nqe, explain=explain, exclude_reference=exclude_reference)
        except EngineError as exc:
            col.error = str(exc)
        col.wall_ms = (time.perf_counter() - t) * 1e3
        columns.append(col)
    seen: Dict[int, List[str]] = {}
    for col in columns:
        for i in col.ids:
            seen.setdefault(i, []).append(col.key)
    shared = {i: keys for i, keys in seen.items() if len(keys) > 1}
    query = {"image": image if isinstance(image, int) else (None if image is None else f"sha256:{ref_hash}"),
             "text": (text or "").strip(), "alpha": float(alpha), "k": int(k), "nqe": int(nqe or 0)}
    return CompareResult(columns, query, (time.perf_counter() - t0) * 1e3, shared, ref_hash)


def bench_compare(engine: SearchEngine, repeats: int = 3, k: int = 12) -> float:
    """Wall time in seconds (median of ``repeats``) of a compare run over all methods on ``engine``.

    The reference is a gallery image (its features cached by a warm-up run, as after a normal search
    with the same reference); each timed run uses a new text so text encoding is always measured.
    """
    ref = len(engine.index) // 2
    texts = ["the same but red", "at night", "a bigger one", "in the snow", "as a drawing", "two of them"]
    compare(engine, image=ref, text="warm-up", k=k)
    times = []
    for i in range(max(1, repeats)):
        t = time.perf_counter()
        compare(engine, image=ref, text=texts[i % len(texts)] + (f" {i}" if i >= len(texts) else ""), k=k)
        times.append(time.perf_counter() - t)
    return float(statistics.median(times))


def format_text(result: CompareResult, top: int = 5) -> str:
    """Plain-text table: one block per column, shared results marked with '*'."""
    lines = []
    for col in result.columns:
        head = f"== {col.label} [{col.key}]  {col.wall_ms:.1f} ms"
        if col.error:
            lines.append(f"{head}\n   unavailable for this query: {col.error}")
            continue
        lines.append(head)
        for r in col.response.results[:top]:
            mark = "*" if r.id in result.shared else " "
            lines.append(f" {mark}{r.rank:3d}  {r.score:.4f}  {r.path}  {r.caption}")
    lines.append(f"total {result.wall_ms:.1f} ms; * = found by more than one column")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine compare",
                                description="Run one query through every available method, side by side")
    p.add_argument("--index", required=True, help="index folder")
    p.add_argument("--image", default=None, help="reference image path, or gallery:ID")
    p.add_argument("--text", default=None, help="modification text")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--nqe", type=int, default=DEFAULT_NQE)
    p.add_argument("--lattqe", choices=("auto", "on", "off"), default="auto",
                   help="also run each method with LAttQE (auto: when a LAttQE checkpoint is available)")
    p.add_argument("--methods", default=None, help="comma-separated subset of methods (default: all available)")
    p.add_argument("--top", type=int, default=5, help="results shown per column in text output")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep-reference", action="store_true",
                   help="keep the reference image among its own results (left out by default, as in CIRR)")
    p.add_argument("--backbone", default=None)
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    s = Settings()
    if args.backbone:
        s.backbone = args.backbone
    if args.device:
        s.device = args.device
    try:
        eng = open_engine(args.index, settings=s,
                          backbone=create_backbone(s.backbone, s.device, settings=s) if args.backbone else None)
        image = args.image
        if image is not None and image.startswith("gallery:"):
            image = int(image.split(":", 1)[1])
        lattqe = {"auto": None, "on": True, "off": False}[args.lattqe]
        methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
        res = compare(eng, image=image, text=args.text, alpha=args.alpha, k=args.k, nqe=args.nqe, lattqe=lattqe,
                      methods=methods, exclude_reference=not args.keep_reference)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(res.to_json(), indent=2))
    else:
        print(format_text(res, args.top))
    return 0
