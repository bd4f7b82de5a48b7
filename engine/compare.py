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
from . import images
from .config import Settings
from .errors import EngineError, InputError
from .labels import expand_label, method_label
from .query import DEFAULT_ALPHA, DEFAULT_K, SearchRequest, gallery_reference
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
    notices: List[str] = field(default_factory=list)  # what the one validation changed (a clamped value)

    def column(self, key: str) -> CompareColumn:
        for c in self.columns:
            if c.key == key:
                return c
        raise KeyError(key)

    @property
    def same_as(self) -> Dict[str, str]:
        """Column key -> the key of the first earlier column with the same results in the same order (an
        identical column is said as such, not shown as another answer)."""
        first: Dict[tuple, str] = {}
        out: Dict[str, str] = {}
        for c in self.columns:
            if c.response is None:
                continue
            ids = tuple(c.ids)
            if ids in first:
                out[c.key] = first[ids]
            else:
                first[ids] = c.key
        return out

    @property
    def minority(self) -> Dict[int, int]:
        """Gallery id -> how many different answers found it, for the results found by fewer than half of the
        different answers (identical columns count once): what only some methods found is what a UI marks;
        found by most of them is no news."""
        same = self.same_as
        answers = [set(c.ids) for c in self.columns if c.response is not None and c.key not in same]
        counts: Dict[int, int] = {}
        for ids in answers:
            for i in ids:
                counts[i] = counts.get(i, 0) + 1
        return {i: n for i, n in sorted(counts.items()) if 2 * n < len(answers)}

    def to_json(self) -> dict:
        same = self.same_as
        return {"query": self.query, "wall_ms": round(self.wall_ms, 3), "reference_hash": self.reference_hash,
                "columns": [c.to_json() for c in self.columns],
                "shared": {str(i): keys for i, keys in sorted(self.shared.items())},
                "same_as": same, "answers": sum(1 for c in self.columns if c.response is not None and c.key not in same),
                "minority": {str(i): n for i, n in self.minority.items()}, "notices": self.notices}


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
    """:func:`compare_request` for these values (checked by the one validation, :meth:`SearchRequest.build`)."""
    req = SearchRequest.build(engine.settings.max_text_chars, image=image, text=text, alpha=alpha, k=k,
                              nqe=nqe or 0, explain=explain, keep_reference=not exclude_reference)
    return compare_request(engine, req, lattqe, methods)


def compare_request(engine: SearchEngine, request: SearchRequest, lattqe: Optional[bool] = None,
                    methods: Optional[Sequence[str]] = None) -> CompareResult:
    """Runs the request through every method of :func:`compare_plan` (its own ``method`` and ``expand`` are
    replaced per column); one column each, in plan order.

    A column whose method cannot take this query (e.g. *image only* without an image) carries the
    reason in ``error`` instead of results. Errors that concern the whole query (a bad image) are raised.
    """
    if request.image is None and not (request.text or "").strip():
        raise InputError("give a reference image, a modification text, or both")
    t0 = time.perf_counter()
    ref_hash = None
    image = request.image
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
            col.response = search(engine, **request.replace(image=image, method=method, expand=expand).search_kwargs())
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
             "text": request.text or "", "alpha": float(request.alpha), "k": int(request.k),
             "nqe": int(request.nqe or 0), "keep_reference": request.keep_reference}
    return CompareResult(columns, query, (time.perf_counter() - t0) * 1e3, shared, ref_hash, list(request.notices))


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
    """Plain-text table: one block per column, results found by only a minority of the methods marked with
    '*'; a column identical to an earlier one says so instead of repeating it."""
    lines = []
    same, minority = result.same_as, result.minority
    labels = {c.key: c.label for c in result.columns}
    for col in result.columns:
        head = f"== {col.label} [{col.key}]  {col.wall_ms:.1f} ms"
        if col.error:
            lines.append(f"{head}\n   unavailable for this query: {col.error}")
            continue
        if col.key in same:
            lines.append(f"{head}\n   same results as {labels[same[col.key]]}")
            continue
        lines.append(head)
        for r in col.response.results[:top]:
            mark = "*" if r.id in minority else " "
            lines.append(f" {mark}{r.rank:3d}  {r.score:.4f}  {r.path}  {r.caption}")
    lines.append(f"total {result.wall_ms:.1f} ms; * = found by fewer than half of the methods")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine compare",
                                description="Run one query through every available method, side by side")
    p.add_argument("--index", required=True, help="index folder")
    p.add_argument("--image", default=None, help="reference image path, or gallery:ID")
    p.add_argument("--text", default=None, help="modification text")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    p.add_argument("--k", type=int, default=DEFAULT_K)
    p.add_argument("--nqe", type=int, default=0, help="neighbours for LAttQE (0: automatic)")
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
    images.configure(s)
    if args.backbone:
        s.backbone = args.backbone
    if args.device:
        s.device = args.device
    try:
        eng = open_engine(args.index, settings=s,
                          backbone=create_backbone(s.backbone, s.device, settings=s) if args.backbone else None)
        req = SearchRequest.build(s.max_text_chars, image=gallery_reference(args.image), text=args.text,
                                  alpha=args.alpha, k=args.k, nqe=args.nqe, keep_reference=args.keep_reference)
        lattqe = {"auto": None, "on": True, "off": False}[args.lattqe]
        methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
        res = compare_request(eng, req, lattqe=lattqe, methods=methods)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(res.to_json(), indent=2))
    else:
        for n in res.notices:
            print(f"note: {n}")
        print(format_text(res, args.top))
    return 0
