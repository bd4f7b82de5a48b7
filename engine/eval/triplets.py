"""`python -m engine eval triplets --index DIR --queries FILE.jsonl`: composed retrieval on the user's own
queries, for every available method x expansion of the index's backbone.

Queries file: one JSON object per line,
``{"reference": "photos/a.jpg" | "gallery:12", "text": "in red", "targets": ["photos/b.jpg", ...]}``.
``reference`` is a path (absolute, relative to the gallery root, or relative to the queries file's folder)
or ``gallery:ID`` (an item id of the index); it may be left out for a text-only query. ``targets`` are paths
relative to the gallery root, as ``engine index`` records them. The reference image is removed from every
ranking (by id, or by content hash when it is a file that is also in the gallery).

Metrics (percent): R@1/5/10 = share of queries with a target in the top K (ties in gallery order, from
:func:`engine.eval.metrics.first_hit_ranks`); mAP@10 = mean over queries of
``(1 / min(10, |T|)) * sum_{i<=10} P@i * rel(i)`` (the CIRCO normalisation, :func:`average_precisions`).
Expansion follows ``engine.search.search``: the expander re-weights the first nQE results of the composed
query, and the expanded query is scored against the whole gallery.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ..data.formats import iter_jsonl
from ..errors import EngineError, InputError
from .metrics import average_precisions, first_hit_ranks, recall_from_ranks

KS = (1, 5, 10)
MAP_N = 10
MAX_QUERY_FILE_BYTES = 20_000_000


@dataclass
class Triplet:
    line: int
    reference: object  # None, int gallery id, or Path
    text: Optional[str]
    targets: List[int]


def triplet_metrics(scores: np.ndarray, positives: np.ndarray, exclude: np.ndarray,
                    ks: Sequence[int] = KS, map_n: int = MAP_N) -> Dict[str, float]:
    """scores, positives, exclude: (Q, G). Returns R@K and mAP@N in percent (the reference excluded)."""
    ranks = first_hit_ranks(scores, positives, exclude)
    out = recall_from_ranks(ranks, ks)
    aps = average_precisions(scores, positives, top_n=map_n, denominator="min", exclude=exclude)
    out[f"mAP@{map_n}"] = float(np.nan_to_num(aps, nan=0.0).mean() * 100.0)
    return out


def read_queries(path, index) -> List[Triplet]:
    """Parse the JSONL file against the index's items; every problem is one sentence naming the line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"queries file {path} does not exist")
    if path.stat().st_size > MAX_QUERY_FILE_BYTES:
        raise InputError(f"queries file {path} is larger than {MAX_QUERY_FILE_BYTES // 1_000_000} MB")
    by_path = {str(it["path"]).replace("\\", "/"): int(it["id"]) for it in index.items}
    root = Path(index.meta["source"]) if index.meta.get("source") else None
    out: List[Triplet] = []
    for n, obj in iter_jsonl(path):
        text = obj.get("text")
        if text is not None and not isinstance(text, str):
            raise InputError(f"{path.name} line {n}: text must be a string")
        text = (text or "").strip() or None
        ref = obj.get("reference")
        if ref is not None:
            if not isinstance(ref, str) or not ref.strip():
                raise InputError(f"{path.name} line {n}: reference must be a path or gallery:ID")
            if ref.startswith("gallery:"):
                try:
                    rid = int(ref.split(":", 1)[1])
                except ValueError:
                    raise InputError(f"{path.name} line {n}: {ref!r} is not gallery:<integer id>") from None
                if not 0 <= rid < len(index):
                    raise InputError(f"{path.name} line {n}: gallery item {rid} does not exist "
                                     f"(the gallery has {len(index)} images)")
                ref = rid
            else:
                cands = [Path(ref)] if Path(ref).is_absolute() else \
                    ([root / ref] if root is not None else []) + [path.parent / ref]
                found = next((c for c in cands if c.is_file()), None)
                if found is None:
                    raise InputError(f"{path.name} line {n}: reference image {ref} not found")
                ref = found
        if ref is None and text is None:
            raise InputError(f"{path.name} line {n} has neither a reference nor a text")
        targets = obj.get("targets")
        if isinstance(targets, str):
            targets = [targets]
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
            raise InputError(f"{path.name} line {n}: targets must be a non-empty list of paths")
        ids = []
        for t in targets:
            key = t.replace("\\", "/")
            key = key[2:] if key.startswith("./") else key
            if key not in by_path:
                raise InputError(f"{path.name} line {n}: target {t} is not in the index "
                                 "(paths are relative to the gallery root)")
            ids.append(by_path[key])
        out.append(Triplet(n, ref, text, ids))
    if not out:
        raise InputError(f"{path.name} holds no queries")
    return out


def _reference_exclusion(engine, t: Triplet) -> np.ndarray:
    excl = np.zeros(len(engine.index), dtype=bool)
    if isinstance(t.reference, int):
        excl[t.reference] = True
    elif isinstance(t.reference, Path):
        sha = hashlib.sha256(t.reference.read_bytes()).hexdigest()
        for it in engine.index.items:
            if it["sha256"] == sha:
                excl[int(it["id"])] = True
    return excl


def evaluate_triplets(engine, triplets: List[Triplet], nqe: int = 8, alpha: float = 0.5,
                      methods: Optional[List[str]] = None, expansions: Optional[List[str]] = None,
                      progress=None) -> dict:
    """{"methods": {method: {expansion: metrics}}, "skipped": {method: reason}, ...} on the engine's gallery."""
    from ..compose import Query

    gallery = engine.index.vectors_f32()
    n = len(gallery)
    methods = list(engine.composers) if methods is None else methods
    expansions = list(engine.expanders) if expansions is None else expansions
    if "none" in expansions:
        expansions = ["none"] + [e for e in expansions if e != "none"]
    positives = np.zeros((len(triplets), n), dtype=bool)
    exclude = np.zeros((len(triplets), n), dtype=bool)
    feats = []
    for qi, t in enumerate(triplets):
        positives[qi, t.targets] = True
        exclude[qi] = _reference_exclusion(engine, t)
        feats.append(None if t.reference is None else engine.reference_features(
            t.reference if isinstance(t.reference, int) else str(t.reference))[1:3])
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    skipped: Dict[str, str] = {}
    for m in methods:
        if m not in engine.composers:
            skipped[m] = engine.unavailable.get(m, "unknown method")
            continue
        try:
            qvecs = []
            for t, f in zip(triplets, feats):
                q = Query(text=t.text, alpha=alpha)
                if f is not None:
                    q.image_embedding, q.image_tokens, q.has_image = f[0], f[1], True
                with torch.no_grad():
                    qvecs.append(engine.composers[m].compose(q).vector.astype(np.float32))
        except EngineError as exc:
            skipped[m] = str(exc)
            continue
        qv = np.stack(qvecs)
        results[m] = {}
        for e in expansions:
            if e not in engine.expanders:
                continue
            if e == "none":
                q2 = qv
            else:
                nq = max(1, min(nqe, n))
                s1, i1 = engine.index.search(qv, nq)
                rows = []
                for row, s, i in zip(qv, s1, i1):
                    ok = i >= 0
                    rows.append(engine.expanders[e].expand(row, gallery[i[ok]], s[ok]).vector.astype(np.float32))
                q2 = np.stack(rows)
            results[m][e] = triplet_metrics(q2 @ gallery.T, positives, exclude)
            if progress:
                progress(m, e, results[m][e])
    return {"queries": len(triplets), "gallery": n, "nqe": nqe, "alpha": alpha,
            "backbone": engine.backbone.fingerprint, "methods": results, "skipped": skipped}


def format_table(res: dict) -> str:
    cols = [f"R@{k}" for k in KS] + [f"mAP@{MAP_N}"]
    lines = [f"{res['queries']} queries, gallery {res['gallery']} images, reference excluded, nQE {res['nqe']}",
             f"{'method':<14}{'expansion':<12}" + "".join(f"{c:>9}" for c in cols)]
    for m, per in res["methods"].items():
        for e, met in per.items():
            lines.append(f"{m:<14}{e:<12}" + "".join(f"{met[c]:9.1f}" for c in cols))
    for m, why in res["skipped"].items():
        lines.append(f"{m}: not evaluated ({why})")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine eval triplets", description=__doc__.split("\n\n")[0])
    p.add_argument("--index", required=True, help="index folder built by `python -m engine index`")
    p.add_argument("--queries", required=True, help="JSONL file: reference, text, targets per line")
    p.add_argument("--methods", default=None, help="comma-separated composers (default: every available one)")
    p.add_argument("--expansions", default=None, help="comma-separated expanders (default: every available one)")
    p.add_argument("--nqe", type=int, default=8, help="neighbours the expanders see (default 8)")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--checkpoints", default=None, help="checkpoint folder (default: the settings')")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    from ..config import Settings
    from ..search import open_engine

    try:
        if args.nqe < 1:
            raise InputError("--nqe must be at least 1")
        if not 0.0 <= args.alpha <= 1.0:
            raise InputError("--alpha must be between 0 and 1")
        if not Path(args.index).is_dir():
            raise InputError(f"index folder {args.index} does not exist")
        s = Settings()
        if args.checkpoints:
            s.checkpoints = args.checkpoints
        engine = open_engine(args.index, settings=s)
        triplets = read_queries(args.queries, engine.index)
        split = (lambda v: None if v is None else [x.strip() for x in v.split(",") if x.strip()])
        res = evaluate_triplets(engine, triplets, nqe=args.nqe, alpha=args.alpha,
                                methods=split(args.methods), expansions=split(args.expansions))
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(res, indent=2) if args.json else format_table(res))
    return 0
