"""Shared pieces of the offline data-set builders: split rules, photo collection and the inputs every
builder reads (:class:`Inputs`, :func:`gather_inputs`). One builder module per set lives next to it;
:mod:`engine.data.builders` runs them (``python -m engine.data.builders build``)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import shutil
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
from PIL import Image

from ...errors import EngineError, InputError
from ...fileio import atomic_write_bytes
from .. import fashion_mnist, recolour, twemoji
from .. import sources as S
from ..locations import DataSources, configured
from ..formats import (
    FORMAT_VERSION,
    datasets_root,
    write_json,
)
from ..rules import CATEGORY_RULES, SPLIT_FRACTIONS, SPLITS, assign_split, unit_hash  # noqa: F401  (the builders' names)

DEFAULT_SEED = 0
MAX_SIDE = 512
RECOLOUR_TARGETS_PER_IMAGE = 3
CATEGORY_QUERIES_PER_IMAGE = 2
MIN_CATEGORY_IMAGES = 3
FMNIST_SMALL_DB_PER_CLASS = 500
FMNIST_SMALL_QUERY_PER_CLASS = 100
FMNIST_VAL_CLASSES = 3
CLASS_FRACTIONS = (0.6, 0.2, 0.2)  # train / val / test classes of the labelled emoji and photo parts
QUERY_FRACTION = 0.2
RARE_KIND_MAX_GROUPS = 12  # attribute kinds with at most this many emoji groups are spread over the splits

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover
    def tqdm(it, **_):
        return it


def _progress(it, desc: str, total: Optional[int] = None, show: bool = False):
    """A progress bar on a terminal, or anywhere when ``show`` (the build's ``Inputs.progress``)."""
    return tqdm(it, desc=desc, total=total, leave=False, disable=not sys.stderr.isatty() and not show)


# ----------------------------------------------------------------------------------------------
# splits


def class_disjoint_split(labels: Iterable, seed: int, fractions: Sequence[float] = CLASS_FRACTIONS,
                         names: Sequence[str] = SPLITS) -> dict:
    """Assign whole classes to splits (validation / test classes never appear in training).

    Returns ``{class: split}``. Classes are shuffled with ``seed`` and cut by ``fractions`` (at least
    one class per split when there are enough classes).
    """
    classes = sorted(set(labels), key=str)
    rng = random.Random(seed)
    rng.shuffle(classes)
    n = len(classes)
    counts = [int(round(f * n)) for f in fractions]
    if n >= len(names):
        counts = [max(1, c) for c in counts]
    while sum(counts) > n:
        counts[int(np.argmax(counts))] -= 1
    counts[0] += n - sum(counts)
    out, start = {}, 0
    for name, c in zip(names, counts):
        for cls in classes[start:start + c]:
            out[cls] = name
        start += c
    return out


def query_db_split(records: list[dict], seed: int, label_key: str = "label",
                   query_fraction: float = QUERY_FRACTION) -> tuple[list[dict], list[dict]]:
    """Per class: ``query_fraction`` of the items become queries (at least one), the rest the database.

    Classes with a single item go to the database only (a query needs a relevant database item).
    """
    by_class: dict = defaultdict(list)
    for r in records:
        by_class[r[label_key]].append(r)
    rng = random.Random(seed)
    query, db = [], []
    for cls in sorted(by_class, key=str):
        items = sorted(by_class[cls], key=lambda r: r["id"])
        rng.shuffle(items)
        if len(items) < 2:
            db.extend(items)
            continue
        k = min(len(items) - 1, max(1, int(round(query_fraction * len(items)))))
        query.extend(items[:k])
        db.extend(items[k:])
    return sorted(query, key=lambda r: r["id"]), sorted(db, key=lambda r: r["id"])


# ----------------------------------------------------------------------------------------------
# photos


@dataclass
class PhotoItem:
    """A real photo prepared for the sets: resized file on disk plus its metadata."""

    key: str                    # unique, file-name safe
    path: Path                  # prepared image (PNG with alpha for cut-outs, else JPEG)
    source: str
    version: str
    ref: str                    # original file inside the source package
    licence: str
    labels: tuple               # category path in the source
    caption: Optional[str] = None
    category: Optional[str] = None   # category used by category-change queries (see CATEGORY_RULES)
    group: str = ""             # split group (near-duplicates and mirrored copies share one)
    author: Optional[str] = None


# Photo sources and which label paths to keep at all (for captions / multi-label sets too).
TUX_SKIP = ("symbols/alphabets", "symbols/math", "symbols/music", "symbols/chess", "symbols/shapes")
GCOMPRIS_KEEP = ("categorization/fishes", "categorization/tools", "categorization/monuments",
                 "categorization/renewable", "categorization/others", "clickgame", "explore_monuments",
                 "explore_world_animals", "explore_farm_animals", "erase", "solar_system", "lang/words_sample")
# (GCompris "paintings" are jigsaw pieces of a few paintings: left out, they are neither photos nor
# independent images.)


def recipe_hash() -> str:
    """Short hash of the assembly recipe (format version, selection and category rules, recolour and
    split settings). A set built with another recipe is rebuilt on next use."""
    recipe = [FORMAT_VERSION, SPLIT_FRACTIONS, MAX_SIDE, RECOLOUR_TARGETS_PER_IMAGE, CATEGORY_QUERIES_PER_IMAGE,
              MIN_CATEGORY_IMAGES, FMNIST_SMALL_DB_PER_CLASS, FMNIST_SMALL_QUERY_PER_CLASS, FMNIST_VAL_CLASSES,
              CLASS_FRACTIONS, QUERY_FRACTION, CATEGORY_RULES, TUX_SKIP, GCOMPRIS_KEEP, RARE_KIND_MAX_GROUPS,
              recolour.PALETTE, [recolour.MIN_SAT, recolour.MIN_VAL, recolour.MIN_COLOURFUL, recolour.MIN_CLUSTER,
                                 recolour.MIN_CLUSTER_VAL, recolour.MIN_CLUSTER_SAT, recolour.CLUSTER_DEG,
                                 recolour.FALLOFF_DEG, recolour.MIN_TARGET_DIST], twemoji.VERSION]
    return hashlib.sha256(json.dumps(recipe, default=str).encode()).hexdigest()[:12]


def category_for(source: str, labels: Sequence[str], filename: str) -> Optional[str]:
    """Category noun of a photo by :data:`CATEGORY_RULES` (first match), or None."""
    path = "/".join(labels)
    for src, prefix, pattern, noun in CATEGORY_RULES:
        if src != source:
            continue
        if prefix is not None and not (path == prefix or path.startswith(prefix + "/")):
            continue
        if pattern is not None and not re.search(pattern, filename, re.IGNORECASE):
            continue
        return noun
    return None


def category_text(noun: str) -> str:
    """Modification text of a category-change query: "a photo of a <noun>"."""
    article = "an" if noun[0].lower() in "aeiou" else "a"
    return f"a photo of {article} {noun}"


def words_from_filename(stem: str) -> str:
    """'arcDeTriomphe2' -> 'arc de triomphe'; 'AlbrechtDurer_a1' -> 'albrecht durer a'."""
    stem = re.sub(r"([a-z])([A-Z])", r"\1 \2", stem)
    stem = re.sub(r"[_\-]+", " ", stem)
    stem = re.sub(r"\d+", " ", stem)
    return re.sub(r"\s+", " ", stem).strip().lower()


def photo_caption(source: str, labels: Sequence[str], filename: str, caption: Optional[str],
                  category: Optional[str]) -> Optional[str]:
    """English caption: the source's own caption / product name, else one derived from the file name."""
    stem = filename.rsplit(".", 1)[0]
    if caption:
        caption = caption.strip()
        if source == "saleor" and labels:
            return f"{caption}, {labels[-1].lower()}"
        return caption
    words = words_from_filename(stem)
    if not words:
        return None
    if category == "painting":
        artist = words_from_filename(stem.split("_")[0])
        return f"a painting by {artist}" if artist else "a painting"
    if category in ("fish", "tool", "planet", "renewable energy installation") and re.fullmatch(r"[a-z ]+", words):
        return words if category in words else f"{words}, a {category}"
    if category == "monument":
        return f"{words}, a monument"
    return words


def _dhash(img: Image.Image, size: int = 8) -> str:
    g = np.asarray(img.convert("L").resize((size + 1, size), Image.BILINEAR), dtype=np.int16)
    bits = (g[:, 1:] > g[:, :-1]).ravel()
    return "%0*x" % (size * size // 4, int("".join("1" if b else "0" for b in bits), 2))


def _has_alpha(img: Image.Image) -> bool:
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        alpha = np.asarray(img.convert("RGBA"))[..., 3]
        return bool((alpha < 250).any())
    return False


def prepare_image(data: bytes, name: str) -> Image.Image:
    """Decode and resize (longest side <= MAX_SIDE); keeps alpha for cut-outs, else RGB."""
    try:
        img = Image.open(io.BytesIO(data))
        img.seek(0)
        img.load()
    except Exception as exc:
        raise InputError(f"{name} could not be decoded: {exc}") from None
    img = img.convert("RGBA") if _has_alpha(img) else img.convert("RGB")
    if max(img.size) > MAX_SIDE:
        img.thumbnail((MAX_SIDE, MAX_SIDE), Image.LANCZOS)
    return img


def save_image(img: Image.Image, path_stem: Path) -> Path:
    """PNG for images with alpha (lossless, keeps the cut-out), JPEG q90 otherwise; atomic."""
    path = path_stem.with_suffix(".png" if img.mode == "RGBA" else ".jpg")
    buf = io.BytesIO()
    if img.mode == "RGBA":
        img.save(buf, format="PNG", optimize=False)
    else:
        img.save(buf, format="JPEG", quality=90)
    return atomic_write_bytes(path, buf.getvalue())


SOURCE_SHORT = {"tuxpaint-stamps-default": "tux", "gcompris-qt-data": "gcompris", "saleor": "saleor",
                "scikit-image": "skimage", "scikit-learn": "sklearn"}


def photo_key(source: str, ref: str) -> str:
    """Readable, file-name safe key: short source name + the original path without boilerplate."""
    path = ref.split(":/")[-1]
    path = re.sub(r"^(gcompris/src/activities/|saleor/static/placeholders/|skimage/data/|sklearn/datasets/images/)", "", path)
    path = path.replace("/resource/", "/").replace("/images/", "/").rsplit(".", 1)[0]
    key = re.sub(r"[^A-Za-z0-9]+", "_", f"{SOURCE_SHORT.get(source, source)}_{path}").strip("_").lower()
    if len(key) > 80:
        key = key[:71] + "_" + hashlib.sha1(ref.encode()).hexdigest()[:8]
    return key


def _source_records(sources: DataSources):
    """Photo records of every available source (the Debian packages' folders from ``sources``)."""
    out, missing = [], []
    readers = [
        ("tuxpaint", lambda: S.tuxpaint_stamps(root=Path(sources.tuxpaint_stamps))),
        ("gcompris", lambda: S.gcompris_images(rcc_dir=Path(sources.gcompris_rcc))),
        ("saleor", S.saleor_products),
        ("skimage", S.skimage_samples),
        ("sklearn", S.sklearn_samples),
    ]
    for name, reader in readers:
        try:
            recs = list(reader())
        except EngineError as exc:  # a missing package: build without it, say so in the manifest
            missing.append(f"{name}: {exc}")
            continue
        if name == "tuxpaint":
            recs = [r for r in recs if not any("/".join(r.labels).startswith(p) for p in TUX_SKIP)]
        elif name == "gcompris":
            recs = [r for r in recs if any("/".join(r.labels).startswith(p) for p in GCOMPRIS_KEEP)]
        elif name == "saleor":
            recs = [r for r in recs if r.labels[:1] != ("products-list",)]
        out.extend(recs)
    return out, missing


def collect_photos(seed: int = DEFAULT_SEED, work_dir: Optional[Path] = None,
                   sources: Optional[DataSources] = None) -> tuple[list[PhotoItem], dict]:
    """Read, de-duplicate and resize every photo once; cached in ``datasets/_photos``. ``sources``: where the
    photo packages are (default: what the entry point configured, :mod:`engine.data.locations`).

    Returns the items and a summary (per-source counts, versions, licences, missing sources).
    """
    sources = sources or configured()
    work = Path(work_dir) if work_dir else datasets_root() / "_photos"
    index_file = work / f"photos-{recipe_hash()}.json"  # the photo selection does not depend on the seed
    if index_file.is_file():
        try:
            saved = json.loads(index_file.read_text(encoding="utf-8"))
            items = [PhotoItem(**{**d, "path": work / d["path"], "labels": tuple(d["labels"])}) for d in saved["items"]]
            if all(it.path.is_file() for it in items):
                return items, saved["summary"]
        except (OSError, json.JSONDecodeError, TypeError, KeyError):
            pass
    records, missing = _source_records(sources)
    items: list[PhotoItem] = []
    seen_bytes: set[str] = set()
    used_keys: set[str] = set()
    hash_group: dict[str, str] = {}
    for rec in _progress(records, "photos", total=len(records), show=sources.progress):
        try:
            data = rec.read_bytes()
        except (OSError, InputError):
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen_bytes:
            continue  # the same file shipped twice (e.g. in two GCompris activities)
        try:
            img = prepare_image(data, rec.name)
        except InputError:
            continue
        if min(img.size) < 32:
            continue
        seen_bytes.add(digest)
        filename = rec.name
        key = photo_key(rec.source, rec.ref)
        while key in used_keys:
            key += "_x"
        used_keys.add(key)
        base_ref = re.sub(r"_mirror(?=\.[A-Za-z]+$)", "", rec.ref)
        dh = f"dhash:{_dhash(img)}"
        # mirrored copies share their original's group, near-identical pixels share one too
        group = hash_group.get(f"ref:{base_ref}") or hash_group.get(dh) or f"photo:{rec.source}:{base_ref}"
        hash_group.setdefault(f"ref:{base_ref}", group)
        hash_group.setdefault(dh, group)
        category = category_for(rec.source, rec.labels, filename)
        path = save_image(img, work / "images" / key)
        items.append(PhotoItem(
            key=key, path=path, source=rec.source, version=rec.version, ref=rec.ref, licence=rec.licence,
            labels=tuple(rec.labels), caption=photo_caption(rec.source, rec.labels, filename, rec.caption, category),
            category=category, group=group, author=rec.author,
        ))
    summary = {
        "sources": _source_summary(items),
        "missing_sources": missing,
    }
    write_json(index_file, {
        "items": [{**it.__dict__, "path": str(it.path.relative_to(work)), "labels": list(it.labels)} for it in items],
        "summary": summary,
    })
    return items, summary


def _source_summary(items: Sequence[PhotoItem]) -> dict:
    out: dict = {}
    for it in items:
        s = out.setdefault(it.source, {"version": it.version, "images": 0, "licences": Counter()})
        s["images"] += 1
        s["licences"][it.licence] += 1
    return {k: {**v, "licences": dict(v["licences"])} for k, v in sorted(out.items())}


# ----------------------------------------------------------------------------------------------
# inputs


@dataclass
class Inputs:
    """Everything the builders read; the real one comes from :func:`gather_inputs`, tests make small ones."""

    emojis: list = field(default_factory=list)        # twemoji.Emoji
    emoji_img_dir: Optional[Path] = None
    emoji_version: str = "none"
    photos: list = field(default_factory=list)        # PhotoItem
    photo_summary: dict = field(default_factory=dict)
    fmnist: Optional[tuple] = None                    # (train_x, train_y, test_x, test_y)
    fmnist_version: str = "none"
    progress: bool = False                            # progress bars even when stderr is not a terminal


def gather_inputs(names: Sequence[str], seed: int = DEFAULT_SEED, sources: Optional[DataSources] = None) -> Inputs:
    """Load the real sources needed by ``names`` (installs the Twemoji npm package into the cache); ``sources``:
    their folders (default: what the entry point configured, :mod:`engine.data.locations`)."""
    sources = sources or configured()
    inp = Inputs(progress=sources.progress)
    need_emoji = any(n in names for n in ("cir", "captions", "labelled", "multilabel"))
    need_photos = any(n in names for n in ("cir", "captions", "labelled", "multilabel", "open_vocab"))
    if need_emoji:
        pkg = twemoji.package_dir(install=True, folder=sources.twemoji_dir)
        inp.emojis = twemoji.load_emoji(pkg)
        inp.emoji_img_dir = pkg / twemoji.IMAGE_SUBDIR
        inp.emoji_version = twemoji.installed_version(pkg)
    if need_photos:
        inp.photos, inp.photo_summary = collect_photos(seed, sources=sources)
    if "labelled" in names:
        if fashion_mnist.available(sources.fashion_mnist_dir):
            tx, ty = fashion_mnist.load("train", sources.fashion_mnist_dir)
            vx, vy = fashion_mnist.load("test", sources.fashion_mnist_dir)
            inp.fmnist = (tx, ty, vx, vy)
            inp.fmnist_version = fashion_mnist.package_version()
    return inp


# ----------------------------------------------------------------------------------------------
# builders


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _emoji_rel(e) -> str:
    return f"twemoji/{e.image}"


def _emoji_groups(inp: Inputs) -> dict[str, str]:
    return twemoji.variant_groups(inp.emojis)



def emoji_group_splits(emojis: Sequence, seed: int) -> dict[str, str]:
    """Split of every emoji group. Groups holding a rare attribute kind (hair, direction: only a few
    families) are spread over the splits in a seeded order (test, val, then train) so every split gets
    some; all other groups use :func:`assign_split`."""
    groups = twemoji.variant_groups(emojis)
    out = {g: assign_split(g, seed) for g in set(groups.values())}
    kinds: dict[str, set] = defaultdict(set)
    for base, kind, _, variant in twemoji.attribute_relations(emojis):
        kinds[kind].add(groups[base])
        kinds[kind].add(groups[variant])
    fixed: set = set()
    for kind in sorted(kinds):
        gs = sorted(kinds[kind] - fixed)
        if not gs or len(kinds[kind]) > RARE_KIND_MAX_GROUPS:
            continue
        random.Random(f"{seed}:{kind}").shuffle(gs)
        order = ["test", "val"] + ["train"] * max(0, len(gs) - 2)
        for g, split in zip(gs, order):
            out[g] = split
            fixed.add(g)
    return out


def _twemoji_sources(inp: Inputs) -> dict:
    return {"twemoji": {"package": f"npm {twemoji.PACKAGE}", "version": inp.emoji_version,
                        "licence": twemoji.LICENCE_IMAGES, "data_licence": twemoji.LICENCE_DATA}}


def _photo_sources(inp: Inputs) -> dict:
    return {"photos": inp.photo_summary or _source_summary(inp.photos)}
