"""Training triplet loaders for composed image retrieval (reference image, text, target image(s)).

Small, training-oriented readers of the official annotation layouts (evaluation loaders with the full
protocols live in ``engine.data.cir_official``):

* FashionIQ: ``<root>/captions/cap.<category>.<split>.json`` -- a list of
  ``{"candidate": name, "target": name, "captions": [c1, c2]}``; images ``<root>/images/<name>.(png|jpg)``.
  The two captions are joined as ``"<c1> and <c2>"`` (trailing ``.?,`` and spaces stripped; the second
  caption's first letter lower-cased); ``both_orders=True`` also yields ``"<c2> and <c1>"`` (augmentation).
* CIRR: ``<root>/cirr/captions/cap.rc2.<split>.json`` -- a list of ``{"pairid", "reference",
  "target_hard", "target_soft", "caption", "img_set": {"id", "members"}}`` and
  ``<root>/cirr/image_splits/split.rc2.<split>.json`` mapping image name -> path relative to ``root``.
  The training target is ``target_hard``.
* generic JSONL: one object per line with ``reference``, ``text`` (or ``caption`` / ``modification``)
  and ``target`` (or ``targets``: a list); paths relative to ``image_root`` (default: the file's folder).

Every loader returns :class:`Triplet` records; missing images are counted and (by default) skipped.
:func:`embed_triplets` encodes every image and text once (cached on disk by backbone fingerprint and
content) and returns a :class:`TripletSet` of index arrays, which is what RTIC trains on.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..config import cache_dir as default_cache
from ..errors import InputError
from ..fileio import atomic_path
from . import formats
from .formats import iter_jsonl
from .heldout import held_out_cir_images, keep_row

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


@dataclass
class Triplet:
    query_id: str
    reference: str  # image path
    text: str
    targets: List[str]  # image paths (the first one is the main target)
    meta: Dict[str, object] = field(default_factory=dict)


@dataclass
class LoadReport:
    loaded: int = 0
    missing_images: int = 0
    missing_examples: List[str] = field(default_factory=list)

    def note_missing(self, name: str) -> None:
        self.missing_images += 1
        if len(self.missing_examples) < 5:
            self.missing_examples.append(name)


def _read_json(path: Path):
    if not path.is_file():
        raise InputError(f"annotation file not found: {path.name} (looked in {path.parent})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path.name} is not valid JSON (line {exc.lineno})") from None


def join_fashioniq_captions(c1: str, c2: str) -> str:
    """``"<c1> and <c2>"`` with trailing punctuation/space stripped and c2's first letter lower-cased."""
    a = c1.strip().strip(".?, ").strip()
    b = c2.strip().strip(".?, ").strip()
    if b:
        b = b[0].lower() + b[1:]
    if not a:
        return b
    if not b:
        return a
    return f"{a} and {b}"


def _find_image(folder: Path, name: str) -> Optional[Path]:
    for suffix in IMAGE_SUFFIXES:
        path = folder / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def load_fashioniq(
    root: os.PathLike,
    split: str = "train",
    categories: Sequence[str] = ("dress", "shirt", "toptee"),
    both_orders: bool = False,
    skip_missing: bool = True,
    report: Optional[LoadReport] = None,
) -> List[Triplet]:
    """FashionIQ training triplets (see the module docstring for the layout)."""
    root = Path(root)
    report = report if report is not None else LoadReport()
    images = root / "images"
    out: List[Triplet] = []
    for category in categories:
        records = _read_json(root / "captions" / f"cap.{category}.{split}.json")
        if not isinstance(records, list):
            raise InputError(f"cap.{category}.{split}.json: expected a list of records")
        for i, rec in enumerate(records):
            try:
                cand, tgt, caps = rec["candidate"], rec["target"], rec["captions"]
            except (KeyError, TypeError):
                raise InputError(f"cap.{category}.{split}.json record {i}: needs candidate, target, captions")
            ref_path, tgt_path = _find_image(images, cand), _find_image(images, tgt)
            if ref_path is None or tgt_path is None:
                report.note_missing(cand if ref_path is None else tgt)
                if skip_missing:
                    continue
            caps = list(caps) + ["", ""]
            texts = [join_fashioniq_captions(caps[0], caps[1])]
            if both_orders:
                texts.append(join_fashioniq_captions(caps[1], caps[0]))
            for j, text in enumerate(texts):
                out.append(
                    Triplet(
                        query_id=f"{category}-{i}" + ("-r" if j else ""),
                        reference=str(ref_path or images / cand),
                        text=text,
                        targets=[str(tgt_path or images / tgt)],
                        meta={"category": category, "reference_name": cand, "target_name": tgt},
                    )
                )
    report.loaded += len(out)
    return out


def load_cirr(
    root: os.PathLike,
    split: str = "train",
    skip_missing: bool = True,
    report: Optional[LoadReport] = None,
) -> List[Triplet]:
    """CIRR triplets with ``target_hard`` as target (see the module docstring for the layout)."""
    root = Path(root)
    report = report if report is not None else LoadReport()
    captions = _read_json(root / "cirr" / "captions" / f"cap.rc2.{split}.json")
    names = _read_json(root / "cirr" / "image_splits" / f"split.rc2.{split}.json")
    if not isinstance(captions, list) or not isinstance(names, dict):
        raise InputError(f"CIRR {split}: expected a caption list and a name -> path mapping")
    out: List[Triplet] = []
    for i, rec in enumerate(captions):
        try:
            ref, tgt, text = rec["reference"], rec["target_hard"], rec["caption"]
        except (KeyError, TypeError):
            raise InputError(f"cap.rc2.{split}.json record {i}: needs reference, target_hard, caption")
        paths = []
        for name in (ref, tgt):
            rel = names.get(name)
            path = (root / rel).resolve() if rel else None
            if path is None or not path.is_file():
                report.note_missing(name)
                path = None
            paths.append(path)
        if None in paths and skip_missing:
            continue
        members = (rec.get("img_set") or {}).get("members", [])
        out.append(
            Triplet(
                query_id=str(rec.get("pairid", i)),
                reference=str(paths[0] or root / names.get(ref, ref)),
                text=str(text).strip(),
                targets=[str(paths[1] or root / names.get(tgt, tgt))],
                meta={"reference_name": ref, "target_name": tgt, "subset": list(members)},
            )
        )
    report.loaded += len(out)
    return out


def load_jsonl(
    path: os.PathLike,
    image_root: Optional[os.PathLike] = None,
    skip_missing: bool = True,
    report: Optional[LoadReport] = None,
) -> List[Triplet]:
    """Generic JSONL triplets: ``reference``, ``text``/``caption``/``modification``, ``target``/``targets``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"triplet file not found: {path.name}")
    root = Path(image_root) if image_root is not None else path.parent
    report = report if report is not None else LoadReport()
    out: List[Triplet] = []
    for lineno, rec in iter_jsonl(path):
        text = rec.get("text", rec.get("caption", rec.get("modification")))
        targets = rec.get("targets", [rec["target"]] if "target" in rec else None)
        if not rec.get("reference") or text is None or not targets:
            raise InputError(f"{path.name} line {lineno}: needs reference, text and target(s)")
        ref = root / rec["reference"]
        tgts = [root / t for t in targets]
        missing = [p for p in [ref, *tgts] if not p.is_file()]
        for p in missing:
            report.note_missing(p.name)
        if missing and skip_missing:
            tgts = [t for t in tgts if t.is_file()]
            if not ref.is_file() or not tgts:
                continue
        meta = {k: v for k, v in rec.items() if k not in ("reference", "text", "caption", "target", "targets")}
        out.append(
            Triplet(str(rec.get("id", rec.get("query_id", lineno))), str(ref), str(text), [str(t) for t in tgts], meta)
        )
    report.loaded += len(out)
    return out


# -- embeddings -----------------------------------------------------------------------------------------


@dataclass
class TripletSet:
    """Embedded triplets: unique image/text embedding tables plus one row per (query, target)."""

    images: torch.Tensor  # (M, D) L2-normalised image embeddings
    texts: torch.Tensor  # (T, D) L2-normalised text embeddings
    ref: torch.Tensor  # (N,) int64 -> images
    text: torch.Tensor  # (N,) int64 -> texts
    tgt: torch.Tensor  # (N,) int64 -> images
    query: torch.Tensor  # (N,) int64 query id (rows of one query share it)
    image_keys: List[str] = field(default_factory=list)
    text_list: List[str] = field(default_factory=list)
    gallery: Optional[torch.Tensor] = None  # image ids of the split's gallery (None: refs + targets)
    photo: Optional[torch.Tensor] = None  # (N,) int64 source photo of each row (None: the reference image)

    def __len__(self) -> int:
        return int(self.ref.numel())

    @property
    def photos(self) -> torch.Tensor:
        """(N,) the source photo of each row: rows of one photo and of its edited versions share an id (the
        reference image's id where the triplets name no photo)."""
        return self.photo if self.photo is not None else self.ref

    @property
    def dim(self) -> int:
        return int(self.images.shape[1])

    def rows(self, idx: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(reference, text, target) embeddings of the given rows."""
        return self.images[self.ref[idx]], self.texts[self.text[idx]], self.images[self.tgt[idx]]

    def queries(self) -> Tuple[torch.Tensor, torch.Tensor, List[List[int]]]:
        """One entry per query: reference image ids, text ids, and all target image ids."""
        order: Dict[int, int] = {}
        refs, texts, targets = [], [], []
        for r in range(len(self)):
            q = int(self.query[r])
            if q not in order:
                order[q] = len(refs)
                refs.append(int(self.ref[r]))
                texts.append(int(self.text[r]))
                targets.append([])
            targets[order[q]].append(int(self.tgt[r]))
        return torch.tensor(refs), torch.tensor(texts), targets

    def subset(self, rows: torch.Tensor) -> "TripletSet":
        return TripletSet(
            self.images, self.texts, self.ref[rows], self.text[rows], self.tgt[rows], self.query[rows],
            self.image_keys, self.text_list, self.gallery, None if self.photo is None else self.photo[rows],
        )


def capped_targets(t: Triplet, max_targets: Optional[int]) -> List[str]:
    """At most ``max_targets`` of a query's targets, a fixed (query-seeded) random choice, order kept."""
    if not max_targets or len(t.targets) <= max_targets:
        return list(t.targets)

    keep = sorted(random.Random(f"{t.query_id}|{t.reference}|{t.text}").sample(range(len(t.targets)), max_targets))
    return [t.targets[i] for i in keep]


def index_triplets(
    triplets: Sequence[Triplet], extra_images: Sequence[str] = (), max_targets: Optional[int] = None
) -> Tuple[List[str], List[str], Dict[str, torch.Tensor]]:
    """Unique image paths, unique texts and the row index arrays (one row per kept target).

    ``extra_images`` (e.g. the split's gallery) are added to the image table; ``max_targets`` caps the
    rows of queries with many targets (training). ``photo``: each row's source photo, numbered in order of
    first appearance: the triplet's ``meta["photo"]`` where its set names one (the open-vocabulary set: a photo
    and each of its edited versions), else its reference image.
    """
    image_ids: Dict[str, int] = {}
    text_ids: Dict[str, int] = {}
    photo_ids: Dict[tuple, int] = {}
    ref, txt, tgt, query, photo = [], [], [], [], []
    for qi, t in enumerate(triplets):
        r = image_ids.setdefault(t.reference, len(image_ids))
        x = text_ids.setdefault(t.text, len(text_ids))
        named = t.meta.get("photo")
        ph = photo_ids.setdefault(("photo", str(named)) if named else ("image", t.reference), len(photo_ids))
        for target in capped_targets(t, max_targets):
            ref.append(r)
            txt.append(x)
            tgt.append(image_ids.setdefault(target, len(image_ids)))
            query.append(qi)
            photo.append(ph)
    gallery = [image_ids.setdefault(str(p), len(image_ids)) for p in extra_images]
    arrays = {k: torch.tensor(v, dtype=torch.int64)
              for k, v in (("ref", ref), ("text", txt), ("tgt", tgt), ("query", query), ("gallery", gallery),
                           ("photo", photo))}
    return list(image_ids), list(text_ids), arrays


def _cache_key(fingerprint: str, items: Iterable[str]) -> str:
    h = hashlib.sha256(fingerprint.encode())
    for item in items:
        h.update(b"\0" + item.encode())
    return h.hexdigest()[:20]


def embed_images(backbone, paths: Sequence[str], batch_size: int = 32, progress: bool = True) -> torch.Tensor:
    """Image embeddings (M, D); uses ``engine.data.features.embed_paths`` when available."""
    try:
        from .features import (
            embed_paths,  # the engine's shared, cached feature extractor
        )
    except ImportError:
        embed_paths = None
    if embed_paths is not None:
        out = embed_paths(backbone, list(paths))
        out = out[0] if isinstance(out, tuple) else out
        return torch.as_tensor(out).float()
    from tqdm.auto import tqdm

    from ..images import load_image

    chunks = []
    for start in tqdm(range(0, len(paths), batch_size), desc="images", disable=not progress):
        batch = [backbone.preprocess(load_image(p)) for p in paths[start : start + batch_size]]
        with torch.no_grad():
            chunks.append(backbone.encode_images(torch.stack(batch)).float().cpu())
    return torch.cat(chunks) if chunks else torch.zeros(0, backbone.embed_dim)


def embed_texts(backbone, texts: Sequence[str], batch_size: int = 256, progress: bool = True) -> torch.Tensor:
    from tqdm.auto import tqdm

    chunks = []
    for start in tqdm(range(0, len(texts), batch_size), desc="texts", disable=not progress):
        with torch.no_grad():
            chunks.append(backbone.encode_texts(list(texts[start : start + batch_size])).embeddings.float().cpu())
    return torch.cat(chunks) if chunks else torch.zeros(0, backbone.embed_dim)


def embed_triplets(
    backbone,
    triplets: Sequence[Triplet],
    cache_dir: Optional[os.PathLike] = None,
    progress: bool = True,
    gallery: Sequence[str] = (),
    max_targets: Optional[int] = None,
) -> TripletSet:
    """Encodes every unique image and text once; cached as safetensors by fingerprint and content.

    ``gallery``: image paths of the split's gallery (kept as ``TripletSet.gallery``); ``max_targets``:
    see :func:`index_triplets`.
    """
    from safetensors.torch import load_file, save_file

    if not triplets:
        raise InputError("no triplets to embed (empty split, or every image is missing)")
    paths, texts, arrays = index_triplets(triplets, gallery, max_targets)
    if cache_dir is None:
        cache_dir = default_cache() / "features" / "rtic"
    cache = Path(cache_dir) / f"{_cache_key(backbone.fingerprint, paths + ['|'] + texts)}.safetensors"
    tables = None
    if cache.is_file():
        try:
            tables = load_file(str(cache))
        except Exception:
            tables = None
    if tables is None:
        tables = {"images": embed_images(backbone, paths, progress=progress), "texts": embed_texts(backbone, texts, progress=progress)}

        with atomic_path(cache) as tmp:
            save_file({k: v.contiguous() for k, v in tables.items()}, str(tmp),
                      metadata={"fingerprint": backbone.fingerprint})
    return TripletSet(tables["images"], tables["texts"], arrays["ref"], arrays["text"], arrays["tgt"], arrays["query"],
                      paths, texts, arrays["gallery"] if len(gallery) else None, arrays["photo"])


def load_offline_cir(split: str = "train", report: Optional[LoadReport] = None,
                     hold_out: bool = False) -> List[Triplet]:
    """Triplets of the built offline ``cir`` set (``engine.data.formats``; build it with
    ``engine.data.builders``). ``hold_out``: leave out every query whose reference or targets come from a
    held-out source (``engine.data.heldout``; the trainers do).

    Records carry ``reference``, ``text`` (or ``caption``/``modification``) and ``target`` or ``targets``,
    image paths relative to ``formats.image_root("cir")``; other fields are kept in ``meta``.
    """
    report = report if report is not None else LoadReport()
    held = _held_out_images(hold_out)
    out: List[Triplet] = []
    for i, rec in enumerate(formats.load_split("cir", split)):
        text = rec.get("text", rec.get("caption", rec.get("modification")))
        targets = rec.get("targets") or ([rec["target"]] if rec.get("target") else [])
        if held and not keep_row([rec.get("reference", ""), *targets], held):
            continue
        if not rec.get("reference") or text is None or not targets:
            raise InputError(f"cir/{split}.jsonl record {i}: needs reference, text and target(s)")
        ref = formats.image_path("cir", rec["reference"])
        tgts = [formats.image_path("cir", t) for t in targets]
        if not ref.is_file() or not all(t.is_file() for t in tgts):
            report.note_missing(Path(rec["reference"]).name)
            tgts = [t for t in tgts if t.is_file()]
            if not ref.is_file() or not tgts:
                continue
        meta = {k: v for k, v in rec.items() if k not in ("reference", "text", "caption", "modification", "target", "targets")}
        out.append(Triplet(str(rec.get("id", rec.get("query_id", i))), str(ref), str(text), [str(t) for t in tgts], meta))
    report.loaded += len(out)
    return out


def _held_out_images(hold_out: bool) -> frozenset:
    return held_out_cir_images() if hold_out else frozenset()


def load_offline_gallery(split: str = "test", hold_out: bool = False) -> List[Tuple[str, str]]:
    """(image path, gallery kind) of every image in a split's gallery of the offline ``cir`` set
    (``hold_out``: without the held-out sources' images)."""
    held = _held_out_images(hold_out)
    out = []
    for rec in formats.load_split("cir", f"{split}_gallery"):
        if rec["image"] in held:
            continue
        path = formats.image_path("cir", rec["image"])
        if path.is_file():
            out.append((str(path), str(rec.get("gallery", ""))))
    return out
