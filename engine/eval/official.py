"""Official-benchmark glue: embed the gallery, compose every query, score, and write submissions.

The three entry points take two callables so that any method can be measured the same way:

``embed_images_fn(paths) -> np.ndarray (N, D)``
    L2-normalised image embeddings of image files (see :func:`backbone_embed_fn`).
``compose_fn(items: list[QueryInput]) -> np.ndarray (B, D)``
    one composed query vector per item (see :func:`composer_compose_fn` for the engine's
    composers). Each item carries the sample, the final text (caption joining and template
    applied), the reference image path and, when the reference is in the gallery, its embedding.

Protocols (documented in docs/evaluation.md):
  * FashionIQ: per category, gallery = ``split.<category>.val.json``; nothing excluded; R@10, R@50,
    their mean over the categories and the mean of those two ("average/avg").
  * CIRR: gallery = ``split.rc2.<split>.json``; the reference image is removed from every ranking;
    R@1/5/10/50 and Recall_subset@1/2/3 (ranking inside img_set.members, reference removed).
  * CIRCO: gallery = COCO 2017 unlabeled; mAP@5/10/25/50 over gt_img_ids; the reference stays a
    candidate unless ``exclude_reference`` (the official server does not remove it).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config import cache_dir
from ..data.cir_official import (
    CIRR_VERSION,
    FASHIONIQ_CATEGORIES,
    FASHIONIQ_JOIN_RULES,
    CIRDataset,
    CIRSample,
    join_fashioniq_captions,
    load_circo,
    load_cirr,
    load_fashioniq,
)
from ..errors import InputError
from ..fileio import atomic_save_npy
from . import metrics as M
from .record import atomic_write_json, file_hash, write_run_record

DEFAULT_TEMPLATE = "{}"
SUBMISSION_TOP = 50
SUBSET_TOP = 3


@dataclass
class QueryInput:
    """What a compose function receives for one query."""

    sample: CIRSample
    text: str
    reference_path: Optional[Path]
    reference_embedding: Optional[np.ndarray]


EmbedImagesFn = Callable[[Sequence[Path]], np.ndarray]
ComposeFn = Callable[[Sequence[QueryInput]], np.ndarray]


def _progress(iterable, total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, leave=False, disable=total < 2)
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return iterable


def _normalise_rows(x: np.ndarray, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise InputError(f"{what} must be a 2-D array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise InputError(f"{what} contain NaN or infinite values")
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(n > 0, x / np.maximum(n, 1e-12), 0.0).astype(np.float32)


def apply_template(template: Optional[str], text: str) -> str:
    """``template`` holds one ``{}`` where the modification text goes (default: the text alone)."""
    template = template or DEFAULT_TEMPLATE
    if template.count("{}") != 1:
        raise InputError(f"the query template must contain exactly one '{{}}', got {template!r}")
    return template.replace("{}", text)


# ----------------------------------------------------------------------------- embedding and composing
def embed_gallery(
    dataset: CIRDataset,
    embed_images_fn: EmbedImagesFn,
    batch_size: int = 64,
    cache_dir=None,
    cache_key: Optional[str] = None,
) -> Tuple[List[str], np.ndarray]:
    """Embed every gallery image that exists. Returns (ids, (G, D) normalised matrix).

    With ``cache_dir`` and ``cache_key`` (e.g. the backbone fingerprint) the matrix is stored as
    ``<cache_dir>/<dataset>-<split>-<hash>.npy`` (hash over key, ids and image paths) and reused.
    """
    ids = dataset.present_gallery
    if not ids:
        raise InputError(f"{dataset.name} {dataset.split}: no gallery image was found under {dataset.root}")
    paths = [dataset.path(i) for i in ids]
    cache_file = None
    if cache_dir is not None and cache_key:
        h = hashlib.sha256(cache_key.encode())
        for i, p in zip(ids, paths):
            h.update(f"{i}\0{Path(p).resolve().as_posix()}\0".encode())
        cache_file = Path(cache_dir) / f"{dataset.name.replace('/', '_')}-{dataset.split}-{h.hexdigest()[:16]}.npy"
        if cache_file.is_file():
            try:
                cached = np.load(cache_file, allow_pickle=False)
                if cached.ndim == 2 and cached.shape[0] == len(ids):
                    return ids, cached.astype(np.float32)
            except (OSError, ValueError):
                pass  # damaged cache: embed again and overwrite
    emb = _embed_paths(paths, embed_images_fn, batch_size, f"embed {dataset.name}")
    if cache_file is not None:
        atomic_save_npy(cache_file, emb)
    return ids, emb


def _embed_paths(paths: Sequence[Path], fn: EmbedImagesFn, batch_size: int, desc: str) -> np.ndarray:
    chunks = []
    starts = range(0, len(paths), batch_size)
    for s in _progress(starts, len(starts), desc):
        batch = list(paths[s : s + batch_size])
        out = np.asarray(fn(batch), dtype=np.float32)
        if out.ndim != 2 or out.shape[0] != len(batch):
            raise InputError(f"embed_images_fn returned shape {out.shape} for {len(batch)} images")
        chunks.append(out)
    return _normalise_rows(np.concatenate(chunks, axis=0), "image embeddings")


def compose_queries(
    dataset: CIRDataset,
    compose_fn: ComposeFn,
    gallery_ids: Sequence[str],
    gallery_emb: np.ndarray,
    texts_fn: Callable[[CIRSample], List[str]],
    embed_images_fn: Optional[EmbedImagesFn] = None,
    template: Optional[str] = None,
    batch_size: int = 64,
) -> Tuple[np.ndarray, np.ndarray]:
    """Compose every sample. Returns ((Q, D) normalised queries, (Q,) valid mask).

    A sample whose reference image is missing is not composed (valid False, zero vector).
    When ``texts_fn`` gives several texts (FashionIQ "both" rule) each is composed and the
    normalised vectors are averaged, then normalised again.
    """
    samples = dataset.samples
    q = len(samples)
    valid = np.array([dataset.has_image(s.reference) for s in samples], dtype=bool)
    pos = {g: i for i, g in enumerate(gallery_ids)}
    # reference embeddings: from the gallery, otherwise embedded here
    ref_emb: Dict[str, np.ndarray] = {}
    outside = sorted({s.reference for s in samples if s.reference not in pos and dataset.has_image(s.reference)})
    if outside and embed_images_fn is not None:
        emb = _embed_paths([dataset.path(r) for r in outside], embed_images_fn, batch_size, "embed references")
        ref_emb = dict(zip(outside, emb))

    def reference_embedding(ref: str) -> Optional[np.ndarray]:
        if ref in pos:
            return gallery_emb[pos[ref]]
        return ref_emb.get(ref)

    items: List[QueryInput] = []
    owner: List[int] = []
    for i, s in enumerate(samples):
        if not valid[i]:
            continue
        for text in texts_fn(s):
            items.append(QueryInput(s, apply_template(template, text), dataset.path(s.reference), reference_embedding(s.reference)))
            owner.append(i)
    dim = gallery_emb.shape[1]
    out = np.zeros((q, dim), dtype=np.float32)
    if items:
        vecs = []
        starts = range(0, len(items), batch_size)
        for st in _progress(starts, len(starts), f"compose {dataset.name}"):
            batch = items[st : st + batch_size]
            v = np.asarray(compose_fn(batch), dtype=np.float32)
            if v.ndim != 2 or v.shape != (len(batch), dim):
                raise InputError(f"compose_fn returned shape {v.shape}; expected ({len(batch)}, {dim})")
            vecs.append(v)
        vecs = _normalise_rows(np.concatenate(vecs, axis=0), "composed queries")
        np.add.at(out, np.asarray(owner), vecs)
        out = _normalise_rows(out, "composed queries")
    return out, valid


def _score(dataset, compose_fn, embed_images_fn, texts_fn, template, batch_size, cache_dir=None, cache_key=None):
    gallery_ids, gallery_emb = embed_gallery(dataset, embed_images_fn, batch_size, cache_dir, cache_key)
    queries, valid = compose_queries(
        dataset, compose_fn, gallery_ids, gallery_emb, texts_fn, embed_images_fn, template, batch_size
    )
    return gallery_ids, queries @ gallery_emb.T, valid


def _limit(dataset: CIRDataset, limit: Optional[int]) -> CIRDataset:
    if limit is not None and limit > 0:
        dataset.samples = dataset.samples[:limit]
    if not dataset.samples:
        why = f" ({len(dataset.skipped_samples)} skipped because an image is missing)" if dataset.skipped_samples else ""
        raise InputError(f"{dataset.name} {dataset.split}: no queries to evaluate{why}")
    return dataset


def _counts(dataset: CIRDataset, valid: np.ndarray) -> Dict[str, object]:
    s = dataset.summary()
    s["queries_without_reference_image"] = int((~valid).sum())
    return s


# ----------------------------------------------------------------------------- FashionIQ
def evaluate_fashioniq(
    root,
    compose_fn: ComposeFn,
    embed_images_fn: EmbedImagesFn,
    categories: Sequence[str] = FASHIONIQ_CATEGORIES,
    split: str = "val",
    join_rule: str = "clip4cir",
    template: Optional[str] = None,
    skip_missing: bool = False,
    batch_size: int = 64,
    limit: Optional[int] = None,
    ks: Sequence[int] = M.FASHIONIQ_KS,
    cache_dir=None,
    cache_key: Optional[str] = None,
) -> Dict[str, object]:
    """FashionIQ R@10/R@50 per category and averaged. Returns {"metrics", "data", "protocol"}."""
    if join_rule not in FASHIONIQ_JOIN_RULES:
        raise InputError(f"unknown FashionIQ caption rule {join_rule!r}; use {', '.join(FASHIONIQ_JOIN_RULES)}")
    per_cat: Dict[str, Dict[str, float]] = {}
    data = []
    for cat in categories:
        ds = _limit(load_fashioniq(root, cat, split, skip_missing), limit)
        print(ds.report(), file=sys.stderr)
        if any(not s.targets for s in ds.samples):
            raise InputError(f"FashionIQ {cat} {split} has no targets; metrics need the val split")
        gallery_ids, scores, valid = _score(
            ds, compose_fn, embed_images_fn, lambda s: join_fashioniq_captions(s.texts, join_rule), template, batch_size,
            cache_dir, cache_key,
        )
        per_cat[cat] = M.fashioniq_recall(scores, gallery_ids, [s.targets for s in ds.samples], ks, valid=valid)
        data.append(_counts(ds, valid))
    metrics: Dict[str, float] = {}
    for cat, m in per_cat.items():
        for k, v in m.items():
            metrics[f"{cat}/{k}"] = v
    for k, v in M.fashioniq_average(per_cat, ks).items():
        metrics[f"average/{k}"] = v
    protocol = {"benchmark": "fashioniq", "split": split, "categories": list(categories), "caption_join": join_rule,
                "exclude_reference": False, "skip_missing": skip_missing, "tie_break": "gallery order", "limit": limit,
                "ks": list(ks)}
    return {"metrics": metrics, "data": data, "protocol": protocol}


# ----------------------------------------------------------------------------- CIRR
def cirr_submissions(
    samples: Sequence[CIRSample], scores: np.ndarray, gallery_ids: Sequence[str], version: str = CIRR_VERSION
) -> Tuple[Dict[str, object], Dict[str, object]]:
    """The two files of the CIRR test server: recall (top 50 over the split, reference removed) and
    recall_subset (top 3 among img_set members, reference removed). Keys are pairids as strings."""
    refs = [[s.reference] for s in samples]
    top = M.top_k_ids(scores, gallery_ids, SUBMISSION_TOP, exclude=refs)
    sub = M.top_k_ids(scores, gallery_ids, SUBSET_TOP, exclude=refs, restrict=[s.subset or [] for s in samples])
    recall: Dict[str, object] = {"version": version, "metric": "recall"}
    subset: Dict[str, object] = {"version": version, "metric": "recall_subset"}
    for s, t, u in zip(samples, top, sub):
        recall[str(s.query_id)] = list(t)
        subset[str(s.query_id)] = list(u)
    return recall, subset


def evaluate_cirr(
    root,
    compose_fn: ComposeFn,
    embed_images_fn: EmbedImagesFn,
    split: str = "val",
    template: Optional[str] = None,
    skip_missing: bool = False,
    submission_dir=None,
    batch_size: int = 64,
    limit: Optional[int] = None,
    ks: Sequence[int] = M.CIRR_KS,
    subset_ks: Sequence[int] = M.CIRR_SUBSET_KS,
    cache_dir=None,
    cache_key: Optional[str] = None,
) -> Dict[str, object]:
    """CIRR R@1/5/10/50 and Recall_subset@1/2/3 (val); on test1 only the submission files.

    With ``submission_dir`` the server files ``cirr_<split>_recall.json`` and
    ``cirr_<split>_recall_subset.json`` are written there (always on test1).
    """
    ds = _limit(load_cirr(root, split, skip_missing), limit)
    print(ds.report(), file=sys.stderr)
    gallery_ids, scores, valid = _score(ds, compose_fn, embed_images_fn, lambda s: list(s.texts), template, batch_size,
                                         cache_dir, cache_key)
    has_targets = all(s.targets for s in ds.samples)
    metrics: Dict[str, float] = {}
    if has_targets:
        refs = [s.reference for s in ds.samples]
        tg = [s.targets for s in ds.samples]
        metrics.update(M.cirr_recall(scores, gallery_ids, refs, tg, ks, valid=valid))
        subsets = [s.subset or [] for s in ds.samples]
        metrics.update(M.cirr_subset_recall(scores, gallery_ids, refs, tg, subsets, subset_ks, valid=valid))
        if "R@5" in metrics and "Rsubset@1" in metrics:
            metrics["avg(R@5,Rsubset@1)"] = (metrics["R@5"] + metrics["Rsubset@1"]) / 2.0
    files: List[str] = []
    if submission_dir is not None or not has_targets:
        out = Path(submission_dir) if submission_dir is not None else Path("runs") / "submissions"
        recall, subset = cirr_submissions(ds.samples, scores, gallery_ids)
        files.append(atomic_write_json(out / f"cirr_{split}_recall.json", recall).as_posix())
        files.append(atomic_write_json(out / f"cirr_{split}_recall_subset.json", subset).as_posix())
    protocol = {"benchmark": "cirr", "split": split, "version": CIRR_VERSION, "exclude_reference": True,
                "skip_missing": skip_missing, "tie_break": "gallery order", "limit": limit,
                "ks": list(ks), "subset_ks": list(subset_ks)}
    return {"metrics": metrics, "data": [_counts(ds, valid)], "protocol": protocol, "submission_files": files}


# ----------------------------------------------------------------------------- CIRCO
def circo_submission(
    samples: Sequence[CIRSample], scores: np.ndarray, gallery_ids: Sequence[str], exclude_reference: bool = False
) -> Dict[str, List[int]]:
    """CIRCO server file: {query id: [top 50 COCO image ids as integers]}."""
    exclude = [[s.reference] for s in samples] if exclude_reference else None
    top = M.top_k_ids(scores, gallery_ids, SUBMISSION_TOP, exclude=exclude)
    return {str(s.query_id): [int(g) for g in t] for s, t in zip(samples, top)}


def evaluate_circo(
    root,
    compose_fn: ComposeFn,
    embed_images_fn: EmbedImagesFn,
    split: str = "val",
    template: Optional[str] = None,
    skip_missing: bool = False,
    exclude_reference: bool = False,
    submission_path=None,
    batch_size: int = 64,
    limit: Optional[int] = None,
    ks: Sequence[int] = M.CIRCO_KS,
    cache_dir=None,
    cache_key: Optional[str] = None,
) -> Dict[str, object]:
    """CIRCO mAP@5/10/25/50 (val) and Recall@K of target_img_id; on test only the submission file."""
    ds = _limit(load_circo(root, split, skip_missing), limit)
    print(ds.report(), file=sys.stderr)
    gallery_ids, scores, valid = _score(ds, compose_fn, embed_images_fn, lambda s: list(s.texts), template, batch_size,
                                         cache_dir, cache_key)
    has_targets = all(s.targets for s in ds.samples)
    metrics: Dict[str, float] = {}
    exclude = [[s.reference] for s in ds.samples] if exclude_reference else None
    if has_targets:
        metrics.update(M.circo_map(scores, gallery_ids, [s.targets for s in ds.samples], ks, exclude=exclude, valid=valid))
        first = [s.targets[:1] for s in ds.samples]
        metrics.update(M.recall_at_k(scores, gallery_ids, first, ks, exclude=exclude, valid=valid))
    files: List[str] = []
    if submission_path is not None or not has_targets:
        path = Path(submission_path) if submission_path is not None else Path("runs") / "submissions" / f"circo_{split}.json"
        files.append(atomic_write_json(path, circo_submission(ds.samples, scores, gallery_ids, exclude_reference)).as_posix())
    protocol = {"benchmark": "circo", "split": split, "exclude_reference": exclude_reference,
                "skip_missing": skip_missing, "tie_break": "gallery order", "limit": limit, "ks": list(ks)}
    return {"metrics": metrics, "data": [_counts(ds, valid)], "protocol": protocol, "submission_files": files}


# ----------------------------------------------------------------------------- adapters to the engine
def backbone_embed_fn(backbone, max_pixels: Optional[int] = None) -> EmbedImagesFn:
    """embed_images_fn for a :class:`engine.backbones.base.Backbone` (safe decoding, no grad)."""
    import torch

    from ..images import DEFAULT_MAX_PIXELS, load_image

    def embed(paths: Sequence[Path]) -> np.ndarray:
        images = [load_image(p, max_pixels=max_pixels or DEFAULT_MAX_PIXELS) for p in paths]
        with torch.no_grad():
            pixels = torch.stack([backbone.preprocess(im) for im in images]).to(backbone.device)
            return backbone.encode_images(pixels).float().cpu().numpy()

    return embed


def composer_compose_fn(composer, backbone, alpha: Optional[float] = None) -> ComposeFn:
    """compose_fn for an engine :class:`engine.compose.base.Composer`.

    The reference images are encoded again with tokens (composers such as Context-I2W need the
    visual tokens); the text is passed as the query text with has_image=True; ``alpha`` (if
    given) is the Query's image/text balance for composers that use it.
    """
    import torch

    from ..compose.base import Query
    from ..images import load_image

    def compose(items: Sequence[QueryInput]) -> np.ndarray:
        images = [load_image(it.reference_path) for it in items]
        with torch.no_grad():
            pixels = torch.stack([backbone.preprocess(im) for im in images]).to(backbone.device)
            emb, tokens = backbone.encode_images_with_tokens(pixels)
        out = []
        for j, it in enumerate(items):
            q = Query(text=it.text, image_embedding=emb[j], image_tokens=tokens[j], has_image=True)
            if alpha is not None:
                q.alpha = float(alpha)
            out.append(np.asarray(composer.compose(q).vector, dtype=np.float32))
        return np.stack(out)

    return compose


# ----------------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m engine eval",
        description="Evaluate a composer on an official CIR benchmark (FashionIQ, CIRR, CIRCO).",
    )
    p.add_argument("benchmark", choices=["fashioniq", "cirr", "circo"])
    p.add_argument("--root", required=True, help="data set folder in its official layout")
    p.add_argument("--split", default=None, help="val (default), test1 (CIRR) or test (CIRCO/FashionIQ)")
    p.add_argument("--composer", default="sum", help="composer name (registry)")
    p.add_argument("--checkpoint", default=None, help="checkpoint file or folder of a learned composer")
    p.add_argument("--method", default=None, help="label for the record (default: the composer name)")
    p.add_argument("--template", default=DEFAULT_TEMPLATE, help="query text template with one '{}'")
    p.add_argument("--alpha", type=float, default=None, help="image/text balance for composers that use it")
    p.add_argument("--fiq-join", default="clip4cir", choices=FASHIONIQ_JOIN_RULES, help="FashionIQ caption joining rule")
    p.add_argument("--categories", default=",".join(FASHIONIQ_CATEGORIES), help="FashionIQ categories, comma separated")
    p.add_argument("--skip-missing", action="store_true", help="drop queries whose images are missing (default: count them as misses)")
    p.add_argument("--exclude-reference", action="store_true", help="CIRCO only: remove the reference from the ranking (not official)")
    p.add_argument("--submission", default=None, help="CIRR: folder for the two server files; CIRCO: the server file path")
    p.add_argument("--record", default=None, help="where to write the run record JSON (default runs/eval/...)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--limit", type=int, default=None, help="only the first N queries (smoke test; flagged in the record)")
    p.add_argument("--cache-dir", default=None, help="gallery embedding cache (default: <CIS_CACHE_DIR>/eval)")
    p.add_argument("--no-cache", action="store_true", help="always embed the gallery again")
    return p


def _default_cache_dir() -> Path:
    return cache_dir() / "eval"


def run(args: argparse.Namespace, backbone, composer_factory) -> Dict[str, object]:
    """Run one parsed command; returns the written record."""
    composer = composer_factory(args.composer, backbone, args.checkpoint)
    embed = backbone_embed_fn(backbone)
    compose = composer_compose_fn(composer, backbone, args.alpha)
    split = args.split or "val"
    cache_dir = None if args.no_cache else (Path(args.cache_dir) if args.cache_dir else _default_cache_dir())
    common = dict(template=args.template, skip_missing=args.skip_missing, batch_size=args.batch_size, limit=args.limit,
                  cache_dir=cache_dir, cache_key=backbone.fingerprint)
    if args.benchmark == "fashioniq":
        cats = [c.strip() for c in args.categories.split(",") if c.strip()]
        result = evaluate_fashioniq(args.root, compose, embed, cats, split, args.fiq_join, **common)
    elif args.benchmark == "cirr":
        result = evaluate_cirr(args.root, compose, embed, split, submission_dir=args.submission, **common)
    else:
        result = evaluate_circo(args.root, compose, embed, split, exclude_reference=args.exclude_reference,
                                submission_path=args.submission, **common)
    method = args.method or args.composer
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = args.record or (Path("runs") / "eval" / f"{args.benchmark}-{split}-{method}-{stamp}.json")
    record = write_run_record(
        path,
        method=method,
        backbone_fingerprint=backbone.fingerprint,
        checkpoint_hash=file_hash(args.checkpoint),
        template=args.template,
        protocol_flags={**result["protocol"], "composer": args.composer, "alpha": args.alpha},
        metrics=result["metrics"],
        extra={"data": result["data"], "submission_files": result.get("submission_files", [])},
    )
    for k, v in result["metrics"].items():
        print(f"{k:>22s}  {v:6.2f}")
    print(f"record: {Path(path).as_posix()}")
    return record


def main(argv: Optional[Sequence[str]] = None, backbone=None, composer_factory=None) -> int:
    """CLI entry. ``backbone``: a Backbone or a zero-argument callable returning one.
    ``composer_factory(name, backbone, checkpoint) -> Composer``; default: the COMPOSERS registry
    (``COMPOSERS.get(name)(backbone, checkpoint)``)."""
    args = build_parser().parse_args(argv)
    if backbone is None:
        raise InputError("evaluation needs a backbone; the engine CLI passes the configured one")
    if callable(backbone) and not hasattr(backbone, "fingerprint"):
        backbone = backbone()
    if composer_factory is None:
        from ..compose.base import COMPOSERS

        def composer_factory(name, bb, checkpoint):
            return COMPOSERS.get(name)(bb, checkpoint)

    from ..compose.base import ComposerUnavailable

    try:
        run(args, backbone, composer_factory)
    except (InputError, ComposerUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:  # unknown composer name from the registry; anything else is a bug
        msg = str(exc.args[0]) if exc.args else ""
        if not msg.startswith("unknown "):
            raise
        print(f"error: {msg}", file=sys.stderr)
        return 2
    return 0
