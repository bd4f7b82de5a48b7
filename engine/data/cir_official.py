"""Loaders for the official composed-image-retrieval benchmarks: FashionIQ, CIRR and CIRCO.

They read the directory layouts and annotation files exactly as the datasets ship them and return
plain records (:class:`CIRSample`) plus the gallery (image ids in file order) and where each image
lives. Nothing here decodes images; missing image files are reported and counted, never fatal.

Layouts (``root`` is the folder given on the command line):

FashionIQ::

    root/captions/cap.<category>.<split>.json      [{"candidate", "target", "captions": [c1, c2]}]
                                                   (the test files have no "target")
    root/image_splits/split.<category>.<split>.json  ["B00006M009", ...]
    root/images/<name>.png  (or .jpg)

    ``json/`` is accepted instead of ``captions/`` (the Pic2Word layout).

CIRR (``root`` may be the folder holding ``cirr/`` or ``cirr/`` itself)::

    cirr/captions/cap.rc2.<split>.json   [{"pairid", "reference", "target_hard", "target_soft",
                                           "caption", "img_set": {"id", "members", ...}}]
    cirr/image_splits/split.rc2.<split>.json  {"dev-0-0-img0": "./dev/dev-0-0-img0.png", ...}
    images under cirr/img_raw/ (official), or the split folders (dev/, test1/, train/) under
    cirr/ or root/ (the CLIP4Cir layout); the relative paths of the split file are resolved
    against the first of these that exists.

CIRCO::

    annotations/<split>.json   [{"id", "reference_img_id", "target_img_id", "relative_caption",
                                 "shared_concept", "gt_img_ids"}]   (test: no target / gt)
    COCO2017_unlabeled/unlabeled2017/<12-digit id>.jpg
    COCO2017_unlabeled/annotations/image_info_unlabeled2017.json  (gallery list; when absent the
    gallery is every ``*.jpg`` in unlabeled2017/)

Gallery ids are strings: FashionIQ ASINs, CIRR image names, CIRCO COCO ids written as decimal
numbers without padding (``"9761"``); :func:`circo_image_name` gives the file name.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set

from ..errors import InputError

FASHIONIQ_CATEGORIES = ("dress", "shirt", "toptee")
FASHIONIQ_EXTENSIONS = (".png", ".jpg", ".jpeg")
CIRR_VERSION = "rc2"


@dataclass
class CIRSample:
    """One composed query. ``texts`` are the raw modification texts (FashionIQ: the two captions)."""

    query_id: str
    reference: str
    texts: List[str]
    targets: List[str]
    subset: Optional[List[str]] = None
    extra: Dict[str, object] = field(default_factory=dict)


@dataclass
class CIRDataset:
    """Samples + gallery of one benchmark split, with the image files that were found."""

    name: str
    split: str
    samples: List[CIRSample]
    gallery: List[str]
    image_paths: Dict[str, Path]
    missing_images: List[str] = field(default_factory=list)
    skipped_samples: List[str] = field(default_factory=list)
    root: Optional[Path] = None

    @property
    def present_gallery(self) -> List[str]:
        """Gallery ids whose image file exists (the ones that can be embedded)."""
        return [g for g in self.gallery if g in self.image_paths]

    def has_image(self, image_id: str) -> bool:
        return image_id in self.image_paths

    def path(self, image_id: str) -> Path:
        try:
            return self.image_paths[image_id]
        except KeyError:
            raise InputError(f"{self.name}: image {image_id!r} is missing under {self.root}") from None

    def summary(self) -> Dict[str, object]:
        return {
            "dataset": self.name,
            "split": self.split,
            "queries": len(self.samples),
            "gallery": len(self.gallery),
            "gallery_present": len(self.present_gallery),
            "missing_images": len(self.missing_images),
            "skipped_samples": len(self.skipped_samples),
        }

    def report(self) -> str:
        s = self.summary()
        line = (
            f"{s['dataset']} {s['split']}: {s['queries']} queries, gallery {s['gallery_present']}/{s['gallery']} images present"
        )
        if self.missing_images:
            ex = ", ".join(self.missing_images[:5])
            line += f"; {len(self.missing_images)} referenced images missing (e.g. {ex})"
        if self.skipped_samples:
            line += f"; {len(self.skipped_samples)} queries skipped because an image is missing"
        return line


# ----------------------------------------------------------------------------- shared helpers
def _read_json(path: Path):
    if not path.is_file():
        raise InputError(f"annotation file not found: {path.name} (looked in {path.parent})")
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path.name} is not valid JSON: {exc}") from None


def _require(record: dict, keys: Iterable[str], file: Path, i: int) -> None:
    if not isinstance(record, dict):
        raise InputError(f"{file.name}: entry {i} is not an object")
    missing = [k for k in keys if k not in record]
    if missing:
        raise InputError(f"{file.name}: entry {i} lacks field(s) {', '.join(missing)}")


def _list_files(folder: Path) -> Set[str]:
    try:
        return set(os.listdir(folder))
    except FileNotFoundError:
        return set()


def _finish(
    name: str,
    split: str,
    root: Path,
    samples: List[CIRSample],
    gallery: List[str],
    image_paths: Dict[str, Path],
    skip_missing: bool,
) -> CIRDataset:
    """Count missing images over gallery + samples and optionally drop samples that need them."""
    referenced: List[str] = list(gallery)
    for s in samples:
        referenced.append(s.reference)
        referenced.extend(s.targets)
    missing = sorted({r for r in referenced if r not in image_paths})
    skipped: List[str] = []
    if skip_missing and missing:
        keep = []
        for s in samples:
            if s.reference in image_paths and all(t in image_paths for t in s.targets):
                keep.append(s)
            else:
                skipped.append(s.query_id)
        samples = keep
    return CIRDataset(name, split, samples, gallery, image_paths, missing, skipped, root)


# ----------------------------------------------------------------------------- FashionIQ
def load_fashioniq(
    root,
    category: str,
    split: str = "val",
    skip_missing: bool = False,
) -> CIRDataset:
    """FashionIQ ``category`` (dress, shirt, toptee) of ``split``; gallery = the category's image split.

    texts = the two relative captions, unchanged (joining is a protocol choice, see
    :func:`join_fashioniq_captions`). query_id = "<category>/<index in the caption file>".
    """
    root = Path(root)
    if category not in FASHIONIQ_CATEGORIES:
        raise InputError(f"unknown FashionIQ category {category!r}; use {', '.join(FASHIONIQ_CATEGORIES)}")
    cap_dir = root / "captions"
    if not (cap_dir / f"cap.{category}.{split}.json").is_file() and (root / "json").is_dir():
        cap_dir = root / "json"
    cap_file = cap_dir / f"cap.{category}.{split}.json"
    split_file = root / "image_splits" / f"split.{category}.{split}.json"
    records = _read_json(cap_file)
    gallery = _read_json(split_file)
    if not isinstance(records, list):
        raise InputError(f"{cap_file.name} must hold a list of queries")
    if not isinstance(gallery, list) or not all(isinstance(g, str) for g in gallery):
        raise InputError(f"{split_file.name} must hold a list of image names")
    samples: List[CIRSample] = []
    for i, r in enumerate(records):
        _require(r, ("candidate", "captions"), cap_file, i)
        caps = r["captions"]
        if not isinstance(caps, list) or not caps:
            raise InputError(f"{cap_file.name}: entry {i} has no captions list")
        target = r.get("target")
        samples.append(
            CIRSample(
                query_id=f"{category}/{i}",
                reference=str(r["candidate"]),
                texts=[str(c) for c in caps],
                targets=[str(target)] if target else [],
                extra={"category": category},
            )
        )
    img_dir = root / "images"
    files = _list_files(img_dir)
    wanted = set(gallery) | {s.reference for s in samples} | {t for s in samples for t in s.targets}
    image_paths: Dict[str, Path] = {}
    for name in wanted:
        for ext in FASHIONIQ_EXTENSIONS:
            if name + ext in files:
                image_paths[name] = img_dir / (name + ext)
                break
    return _finish(f"fashioniq/{category}", split, root, samples, list(gallery), image_paths, skip_missing)


# ----------------------------------------------------------------------------- CIRR
def _cirr_dir(root: Path) -> Path:
    if (root / "cirr" / "captions").is_dir():
        return root / "cirr"
    if (root / "captions").is_dir():
        return root
    raise InputError(f"no CIRR annotations: expected cirr/captions/ under {root}")


def _cirr_image_base(root: Path, cirr: Path, rel_paths: Sequence[str]) -> Path:
    bases = [cirr / "img_raw", root / "img_raw", cirr, root]
    probe = [p for p in rel_paths[:20]]
    for base in bases:
        if any((base / p).is_file() for p in probe):
            return base
    for base in bases:
        if base.is_dir() and base.name == "img_raw":
            return base
    return bases[2]


def load_cirr(
    root,
    split: str = "val",
    skip_missing: bool = False,
    version: str = CIRR_VERSION,
) -> CIRDataset:
    """CIRR ``split`` (train, val, test1). targets = [target_hard] (empty on test1); subset = the
    img_set members; query_id = str(pairid); extra: target_soft, img_set_id."""
    root = Path(root)
    cirr = _cirr_dir(root)
    cap_file = cirr / "captions" / f"cap.{version}.{split}.json"
    split_file = cirr / "image_splits" / f"split.{version}.{split}.json"
    records = _read_json(cap_file)
    name_to_rel = _read_json(split_file)
    if not isinstance(records, list):
        raise InputError(f"{cap_file.name} must hold a list of queries")
    if not isinstance(name_to_rel, dict):
        raise InputError(f"{split_file.name} must map image names to relative paths")
    samples: List[CIRSample] = []
    for i, r in enumerate(records):
        _require(r, ("pairid", "reference", "caption", "img_set"), cap_file, i)
        img_set = r["img_set"]
        if not isinstance(img_set, dict) or "members" not in img_set:
            raise InputError(f"{cap_file.name}: entry {i} has no img_set.members")
        target = r.get("target_hard")
        samples.append(
            CIRSample(
                query_id=str(r["pairid"]),
                reference=str(r["reference"]),
                texts=[str(r["caption"])],
                targets=[str(target)] if target else [],
                subset=[str(m) for m in img_set["members"]],
                extra={"target_soft": r.get("target_soft", {}), "img_set_id": img_set.get("id")},
            )
        )
    gallery = list(name_to_rel.keys())
    base = _cirr_image_base(root, cirr, list(name_to_rel.values()))
    image_paths: Dict[str, Path] = {}
    folders: Dict[Path, Set[str]] = {}
    for name, rel in name_to_rel.items():
        p = base / rel
        d = p.parent
        if d not in folders:
            folders[d] = _list_files(d)
        if p.name in folders[d]:
            image_paths[name] = Path(os.path.normpath(p))
    return _finish("cirr", split, root, samples, gallery, image_paths, skip_missing)


# ----------------------------------------------------------------------------- CIRCO
def circo_image_name(image_id) -> str:
    """COCO unlabeled2017 file name of an id: 12 zero-padded digits + .jpg."""
    return f"{int(image_id):012d}.jpg"


def load_circo(root, split: str = "val", skip_missing: bool = False) -> CIRDataset:
    """CIRCO ``split`` (val, test). targets = gt_img_ids (the first is target_img_id); gallery =
    the COCO 2017 unlabeled set; query_id = str(id); extra: shared_concept, target_img_id."""
    root = Path(root)
    ann_file = root / "annotations" / f"{split}.json"
    records = _read_json(ann_file)
    if not isinstance(records, list):
        raise InputError(f"{ann_file.name} must hold a list of queries")
    samples: List[CIRSample] = []
    for i, r in enumerate(records):
        _require(r, ("id", "reference_img_id", "relative_caption"), ann_file, i)
        gts = [str(int(g)) for g in r.get("gt_img_ids", []) or []]
        target = r.get("target_img_id")
        if target is not None and gts and str(int(target)) != gts[0]:
            raise InputError(f"{ann_file.name}: entry {i}: target_img_id is not the first of gt_img_ids")
        if target is not None and not gts:
            gts = [str(int(target))]
        samples.append(
            CIRSample(
                query_id=str(r["id"]),
                reference=str(int(r["reference_img_id"])),
                texts=[str(r["relative_caption"])],
                targets=gts,
                extra={"shared_concept": r.get("shared_concept", ""), "target_img_id": target},
            )
        )
    coco = root / "COCO2017_unlabeled"
    img_dir = coco / "unlabeled2017"
    info_file = coco / "annotations" / "image_info_unlabeled2017.json"
    files = _list_files(img_dir)
    if info_file.is_file():
        info = _read_json(info_file)
        if not isinstance(info, dict) or "images" not in info:
            raise InputError(f"{info_file.name} has no 'images' list")
        gallery = [str(int(im["id"])) for im in info["images"]]
        names = {str(int(im["id"])): im.get("file_name", circo_image_name(im["id"])) for im in info["images"]}
    else:
        ids = sorted(int(f[:-4]) for f in files if f.endswith(".jpg") and f[:-4].isdigit())
        gallery = [str(i) for i in ids]
        names = {g: circo_image_name(g) for g in gallery}
    wanted = set(gallery) | {s.reference for s in samples} | {t for s in samples for t in s.targets}
    image_paths: Dict[str, Path] = {}
    for gid in wanted:
        fname = names.get(gid, circo_image_name(gid))
        if fname in files:
            image_paths[gid] = img_dir / fname
    return _finish("circo", split, root, samples, gallery, image_paths, skip_missing)


# ----------------------------------------------------------------------------- FashionIQ caption joining
FASHIONIQ_JOIN_RULES = ("clip4cir", "plain", "reversed", "both", "pic2word")
_STRIP = ".?, "


def _upper_first_lower_rest(text: str) -> str:
    """What Python's ``str.capitalize`` does (CLIP4Cir uses it): first char upper, rest lower."""
    return text[:1].upper() + text[1:].lower()


def join_fashioniq_captions(captions: Sequence[str], rule: str = "clip4cir") -> List[str]:
    """Turn FashionIQ's two relative captions into the text(s) a query is composed from.

    Rules (c1, c2 = the two captions in file order; strip = remove '.', '?', ',' and spaces at
    both ends):
      clip4cir  ["Strip(c1) with first letter upper, rest lower" + " and " + strip(c2)]  (default;
                CLIP4Cir's validation, followed by most fine-tuned methods)
      plain     [strip(c1) + " and " + strip(c2)]  (case unchanged)
      reversed  [strip(c2) + " and " + strip(c1)]
      both      [strip(c1) and strip(c2), strip(c2) and strip(c1)]: the two orders are composed
                separately and their normalised vectors averaged (SEARLE's validation)
      pic2word  [c2 + " and " + c1]  (no stripping; Pic2Word's evaluation)
    A single caption is used alone (after stripping for all rules but pic2word).
    """
    caps = [str(c) for c in captions]
    if rule not in FASHIONIQ_JOIN_RULES:
        raise InputError(f"unknown FashionIQ caption rule {rule!r}; use {', '.join(FASHIONIQ_JOIN_RULES)}")
    if len(caps) == 1:
        return [caps[0] if rule == "pic2word" else caps[0].strip(_STRIP)]
    if len(caps) != 2:
        raise InputError(f"FashionIQ queries have two captions, got {len(caps)}")
    c1, c2 = caps
    s1, s2 = c1.strip(_STRIP), c2.strip(_STRIP)
    if rule == "clip4cir":
        return [f"{_upper_first_lower_rest(s1)} and {s2}"]
    if rule == "plain":
        return [f"{s1} and {s2}"]
    if rule == "reversed":
        return [f"{s2} and {s1}"]
    if rule == "both":
        return [f"{s1} and {s2}", f"{s2} and {s1}"]
    return [f"{c2} and {c1}"]
