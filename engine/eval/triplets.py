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

from collections import OrderedDict

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np
import torch

from ..config import Settings
from ..errors import EngineError, InputError
from .metrics import average_precisions, first_hit_ranks, recall_from_ranks

KS = (1, 5, 10)
MAP_N = 10


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


MAX_LINE_BYTES = 1_000_000  # a longer line is reported and skipped without being held
SCORE_BYTES = 64 << 20  # queries are scored against the gallery in blocks of about this many bytes


class _Gallery:
    """What parsing a line needs from the index, built once: paths -> ids, the gallery root, the size."""

    def __init__(self, index):
        self.by_path = {str(it["path"]).replace("\\", "/"): int(it["id"]) for it in index.items}
        self.root = Path(index.meta["source"]) if index.meta.get("source") else None
        self.size = len(index)


def _inside(candidate: Path, base: Path) -> bool:
    try:
        return Path(base).resolve() in Path(candidate).resolve().parents
    except (OSError, ValueError, RuntimeError):
        return False


def _parse_line(obj, n: int, path: Path, g: _Gallery) -> Triplet:
    """One query line as a Triplet; InputError naming the file and line for anything wrong."""
    if not isinstance(obj, dict):
        raise InputError(f"{path.name} line {n}: expected a JSON object")
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
            if not 0 <= rid < g.size:
                raise InputError(f"{path.name} line {n}: gallery item {rid} does not exist "
                                 f"(the gallery has {g.size} images)")
            ref = rid
        else:
            try:
                if Path(ref).is_absolute():
                    cands = [Path(ref)]
                else:  # relative: inside the gallery root or the queries file's folder, never above them
                    cands = [base / ref for base in ([g.root] if g.root is not None else []) + [path.parent]
                             if _inside(base / ref, base)]
                found = next((c for c in cands if c.is_file()), None)
            except (OSError, ValueError):  # a NUL byte, a name too long
                cands, found = [None], None
            if not cands:
                raise InputError(f"{path.name} line {n}: reference {ref[:200]} points outside the gallery "
                                 "folder and the queries file's folder")
            if found is None:
                raise InputError(f"{path.name} line {n}: reference image {ref[:200]} not found")
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
        if key not in g.by_path:
            raise InputError(f"{path.name} line {n}: target {t[:200]} is not in the index "
                             "(paths are relative to the gallery root)")
        ids.append(g.by_path[key])
    return Triplet(n, ref, text, ids)


def _open_queries(path: Path):
    if not path.exists():
        raise InputError(f"queries file {path} does not exist")
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InputError(f"queries file {path.name} cannot be read ({exc.strerror or exc})") from None


def count_lines(path) -> int:
    """Lines in the file, counted a block at a time (for the progress bar's total)."""
    n, last = 0, b"\n"
    with _open_queries(Path(path)) as f:
        try:
            for block in iter(lambda: f.read(1 << 20), b""):
                n += block.count(b"\n")
                last = block[-1:]
        except OSError as exc:
            raise InputError(f"queries file {Path(path).name} cannot be read ({exc.strerror or exc})") from None
    return n + (last != b"\n")


def iter_queries(path, index, on_error: Optional[Callable[[str], None]] = None) -> Iterator[Triplet]:
    """The file's queries one at a time (memory does not grow with the file). A bad line (not UTF-8, not
    JSON, too long, not a query of this index) raises InputError naming it, or, with ``on_error``, is
    reported to it in one sentence and skipped."""
    path = Path(path)
    g = _Gallery(index)
    with _open_queries(path) as f:
        n = 0
        while True:
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise InputError(f"queries file {path.name} cannot be read after line {n} "
                                 f"({exc.strerror or exc})") from None
            if not raw:
                return
            n += 1
            try:
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    while raw and not raw.endswith(b"\n"):  # skip the rest of the line, a block at a time
                        raw = f.readline(MAX_LINE_BYTES)
                    raise InputError(f"{path.name} line {n} is longer than {MAX_LINE_BYTES // 1_000_000} MB")
                try:
                    line = raw.decode("utf-8-sig" if n == 1 else "utf-8").strip()
                except UnicodeDecodeError as exc:
                    raise InputError(f"{path.name} line {n} is not UTF-8 text (byte {exc.start + 1})") from None
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except RecursionError:
                    raise InputError(f"{path.name} line {n}: nested too deeply") from None
                except ValueError as exc:
                    raise InputError(f"{path.name} line {n}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
                yield _parse_line(obj, n, path, g)
            except InputError as exc:
                if on_error is None:
                    raise
                on_error(str(exc))


def read_queries(path, index) -> List[Triplet]:
    """Every query of the file; the first problem is one sentence naming its line."""
    out = list(iter_queries(path, index))
    if not out:
        raise InputError(f"{Path(path).name} holds no queries")
    return out


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    block = []
    for it in items:
        block.append(it)
        if len(block) >= size:
            yield block
            block = []
    if block:
        yield block


FEATURE_CACHE_BYTES = 1 << 30  # reference features kept for the run (each distinct reference encoded once)


class _References:
    """Each distinct reference of a run decoded and encoded once: (embedding, tokens, gallery ids to exclude)
    by reference, least recently used dropped past ``max_bytes`` (a run's distinct references usually fit)."""

    def __init__(self, engine, by_sha: Dict[str, List[int]], max_bytes: int = FEATURE_CACHE_BYTES):

        self.engine, self.by_sha, self.max_bytes = engine, by_sha, max_bytes
        self.kept: "OrderedDict[object, tuple]" = OrderedDict()
        self.bytes = 0
        self.encoded = 0

    def prefetch(self, refs: Iterable, batch: int = 32) -> None:
        """Encode the block's references not yet kept in batches of ``batch`` (one forward pass each, not one
        per reference) into the engine's feature cache, where :meth:`get` (through the engine's
        ``reference_features``) finds them; a reference that cannot be read is left to :meth:`get`, which
        names the problem."""
        from ..images import DEFAULT_MAX_BYTES, REFERENCE_SIDE, decode_limits, load_image, read_bytes, sha256_file

        engine, todo, seen = self.engine, [], set()
        limits = decode_limits(engine.settings)
        for ref in refs:
            key = ref if isinstance(ref, int) else str(ref)
            if ref is None or key in self.kept or key in seen:
                continue
            seen.add(key)
            try:
                if isinstance(ref, int):
                    sha = engine.index.items[ref]["sha256"]
                    if sha in engine.cache:
                        continue
                    path = engine.index.image_path(ref)
                    img = load_image(path if path.exists() else engine.index.display_path(ref),
                                     **{**limits, "max_bytes": DEFAULT_MAX_BYTES}, side=REFERENCE_SIDE)
                else:
                    sha = sha256_file(ref)
                    if sha in engine.cache:
                        continue
                    img = load_image(read_bytes(ref, limits["max_bytes"]), **limits, side=REFERENCE_SIDE)
            except (InputError, OSError, IndexError):
                continue
            todo.append((sha, engine.backbone.preprocess(img), ref))
            if len(todo) >= batch:
                self._encode(todo)
                todo = []
        if todo:
            self._encode(todo)

    def _encode(self, todo: list) -> None:
        with torch.no_grad():
            emb, tokens = self.engine.backbone.encode_images_with_tokens(torch.stack([t[1] for t in todo]))
        for (sha, _, ref), e, t in zip(todo, emb, tokens):
            self.engine.cache.put(sha, (e.float().cpu(), t.float().cpu()))
            self.encoded += 1
            try:
                self.get(ref)  # kept for the run now, before the engine's (smaller) cache can drop it
            except InputError:
                pass
    def _keep(self, key, value: tuple) -> None:
        e, t, _ = value
        self.kept[key] = value
        self.bytes += e.numel() * e.element_size() + t.numel() * t.element_size()
        while self.bytes > self.max_bytes and len(self.kept) > 1:
            _, (e, t, _) = self.kept.popitem(last=False)
            self.bytes -= e.numel() * e.element_size() + t.numel() * t.element_size()

    def get(self, ref) -> tuple:
        key = ref if isinstance(ref, int) else str(ref)
        hit = self.kept.get(key)
        if hit is not None:
            self.kept.move_to_end(key)
            return hit
        from ..images import sha256_file

        if isinstance(ref, int):
            exclude = [ref]
        else:
            try:
                exclude = self.by_sha.get(sha256_file(ref), [])
            except OSError as exc:
                raise InputError(f"reference image {Path(ref).name} cannot be read ({exc.strerror or exc})") from None
        try:
            _, emb, tokens, _ = self.engine.reference_features(ref if isinstance(ref, int) else str(ref))
        except InputError as exc:
            if isinstance(ref, int):
                raise
            raise InputError(f"reference image {Path(ref).name}: {exc}") from None
        value = (emb, tokens, exclude)
        self._keep(key, value)
        return value


def evaluate_triplets(engine, triplets: Iterable[Triplet], nqe: int = 8, alpha: float = 0.5,
                      methods: Optional[List[str]] = None, expansions: Optional[List[str]] = None,
                      progress: Optional[Callable[[int], None]] = None,
                      on_error: Optional[Callable[[str], None]] = None, source: str = "queries") -> dict:
    """{"methods": {method: {expansion: metrics}}, "skipped": {method: reason}, ...} on the engine's gallery.

    ``triplets`` may be a stream (:func:`iter_queries`): queries are composed and scored a block at a time
    and only each query's first-hit rank and average precision are kept, so memory does not grow with the
    number of queries. ``progress(n)`` is called with the number of queries each block added. A line whose
    reference cannot be read is reported to ``on_error`` in one sentence naming ``source`` and the line, and
    skipped (without ``on_error`` the InputError stops the run). Each distinct reference is decoded and
    encoded once per run (:class:`_References`)."""
    from ..compose import Query

    gallery = engine.index.vectors_f32()
    n = len(gallery)
    methods = list(engine.composers) if methods is None else methods
    expansions = list(engine.expanders) if expansions is None else expansions
    if "none" in expansions:
        expansions = ["none"] + [e for e in expansions if e != "none"]
    by_sha: Dict[str, List[int]] = {}
    for it in engine.index.items:
        by_sha.setdefault(it["sha256"], []).append(int(it["id"]))
    skipped: Dict[str, str] = {m: engine.unavailable.get(m, "unknown method") for m in methods
                               if m not in engine.composers}
    live = [m for m in methods if m in engine.composers]
    exps = [e for e in expansions if e in engine.expanders]
    ranks: Dict[tuple, list] = {(m, e): [] for m in live for e in exps}
    aps: Dict[tuple, list] = {(m, e): [] for m in live for e in exps}
    block = max(1, min(256, SCORE_BYTES // max(1, n * 4)))
    total = 0
    refs = _References(engine, by_sha)
    for chunk in _chunks(triplets, block):
        refs.prefetch(t.reference for t in chunk)
        feats, kept = [], []
        for t in chunk:
            try:
                feats.append(None if t.reference is None else refs.get(t.reference))
                kept.append(t)
            except InputError as exc:
                if on_error is None:
                    raise
                on_error(f"{source} line {t.line}: {exc}")
        if not kept:
            continue
        chunk = kept
        positives = np.zeros((len(chunk), n), dtype=bool)
        exclude = np.zeros((len(chunk), n), dtype=bool)
        for qi, (t, f) in enumerate(zip(chunk, feats)):
            positives[qi, t.targets] = True
            if f is not None:
                exclude[qi, f[2]] = True
        for m in list(live):
            try:
                qvecs = []
                for t, f in zip(chunk, feats):
                    q = Query(text=t.text, alpha=alpha)
                    if f is not None:
                        q.image_embedding, q.image_tokens, q.has_image = f[0], f[1], True
                    with torch.no_grad():
                        qvecs.append(engine.composers[m].compose(q).vector.astype(np.float32))
            except EngineError as exc:
                skipped[m] = str(exc)
                live.remove(m)
                continue
            qv = np.stack(qvecs)
            for e in exps:
                scores = _expanded(engine, e, qv, gallery, nqe) @ gallery.T
                ranks[(m, e)].append(first_hit_ranks(scores, positives, exclude))
                aps[(m, e)].append(average_precisions(scores, positives, top_n=MAP_N, denominator="min",
                                                      exclude=exclude))
        total += len(chunk)
        if progress:
            progress(len(chunk))
    results = {m: {e: _metrics(ranks[(m, e)], aps[(m, e)]) for e in exps} for m in (live if total else [])}
    return {"queries": total, "gallery": n, "nqe": nqe, "alpha": alpha,
            "backbone": engine.backbone.fingerprint, "methods": results, "skipped": skipped}


def _expanded(engine, expander: str, qv: np.ndarray, gallery: np.ndarray, nqe: int) -> np.ndarray:
    """The block's query vectors after ``expander`` over each query's first ``nqe`` results."""
    if expander == "none":
        return qv
    s1, i1 = engine.index.search(qv, max(1, min(nqe, len(gallery))))
    rows = []
    for row, s, i in zip(qv, s1, i1):
        ok = i >= 0
        rows.append(engine.expanders[expander].expand(row, gallery[i[ok]], s[ok]).vector.astype(np.float32))
    return np.stack(rows)


def _metrics(rank_blocks: list, ap_blocks: list) -> Dict[str, float]:
    r = np.concatenate(rank_blocks) if rank_blocks else np.zeros(0)
    out = recall_from_ranks(r, KS)
    a = np.concatenate(ap_blocks) if ap_blocks else np.zeros(0)
    out[f"mAP@{MAP_N}"] = float(np.nan_to_num(a, nan=0.0).mean() * 100.0) if a.size else 0.0
    return out


def format_table(res: dict) -> str:
    cols = [f"R@{k}" for k in KS] + [f"mAP@{MAP_N}"]
    skipped = f" ({res['skipped_lines']} bad lines skipped)" if res.get("skipped_lines") else ""
    lines = [f"{res['queries']} queries{skipped}, gallery {res['gallery']} images, reference excluded, nQE {res['nqe']}",
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
    from ..search import open_engine

    try:
        if args.nqe < 1:
            raise InputError("--nqe must be at least 1")
        if not 0.0 <= args.alpha <= 1.0:
            raise InputError("--alpha must be between 0 and 1")
        if not Path(args.index).is_dir():
            raise InputError(f"index folder {args.index} does not exist")
        from .. import images  # Pillow, which the module does not load at its top

        s = Settings()
        images.configure(s)
        if args.checkpoints:
            s.checkpoints = args.checkpoints
        lines = count_lines(args.queries)  # also refuses a missing or unreadable file before the engine loads
        engine = open_engine(args.index, settings=s)
        split = (lambda v: None if v is None else [x.strip() for x in v.split(",") if x.strip()])
        from tqdm.auto import tqdm

        bad = []

        def report(sentence: str) -> None:  # one line per bad query line, above the progress bar
            bad.append(sentence)
            bar.write(f"skipped: {sentence}", file=sys.stderr)
            bar.update(1)

        with tqdm(total=lines, desc="queries", unit="line", file=sys.stderr, mininterval=1.0) as bar:
            stream = iter_queries(args.queries, engine.index, on_error=report)
            res = evaluate_triplets(engine, stream, nqe=args.nqe, alpha=args.alpha, methods=split(args.methods),
                                    expansions=split(args.expansions), progress=bar.update, on_error=report,
                                    source=Path(args.queries).name)
        res["skipped_lines"] = len(bad)
        if not res["queries"]:
            raise InputError(f"{Path(args.queries).name} holds no valid queries")
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if bad:
        print(f"{len(bad)} of {lines} lines skipped (each named above)", file=sys.stderr)
    print(json.dumps(res, indent=2) if args.json else format_table(res))
    return 0
