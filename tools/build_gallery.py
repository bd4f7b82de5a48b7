#!/usr/bin/env python3
"""Rebuild the bundled demo gallery (``assets/gallery/``) from offline photo sources.

Sources (see ``engine/data/sources.py`` and ``docs/gallery.md``): Tux Paint photo stamps,
GCompris photos, Saleor demo products, scikit-image and scikit-learn sample photos.

The build is deterministic (fixed seed, sorted inputs): it picks photos per category, converts
them to RGB (cut-outs composited on white, trimmed to their content), resizes the longest side
to at most 512 px, saves JPEG (quality 85) under ``assets/gallery/<category>/``, and writes
``captions.json`` (path -> English caption), ``labels.json`` (path -> labels, category first)
and ``assets/ATTRIBUTION`` (path, source package + version, original file, licence, author).

Clean-up rules (issue #28), applied by the build and on their own by ``--prune``: no mirrored copies (Tux
Paint's ``*_mirror`` stamps), no decal-only stamps (``DECAL_ONLY``), no crops of a photo already in the gallery,
and no two images the packaged backbone cannot tell apart (cosine >= ``MAX_COSINE``; the one with the shorter
name stays). ``--embeddings`` then writes the prebuilt index of the gallery for the packaged backbone
(``assets/prebuilt/``, engine/prebuilt.py), which the app uses on its first start instead of embedding.

The second pass (issue #33, ``refresh()``, tables in ``tools/gallery_additions.py``) follows: no photo under 256 px,
larger photos of the same subjects, colour variants, and night and black-and-white sets (real, and derived with
``engine.data.tone.photo_edit``); ``--refresh`` applies it alone to the gallery in place.

Usage: ``python tools/build_gallery.py [--out assets/gallery] [--seed 0]``, ``python tools/build_gallery.py --refresh``,
``python tools/build_gallery.py --prune --embeddings`` (clean the gallery in place, then write the prebuilt index).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import re
import shutil
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from tqdm import tqdm  # noqa: E402

from engine.config import Settings  # noqa: E402
from engine.data import sources  # noqa: E402
from engine.data.sources import PhotoRecord  # noqa: E402
from engine.process import configure_process  # noqa: E402

MAX_SIDE = 512
JPEG_QUALITY = 85
MAX_TOTAL_MB = 40.0

# Per-category caps (photos beyond a cap are dropped by a seeded sample; "keep" items never are).
CAPS = {
    "animals": 120, "food": 40, "products": 40, "vehicles": 25, "buildings": 45,
    "plants": 30, "tools": 28, "household": 22, "music": 14, "space": 12, "energy": 14,
    "people": 6, "sports": 8,
}


@dataclass
class Item:
    """A photo chosen for the gallery."""

    record: PhotoRecord
    category: str
    labels: List[str]
    caption: str
    slug: str
    keep: bool = False                       # never dropped by the caps
    crop: Optional[Tuple[int, int, int, int]] = None   # (left, top, right, bottom) in source pixels
    note: str = ""                           # e.g. "crop of ..."


# ---------------------------------------------------------------------------------------
# text helpers


def words_from_name(name: str) -> str:
    """'measuringTape2' -> 'measuring tape', 'polar_bear' -> 'polar bear'."""
    stem = name.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    stem = re.sub(r"([a-z])([A-Z])", r"\1 \2", stem)
    stem = re.sub(r"[_\-]+", " ", stem)
    stem = re.sub(r"\d+", " ", stem)
    return re.sub(r"\s+", " ", stem).strip().lower()


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48] or "photo"


def article(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def clean_caption(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip().rstrip(".")
    return text[:1].lower() + text[1:] if text[:2] in ("A ", "An") else text


# ---------------------------------------------------------------------------------------
# photo-likeness of cut-out stamps


def colour_richness(path: Path) -> int:
    """Distinct colours (5 bits per channel) among opaque pixels of a 128 px thumbnail.

    Photographic cut-outs have hundreds; flat drawings have a few dozen."""
    img = Image.open(path)
    img.load()
    img = img.convert("RGBA")
    img.thumbnail((128, 128))
    arr = np.asarray(img)
    px = arr[arr[..., 3] > 200][:, :3].astype(np.int32) // 8
    if len(px) < 50:
        return 0
    return int(len(np.unique(px[:, 0] * 1024 + px[:, 1] * 32 + px[:, 2])))


PHOTO_COLOURS = 120


def dhash(img: Image.Image) -> int:
    small = np.asarray(img.convert("L").resize((9, 8), Image.BILINEAR), dtype=np.int16)
    bits = (small[:, 1:] > small[:, :-1]).flatten()
    return int("".join("1" if b else "0" for b in bits), 2)


# ---------------------------------------------------------------------------------------
# per-source selection

TUX_ANIMAL_GROUPS = {
    "amphibians": "amphibian", "birds": "bird", "fish": "fish", "insects": "insect",
    "lizards": "reptile", "marsupials": "mammal", "shellfish": "shellfish", "mammals": "mammal",
}
TUX_SKIP_TOP = {"symbols", "seasonal", "naturalforces", "military", "clothes"}  # clothes: drawings
TUX_SKIP_DIRS = {("town", "flags"), ("town", "roadsigns"), ("people", "toys"), ("people", "body_parts")}
TUX_LABEL_FIX = {
    "planets": "planet", "vegetables": "vegetable", "nuts": "nut", "trees": "tree", "mushrooms": "mushroom",
    "dishes": "dish", "arttools": "art tools", "auto": "car", "flight": "aircraft", "planes": "airplane",
    "emergency": "emergency vehicle", "ship": "boat", "cycle": "bicycle", "race": "race car",
    "construction": "construction vehicle", "masstransit": "bus", "spices": "spice", "utensils": "utensil",
    "string": "string instrument", "percussion": "percussion instrument", "brass": "brass instrument",
    "wind": "wind instrument", "moon": "moon", "monuments": "monument", "military": "military vehicle",
}
TUX_SKIP_FILES = {"food/pizza.png"}   # drawings rich enough in colour to pass the photo test
# stamps that are only decals or markings on white, no object a person would search for
DECAL_ONLY = {"vehicles/emergency/sedan_police.png"}
MAX_COSINE = 0.999   # images at or above this cosine on the packaged backbone are near-duplicates


def is_mirror(ref: str) -> bool:
    """Tux Paint's mirrored copy of a stamp (``name_mirror.png``): the same picture flipped."""
    return bool(re.search(r"_mirror\.[A-Za-z]+$", ref.split(" (crop", 1)[0]))
TUX_TOP_CATEGORY = {
    "animals": "animals", "food": "food", "household": "household",
    "medical": "household", "people": "people", "plants": "plants", "space": "space",
    "sports": "sports", "vehicles": "vehicles", "town": "buildings",
}


def tuxpaint_items(records: Iterable[PhotoRecord]) -> List[Item]:
    items = []
    for r in records:
        parts = list(r.labels)
        if not parts or parts[0] in TUX_SKIP_TOP:
            if parts[:2] == ["military", "vehicles"]:
                parts = ["vehicles", "military"]
            else:
                continue
        if tuple(parts[:2]) in TUX_SKIP_DIRS or r.ref in TUX_SKIP_FILES or r.ref in DECAL_ONLY or is_mirror(r.ref):
            continue
        if parts[0] == "household" and len(parts) > 1 and parts[1] == "tools":
            category = "tools"
        elif parts[0] == "hobbies":
            if len(parts) > 1 and parts[1] == "music":
                category = "music"
            else:
                continue
        else:
            category = TUX_TOP_CATEGORY.get(parts[0])
        if category is None:
            continue
        if colour_richness(r.path) < PHOTO_COLOURS:
            continue
        noun = words_from_name(r.name)
        caption = clean_caption(r.caption) if r.caption else article(noun)
        labels = [category]
        keep = False
        if category == "animals":
            group = TUX_ANIMAL_GROUPS.get(parts[1], "animal") if len(parts) > 1 else "animal"
            labels.append(group)
            if "cats" in parts:
                labels.append("big cat")
            if "dogs" in parts:
                if noun == "dog":
                    labels.append("dog")
                    keep = True
                else:
                    labels.append("wild dog" if noun == "dingo" else noun)
                    keep = noun == "dingo"
            if len(parts) > 2 and parts[2] not in ("cats", "dogs"):
                labels.append(parts[2].rstrip("s"))
        else:
            labels.extend(TUX_LABEL_FIX.get(p, p.replace("_", " ")) for p in parts[1:] if p != category)
            if category == "food" and "fruit" in parts:
                labels = ["food", "fruit"] + [p for p in labels[2:] if p != "fruit"]
            if category == "plants" and "flowers" in parts:
                labels = ["plants", "flower"] + [p for p in labels[2:] if p != "flowers"]
        if noun and noun not in labels:
            labels.append(noun)
        slug = slugify(noun) if noun else slugify(re.sub(r"^an? ", "", caption))
        items.append(Item(r, category, _dedupe(labels), caption, slug, keep=keep))
    return items


GC_DETAILS_PHOTOS = {
    "Chenonceau_background": "the Chateau de Chenonceau over the river",
    "EgeskovSlotSpejling_background": "Egeskov castle reflected in its moat",
    "EilanDonanCastle_background": "Eilean Donan castle in Scotland",
    "FanoeWindmill_background": "a windmill on the island of Fanoe",
    "GizahPyramids_background": "the pyramids of Giza",
    "Louvre_2007_02_24_c_background": "the Louvre pyramid in Paris",
    "NDP_background": "the cathedral of Notre-Dame de Paris",
    "Nagoya_background": "Nagoya castle in Japan",
    "Neuschwanstein_background": "Neuschwanstein castle",
    "OperaSidney_background": "the Sydney Opera House",
    "TajMahal_background": "the Taj Mahal",
    "TourEiffel_background": "the Eiffel Tower",
    "TowerBridgeLondon_background": "Tower Bridge in London",
}
GC_HANDS = {
    "main_droite_dessus_0": "the back of a right hand",
    "main_gauche_paume_0": "the palm of a left hand",
    "poing_droit_dessus_0": "a right fist seen from above",
    "poing_gauche_paume_0": "a left fist seen from the palm side",
}
GC_DOG_PIECES = {
    ("babyshapes", "dog1", "dog3"): "the head of a golden retriever dog",
    ("babyshapes", "dog2", "dog5"): "a golden retriever dog lying on the grass",
}
GC_MUSIC = {
    "africa": "African drums", "america": "a drum kit and electric guitar",
    "australia": "a man playing a didgeridoo", "ireland": "Irish folk musicians playing",
    "italy": "Italian singers performing", "japan": "Japanese musicians on stage",
    "mexico": "a Mexican mariachi band", "middleeast": "a Middle Eastern string instrument",
    "orchestra": "a symphony orchestra",
}
GC_ENERGY = {"dam": ("a hydroelectric dam", "dam"), "solar": ("solar panels", "solar panel"),
             "windmill": ("a wind turbine", "wind turbine"),
             "geothermal": ("a geothermal power station", "power station")}
GC_FIX_NOUN = {"chamaeleon": "chameleon", "dragon": "komodo dragon", "spoonbills": "spoonbill",
               "swans": "swan", "camels": "camel", "meerkats": "meerkat", "gosling": "gosling",
               "polar bear": "polar bear", "scarlet macaw": "scarlet macaw"}
GC_BIRDS = {"heron", "kingfisher", "northern harrier", "penguin", "spoonbill", "swan", "toucan",
            "chicken", "duck", "owl", "scarlet macaw", "gosling"}
GC_INSECTS = {"bee", "butterfly", "caterpillar"}
GC_REPTILES = {"chameleon", "crocodile", "komodo dragon"}
GC_MONUMENT_NAMES = {
    "arc de triomphe": "the Arc de Triomphe", "burj": "the Burj Khalifa tower",
    "le musee": "the Louvre museum", "us capitol": "the United States Capitol",
    "zimni palace": "the Winter Palace", "empire state": "the Empire State Building",
    "juche tower": "the Juche Tower", "monument": "a monument", "cathedral": "a cathedral",
}


def gcompris_items(records: Iterable[PhotoRecord]) -> List[Item]:
    items = []
    for r in records:
        parts = list(r.labels)
        if not parts:
            continue
        activity = parts[0]
        stem = r.name.rsplit(".", 1)[0]
        noun = words_from_name(r.name)
        noun = GC_FIX_NOUN.get(noun, noun)
        if activity in ("erase", "explore_farm_animals", "explore_world_animals"):
            group = "bird" if noun in GC_BIRDS else "insect" if noun in GC_INSECTS else \
                "reptile" if noun in GC_REPTILES else "crab" if noun == "crab" else "mammal"
            labels = ["animals", group] + (["big cat"] if noun in ("cheetah", "jaguar") else []) + [noun]
            keep = False
            if noun in ("cat", "kitten"):
                labels = ["animals", "mammal", "cat", "kitten"]
                keep = True
            elif noun == "dog":
                labels = ["animals", "mammal", "dog", "german shepherd"]
                keep = True
            items.append(Item(r, "animals", labels, article(noun), slugify(noun), keep=keep))
        elif activity == "babyshapes" and (activity, parts[-1], stem) in GC_DOG_PIECES:
            items.append(Item(r, "animals", ["animals", "mammal", "dog", "golden retriever"],
                              GC_DOG_PIECES[(activity, parts[-1], stem)], "golden-retriever", keep=True))
        elif activity == "categorization" and len(parts) > 1:
            kind = parts[1]
            if kind == "fishes":
                items.append(Item(r, "animals", ["animals", "fish"], "a fish", "fish"))
            elif kind == "monuments":
                name = GC_MONUMENT_NAMES.get(noun, noun.title())
                items.append(Item(r, "buildings", ["buildings", "monument", noun], name, slugify(noun)))
            elif kind == "tools":
                items.append(Item(r, "tools", ["tools", noun], article(noun), slugify(noun)))
            elif kind == "others":
                items.append(Item(r, "household", ["household", noun], article(noun), slugify(noun)))
            elif kind == "renewable":
                key = re.sub(r"\d+", "", stem)
                cap, label = GC_ENERGY.get(key, (noun, noun))
                items.append(Item(r, "energy", ["energy", label], cap, slugify(label)))
        elif activity == "explore_monuments" and r.name.endswith(".webp") and not noun.startswith("texture"):
            country = parts[1] if len(parts) > 1 else ""
            items.append(Item(r, "buildings", ["buildings", "monument", noun] + ([country] if country else []),
                              f"{noun.title()}", slugify(noun)))
        elif activity == "details" and stem in GC_DETAILS_PHOTOS:
            cap = GC_DETAILS_PHOTOS[stem]
            labels = ["buildings", "windmill" if "windmill" in cap else "landmark"]
            items.append(Item(r, "buildings", labels, cap, slugify(stem.replace("_background", ""))))
        elif activity == "explore_world_music" and stem in GC_MUSIC:
            items.append(Item(r, "music", ["music", "musicians" if stem not in ("africa", "middleeast") else "instrument"],
                              GC_MUSIC[stem], slugify(f"music {stem}")))
        elif activity == "solar_system":
            cap = "the Sun" if stem == "sun" else f"the planet {stem.title()}"
            items.append(Item(r, "space", ["space", "star" if stem == "sun" else "planet", stem], cap, slugify(stem)))
        elif activity == "leftright" and stem in GC_HANDS:
            items.append(Item(r, "people", ["people", "hand"], GC_HANDS[stem], slugify(GC_HANDS[stem])))
    return items


SALEOR_KIND = {
    "Hoodies": ("products", "clothes", "hoodie"), "T-shirts": ("products", "clothes", "t-shirt"),
    "Polo Shirts": ("products", "clothes", "polo shirt"), "Footwear": ("products", "shoes", "sneakers"),
    "Alcohol": ("products", "drinks", "bottle"), "Juices": ("products", "drinks", "juice"),
    "Paints": ("products", "paint", "paint tin"), "Homewares": ("products", "homewares", "cushion"),
}


def saleor_items(records: Iterable[PhotoRecord]) -> List[Item]:
    items = []
    for r in records:
        if "products-list" in r.labels or not r.caption:
            continue   # collection banners, not products
        category = r.labels[-1] if r.labels else ""
        top, kind, noun = SALEOR_KIND.get(category, ("products", "product", "product"))
        if "beer" in r.name or "Beer" in r.caption or "Lager" in r.caption:
            noun = "beer bottle"
        elif "wine" in r.name:
            noun = "wine bottle"
        caption = f"{r.caption} ({category.lower()})" if category else r.caption
        items.append(Item(r, top, [top, kind, noun], caption, slugify(r.caption)))
    return items


SAMPLE_SLUGS = {"flower.jpg": "pink-flower", "china.jpg": "chinese-temple", "chelsea.png": "chelsea-the-cat",
                "hubble_deep_field.jpg": "hubble-deep-field", "camera.png": "photographer"}


def sample_items(records: Iterable[PhotoRecord]) -> List[Item]:
    items = []
    for r in records:
        labels = list(r.labels)
        category = labels[0]
        keep = True
        if "cat" in labels:
            labels = ["animals", "mammal", "cat"]
        slug = SAMPLE_SLUGS.get(r.name, slugify(words_from_name(r.name)))
        items.append(Item(r, category, labels, r.caption or words_from_name(r.name), slug, keep=keep))
    return items


def _dedupe(seq: Sequence[str]) -> List[str]:
    seen, out = set(), []
    for s in seq:
        if s and s not in seen:
            seen.add(s)
            out.append(s)
    return out


# ---------------------------------------------------------------------------------------
# image conversion


def to_gallery_jpeg(record: PhotoRecord, crop=None) -> Tuple[bytes, Tuple[int, int], Image.Image]:
    """Decode, crop, trim transparent margins, composite on white, resize, JPEG-encode."""
    img = Image.open(io.BytesIO(record.read_bytes()))
    img.seek(0)
    img.load()
    if crop:
        img = img.crop(crop)
    if img.mode in ("P", "LA", "PA") or "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode == "RGBA":
        alpha = img.getchannel("A")
        bbox = alpha.point(lambda a: 255 if a > 16 else 0).getbbox()
        if bbox:
            pad = max(4, int(0.04 * max(bbox[2] - bbox[0], bbox[3] - bbox[1])))
            bbox = (max(0, bbox[0] - pad), max(0, bbox[1] - pad),
                    min(img.width, bbox[2] + pad), min(img.height, bbox[3] + pad))
            img = img.crop(bbox)
        white = Image.new("RGBA", img.size, (255, 255, 255, 255))
        white.alpha_composite(img)
        img = white
    img = img.convert("RGB")
    if max(img.size) > MAX_SIDE:
        scale = MAX_SIDE / max(img.size)
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=JPEG_QUALITY, optimize=True)
    return buf.getvalue(), img.size, img


# ---------------------------------------------------------------------------------------
# build


def collect(saleor_cache: Optional[Path] = None) -> List[Item]:
    items: List[Item] = []
    print("reading Tux Paint stamps ...")
    items += tuxpaint_items(tqdm(list(sources.tuxpaint_stamps()), desc="tuxpaint", unit="img"))
    print("reading GCompris archives ...")
    items += gcompris_items(sources.gcompris_images())
    print("reading the Saleor wheel ...")
    items += saleor_items(sources.saleor_products(cache=saleor_cache))
    items += sample_items(sources.skimage_samples())
    items += sample_items(sources.sklearn_samples())
    return items


def select(items: List[Item], seed: int) -> List[Item]:
    rng = random.Random(seed)
    by_cat: Dict[str, List[Item]] = defaultdict(list)
    for it in items:
        by_cat[it.category].append(it)
    chosen = []
    for cat in sorted(by_cat):
        group = sorted(by_cat[cat], key=lambda i: (i.record.source, i.record.ref, i.crop or ()))
        keep = [i for i in group if i.keep]
        rest = [i for i in group if not i.keep]
        cap = CAPS.get(cat, 10)
        n = max(0, min(len(rest), cap - len(keep)))
        chosen += keep + rng.sample(rest, n)
    return chosen


def build(out: Path, seed: int = 0, saleor_cache: Optional[Path] = None) -> Dict[str, object]:
    items = select(collect(saleor_cache), seed)
    items.sort(key=lambda i: (i.category, i.slug, i.record.ref, i.crop or ()))
    tmp = out.parent / f".{out.name}.building"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    captions: Dict[str, str] = {}
    labels: Dict[str, List[str]] = {}
    attribution: List[Tuple[str, ...]] = []
    hashes: Dict[int, str] = {}
    used = set()
    total = 0
    for it in tqdm(items, desc="gallery", unit="img"):
        data, size, img = to_gallery_jpeg(it.record, it.crop)
        h = dhash(img)
        dup = next((p for hh, p in hashes.items() if bin(hh ^ h).count("1") <= 3), None)
        if dup is not None and not it.keep:
            continue   # near-duplicate of a photo already in (same picture from two activities)
        rel = f"{it.category}/{it.slug}.jpg"
        k = 2
        while rel in used:
            rel = f"{it.category}/{it.slug}-{k}.jpg"
            k += 1
        used.add(rel)
        hashes[h] = rel
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
        total += len(data)
        captions[rel] = it.caption
        labels[rel] = _dedupe(it.labels)
        r = it.record
        original = r.ref + (f" (crop {it.crop[0]},{it.crop[1]},{it.crop[2]},{it.crop[3]})" if it.crop else "")
        attribution.append((rel, f"{r.source} {r.version}", original, r.licence,
                            (r.author or "").replace("\t", " "), r.url or ""))
    (tmp / "captions.json").write_text(json.dumps(captions, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    (tmp / "labels.json").write_text(json.dumps(labels, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    if total / 1e6 > MAX_TOTAL_MB:
        raise SystemExit(f"gallery is {total / 1e6:.1f} MB, over the {MAX_TOTAL_MB} MB budget")
    # swap in atomically-ish: old -> .old, tmp -> out, drop old
    old = out.parent / f".{out.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    if old.exists():
        shutil.rmtree(old)
    write_attribution(out.parent / "ATTRIBUTION", attribution)
    counts = Counter(rel.split("/", 1)[0] for rel in captions)
    return {"files": len(captions), "bytes": total, "per_category": dict(sorted(counts.items())),
            "cats": sorted(p for p, l in labels.items() if "cat" in l),
            "dogs": sorted(p for p, l in labels.items() if "dog" in l)}


ATTRIBUTION_HEADER = """\
# Attribution of the bundled demo gallery (assets/gallery/), generated by tools/build_gallery.py.
# One line per file, tab-separated:
#   path<TAB>source package and version<TAB>original file<TAB>licence<TAB>author<TAB>upstream URL
# "path" is relative to assets/gallery/. Photos are resized (longest side <= 512 px), cut-outs
# are trimmed and composited on white, and all are re-encoded as JPEG; a "(crop x0,y0,x1,y1)"
# after the original file marks a crop of it. Sources:
#   tuxpaint-stamps-default (Debian): stamps under /usr/share/tuxpaint/stamps, GPL-2
#     (Copyright Bill Kendrick and the Tux Paint contributors).
#   gcompris-qt-data (Debian): images inside the Qt resource archives (archive.rcc:/path);
#     per-file licences from the README notes in the archives, else the package's
#     debian/copyright (GPL-3+ for the GCompris project files).
#   saleor 2.10.1 (PyPI wheel): saleor/static/placeholders, BSD-3-Clause, Copyright Mirumee Software.
#   scikit-image: skimage/data, licences as stated in the skimage.data docstrings.
#   scikit-learn: sklearn/datasets/images, CC-BY-2.0 (see its README.txt).
# Photos under 256 px on their longest side are not in the gallery. A "(derived from <gallery path> by
# engine.data.tone.photo_edit(rgb, '<kind>'))" after the original file marks a night ('night') or black-and-white
# ('bw') version of that gallery photo, made by this project's tone edit; it keeps that photo's licence and author.
"""


def write_attribution(path: Path, rows: List[Tuple[str, ...]]) -> None:
    text = ATTRIBUTION_HEADER + "".join("\t".join(row) + "\n" for row in rows)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# clean-up of a built gallery (also run on its own: --prune) and the prebuilt index (--embeddings)


def read_attribution(path: Path) -> List[Tuple[str, ...]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            rows.append(tuple(line.split("\t")))
    return rows


def rule_drops(rows: Sequence[Tuple[str, ...]]) -> Dict[str, str]:
    """{gallery path: reason} for mirrored copies, decal-only stamps and crops of a photo also in the gallery,
    read from the attribution's original-file column."""
    originals = {row[2] for row in rows if len(row) > 2 and " (crop " not in row[2]}
    out = {}
    for row in rows:
        rel, source, original = row[0], row[1], row[2] if len(row) > 2 else ""
        base = original.split(" (crop ", 1)[0]
        if is_mirror(original):
            out[rel] = "mirrored copy"
        elif source.startswith("tuxpaint") and base in DECAL_ONLY:
            out[rel] = "decals only"
        elif " (crop " in original and base in originals:
            out[rel] = "crop of a photo in the gallery"
    return out


def gallery_index(gallery: Path, backbone, work: Path):
    """The gallery indexed with ``backbone`` in ``work`` (incremental: unchanged photos are not embedded again)."""
    from engine.index.build import index_source

    return index_source(gallery, work, backbone, settings=Settings())


def embedding_drops(index, max_cosine: float = MAX_COSINE, skip=()) -> Dict[str, str]:
    """{path: reason} so that no two images left have cosine >= ``max_cosine``: of each such pair the one with
    the longer (then later) name goes, so ``cep.jpg`` stays and ``cep-3.jpg`` goes."""
    paths = [it["path"] for it in index.items]
    e = index.embeddings.astype(np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    order = sorted(range(len(paths)), key=lambda i: (len(paths[i]), paths[i]))
    kept: List[int] = []
    out = {}
    for i in order:
        if paths[i] in skip:
            continue
        if kept:
            sims = e[kept] @ e[i]
            j = int(np.argmax(sims))
            if sims[j] >= max_cosine:
                out[paths[i]] = f"near-duplicate of {paths[kept[j]]} (cosine {float(sims[j]):.4f})"
                continue
        kept.append(i)
    return out


def prune(out: Path, backbone, work: Path, max_cosine: float = MAX_COSINE) -> Dict[str, str]:
    """Applies the clean-up rules to the gallery at ``out`` in place (files, captions.json, labels.json and
    assets/ATTRIBUTION); returns {removed path: reason}."""
    attribution = out.parent / "ATTRIBUTION"
    rows = read_attribution(attribution)
    drops = rule_drops(rows)
    drops.update(embedding_drops(gallery_index(out, backbone, work), max_cosine, skip=set(drops)))
    for rel in drops:
        (out / rel).unlink(missing_ok=True)
    for name in ("captions.json", "labels.json"):
        data = json.loads((out / name).read_text(encoding="utf-8"))
        data = {k: v for k, v in data.items() if k not in drops}
        tmp = out / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, out / name)
    write_attribution(attribution, [row for row in rows if row[0] not in drops])
    return drops


# ---------------------------------------------------------------------------------------
# the second pass (issue #33): no photo under MIN_SIDE px, larger photos of the same subjects, colour variants,
# night and black-and-white sets (tools/gallery_additions.py)


def _source_records(sources_needed) -> Dict[Tuple[str, str], PhotoRecord]:
    """{(source, original): record} for the originals the additions name."""
    out: Dict[Tuple[str, str], PhotoRecord] = {}
    if "gcompris" in sources_needed:
        for r in sources.gcompris_images():
            if "/src/activities/" in r.ref:
                out[("gcompris", r.ref.split("/src/activities/", 1)[1])] = r
    if "tuxpaint" in sources_needed:
        for r in sources.tuxpaint_stamps():
            out[("tuxpaint", r.ref)] = r
    return out


def derive_jpeg(base: Path, kind: str) -> Tuple[bytes, Tuple[int, int]]:
    """The ``kind`` edit (engine.data.tone.photo_edit) of a gallery photo, as a gallery JPEG."""
    import torch

    from engine.data.tone import photo_edit

    with Image.open(base) as img:
        rgb = torch.from_numpy(np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
    edited = (photo_edit(rgb, kind).permute(1, 2, 0).numpy() * 255.0).round().clip(0, 255).astype(np.uint8)
    out = Image.fromarray(edited)
    buf = io.BytesIO()
    out.save(buf, "JPEG", quality=JPEG_QUALITY, optimize=True)
    return buf.getvalue(), out.size


def refresh(out: Path) -> Dict[str, str]:
    """Applies the second pass to the gallery at ``out`` in place: drops every photo under ``MIN_SIDE`` px on its
    long side (unless an addition replaces it under the same name with a larger photo of the same subject), adds
    ``ADDITIONS`` and ``DERIVED``, and adds the colour and black-and-white labels. Returns {path: what happened}."""
    from tools.gallery_additions import (ADDITIONS, COLOUR_LABELS, DERIVED, EDIT_WORDS, KIND_LABELS, MIN_SIDE,
                                         REAL_BLACK_AND_WHITE, derived_caption)

    attribution = out.parent / "ATTRIBUTION"
    rows = {row[0]: row for row in read_attribution(attribution)}
    captions = json.loads((out / "captions.json").read_text(encoding="utf-8"))
    labels = json.loads((out / "labels.json").read_text(encoding="utf-8"))
    report: Dict[str, str] = {}
    replaced = {rel for rel, *_ in ADDITIONS}
    for rel in sorted(captions):
        with Image.open(out / rel) as img:
            side = max(img.size)
        if side < MIN_SIDE and rel not in replaced:
            (out / rel).unlink()
            captions.pop(rel)
            labels.pop(rel, None)
            rows.pop(rel, None)
            report[rel] = f"dropped: {side} px on its long side"
    records = _source_records({src for _, src, *_ in ADDITIONS})
    for rel, src, original, caption, labs in ADDITIONS:
        record = records.get((src, original))
        if record is None:
            raise SystemExit(f"{rel}: {src} has no {original}")
        data, size, _ = to_gallery_jpeg(record)
        if max(size) < MIN_SIDE:
            raise SystemExit(f"{rel}: {original} is {max(size)} px on its long side, under {MIN_SIDE}")
        report[rel] = ("replaced by " if rel in captions else "added: ") + f"{record.source} {original}"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
        captions[rel], labels[rel] = caption, _dedupe(labs)
        rows[rel] = (rel, f"{record.source} {record.version}", record.ref, record.licence,
                     (record.author or "").replace("\t", " "), record.url or "")
    for rel in REAL_BLACK_AND_WHITE:
        labels[rel] = _dedupe(labels[rel] + ["black and white"])
    for rel, extra in [*COLOUR_LABELS.items(), *KIND_LABELS.items()]:
        if rel in labels:
            labels[rel] = _dedupe(labels[rel] + extra)
    colour_words = {lab for labs in COLOUR_LABELS.values() for lab in labs}
    for rel, base, kind in DERIVED:
        if base not in captions:
            raise SystemExit(f"{rel}: its base photo {base} is not in the gallery")
        _, label, base_label = EDIT_WORDS[kind]
        data, size = derive_jpeg(out / base, kind)
        (out / rel).write_bytes(data)
        how = f"derived from {base} by engine.data.tone.photo_edit(rgb, {kind!r})"
        captions[rel] = derived_caption(captions[base], kind)   # plain words; ``how`` goes to the attribution
        # a black-and-white version has no colour: the base's colour labels do not carry over
        dropped = {"day", "colour"} | (colour_words if kind == "bw" else set())
        labels[rel] = _dedupe([lab for lab in labels[base] if lab not in dropped] + [label])
        labels[base] = _dedupe(labels[base] + [base_label])
        b = rows[base]
        rows[rel] = (rel, b[1], f"{b[2]} ({how})", b[3], b[4], b[5])
        report[rel] = f"added: {how}"
    for name, data in (("captions.json", captions), ("labels.json", labels)):
        tmp = out / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, out / name)
    write_attribution(attribution, [rows[k] for k in sorted(rows)])
    return report


def write_embeddings(out: Path, backbone, work: Path) -> Path:
    """The prebuilt index of the gallery for ``backbone`` (engine/prebuilt.py)."""
    from engine.prebuilt import is_bundled, write_prebuilt

    if not is_bundled(out):
        raise SystemExit("--embeddings writes the prebuilt index of the bundled gallery (assets/gallery) only")
    return write_prebuilt(gallery_index(out, backbone, work), backbone,
                          command="python tools/build_gallery.py --embeddings")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "assets" / "gallery")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--saleor-cache", type=Path, default=None,
                    help="folder holding (or receiving) the saleor wheel; default: the engine cache")
    ap.add_argument("--prune", action="store_true",
                    help="only apply the clean-up rules to the gallery already at --out (no rebuild from sources)")
    ap.add_argument("--refresh", action="store_true",
                    help="apply the second pass (tools/gallery_additions.py) to the gallery already at --out, then "
                         "the clean-up rules")
    ap.add_argument("--embeddings", action="store_true",
                    help="then write the prebuilt index for the packaged backbone to assets/prebuilt/")
    ap.add_argument("--max-cosine", type=float, default=MAX_COSINE)
    args = ap.parse_args(argv)
    from engine.backbones import create_backbone
    from engine.config import cache_dir

    settings = Settings()  # this tool is an entry point: the photo packages' folders and the decode budget
    configure_process(settings)

    work = cache_dir() / "build-gallery-index"   # incremental: re-running embeds only changed photos
    backbone = create_backbone("packaged", "cpu")
    if not (args.prune or args.refresh or args.embeddings):
        build(args.out, seed=args.seed, saleor_cache=args.saleor_cache)
    if args.refresh or not args.prune and not args.embeddings:
        for rel, what in sorted(refresh(args.out).items()):
            print(f"{rel}: {what}")
    if args.prune or args.refresh or not args.embeddings:
        before = len(json.loads((args.out / "captions.json").read_text(encoding="utf-8")))
        drops = prune(args.out, backbone, work, args.max_cosine)
        for rel, why in sorted(drops.items()):
            print(f"removed {rel}: {why}")
        print(f"{before} -> {before - len(drops)} photos")
        summarise(args.out)
    if args.embeddings:
        print("prebuilt index:", write_embeddings(args.out, backbone, work).relative_to(ROOT))
    return 0


def summarise(out: Path) -> None:
    """Prints the count per category, the size and the cat and dog files of the gallery at ``out``."""
    labels = json.loads((out / "labels.json").read_text(encoding="utf-8"))
    size = sum((out / rel).stat().st_size for rel in labels)
    print(f"\n{len(labels)} photos, {size / 1e6:.1f} MB in {out}")
    for cat, n in sorted(Counter(rel.split("/", 1)[0] for rel in labels).items()):
        print(f"  {cat:10s} {n}")
    for name in ("cat", "dog", "night", "black and white"):
        print(f"{name}:", ", ".join(sorted(p for p, labs in labels.items() if name in labs)))

if __name__ == "__main__":
    raise SystemExit(main())
