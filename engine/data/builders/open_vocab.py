"""Builder of the ``open_vocab`` set: operations over open vocabularies (``engine.data.open_vocab``) on the
real photos of the non-held-out sources, every edited picture materialised at :data:`SIDE` pixels.

A photo's split is its category's (``open_vocab.category_splits``), or a hash of its group when it has none,
so a category word's pictures and its sentences fall on the same side. Per photo (a per-photo seeded choice):

* ``colour``: up to :data:`COLOURS_PER_PHOTO` recolours of the object to XKCD names of the side, far enough in
  hue from the object's own (``engine.data.recolour``; hue, saturation and value move to the name's);
* ``light``: :data:`EDITS_PER_PHOTO` whole-picture edits of :data:`TRAIN_EDITS` (``engine.data.tone``);
* ``undo``: :data:`UNDO_PER_PHOTO` of those edits back to the original;
* ``category``: the photo to every original of another category of the side (one query);
* ``compose-look``: keep the thing, change the look ("the same bird but at night"): to its own edit;
* ``compose-object``: change the thing, keep the look: the photo's edit to the same edit of up to
  :data:`COMPOSE_TARGETS` photos of another category of the side.
"""
from __future__ import annotations

import hashlib
import json
import random
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .. import open_vocab as ov
from .. import recolour, tone
from ..formats import IMAGES_DIRNAME, write_jsonl
from ..heldout import is_held_out
from ..tone import LIGHT_EDITS, photo_edit
from .common import SPLITS, Inputs, _progress, assign_split

SIDE = 224
COLOURS_PER_PHOTO = 3
EDITS_PER_PHOTO = 4
UNDO_PER_PHOTO = 2
COMPOSE_TARGETS = 3
MAX_CATEGORY_TARGETS = 12
TRAIN_EDITS = ("bw", "night", "sepia", *LIGHT_EDITS)  # the tints stay for evaluation (engine.data.tone)


def photo_split(p) -> str:
    if p.category:
        return ov.category_splits()[p.category]
    return assign_split(f"open-vocab:photo:{p.group}", 0)


class _Writer:
    """Writes the pictures of one build into ``images/`` (relative paths), each once."""

    def __init__(self, root: Path):
        self.root = root
        self.images: dict[str, list[str]] = {s: [] for s in SPLITS}  # split -> image rels
        self.written: set[str] = set()

    def save(self, img: Image.Image, rel: str, split: str) -> str:
        if rel not in self.written:
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            img.save(path, format="PNG")
            self.written.add(rel)
            self.images[split].append(rel)
        return rel

    def original(self, p, split: str) -> tuple[str, Image.Image]:
        img = Image.open(p.path)
        img.load()
        img = img.convert("RGBA" if img.mode in ("RGBA", "LA", "P") else "RGB")
        img.thumbnail((SIDE, SIDE))
        return self.save(img, f"photos/{p.key}.png", split), img

    def edit(self, p, img: Image.Image, kind: str, split: str) -> str:
        rel = f"edits/{kind}/{p.key}.png"
        if rel in self.written:
            return rel
        rgb = img.convert("RGBA")
        white = Image.new("RGBA", rgb.size, (255, 255, 255, 255))
        rgb = Image.alpha_composite(white, rgb).convert("RGB")  # as engine.images.load_image shows it
        x = torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0).permute(2, 0, 1)
        out = (photo_edit(x, kind).permute(1, 2, 0).numpy() * 255.0).round().clip(0, 255).astype(np.uint8)
        return self.save(Image.fromarray(out), rel, split)


def _pick(rng: random.Random, split: str, family: str, edit: str = "") -> dict:
    return rng.choice(ov.templates(family, split, edit))


def _row(kind: str, p, qid: str, ref: str, text: str, targets: list, tpl: dict, **meta) -> dict:
    """One query record; ``photo`` names the source photo ``p`` of its reference (the photo itself or one of
    its edited versions), so a trainer can keep a photo's versions together (RTIC's ``--group-by-photo``)."""
    return {"id": f"{kind}:{qid}", "kind": kind, "reference": ref, "text": text, "targets": targets,
            "template": tpl["id"], "photo": p.key, **{k: v for k, v in meta.items() if v is not None}}



def _colour_rows(w: _Writer, p, img, ref: str, split: str, rng: random.Random) -> list[dict]:
    analysis, _ = recolour.analyse(img)
    if analysis is None:
        return []
    names = [n for n in ov.of_split(ov.colour_splits(), split)
             if float(recolour.hue_distance(ov.colour_hsv(n)[0], analysis.hue)) >= recolour.MIN_TARGET_DIST]
    rows = []
    for name in sorted(rng.sample(names, min(COLOURS_PER_PHOTO, len(names)))):
        h, s, v = ov.colour_hsv(name)
        rel = w.save(recolour.recolour_to(img, analysis, h, (s, v)), f"colour/{p.key}__{name.replace(' ', '_')}.png",
                     split)
        tpl = _pick(rng, split, "colour")
        rows.append(_row("colour", p, f"{p.key}:{name}", ref, ov.render(tpl["template"], c=name), [rel], tpl,
                         attribute=name, rgb=list(ov.colours()[name]), source_hue=round(analysis.hue, 1),
                         reference_caption=p.caption))
    return rows


def _light_rows(w: _Writer, p, img, ref: str, split: str, rng: random.Random) -> tuple[list[dict], dict]:
    """Light edits, one undo and (for a photo with a category) one keep-the-thing edit; returns the rows and
    the photo's edits {kind: rel}."""
    edits = {e: w.edit(p, img, e, split) for e in sorted(rng.sample(TRAIN_EDITS, EDITS_PER_PHOTO))}
    rows = []
    for e, rel in edits.items():
        tpl = _pick(rng, split, "light", e)
        rows.append(_row("light", p, f"{p.key}:{e}", ref, tpl["template"], [rel], tpl, edit=e,
                         phrase=tpl["core"], reference_caption=p.caption))
    for e in sorted(rng.sample(sorted(edits), UNDO_PER_PHOTO)):
        tpl = _pick(rng, split, "undo", e)
        rows.append(_row("undo", p, f"{p.key}:{e}", edits[e], tpl["template"], [ref], tpl, edit=e))
    if p.category:
        e = rng.choice(sorted(edits))
        x = rng.choice(ov.of_split(ov.core_splits("light", e), split))
        tpl = _pick(rng, split, "compose-look")
        rows.append(_row("compose-look", p, f"{p.key}:{e}", ref, ov.render(tpl["template"], a=p.category, x=x),
                         [edits[e]], tpl, edit=e, attribute=p.category, light=x))
    return rows, edits


def _category_rows(w: _Writer, split: str, photos: list, state: dict, seed: int) -> list[dict]:
    """Category changes and change-the-thing-keep-the-look rows of one split."""
    by_cat: dict[str, list] = defaultdict(list)
    for p in photos:
        if p.category:
            by_cat[p.category].append(p)
    rows = []
    for p in photos:
        others = sorted(c for c in by_cat if c != p.category)
        if not p.category or not others:
            continue
        rng = random.Random(f"{seed}:open-vocab:category:{p.key}")
        b = rng.choice(others)
        members = sorted(by_cat[b], key=lambda q: q.key)
        targets = [state[q.key]["ref"] for q in rng.sample(members, min(MAX_CATEGORY_TARGETS, len(members)))]
        tpl = _pick(rng, split, "category")
        rows.append(_row("category", p, f"{p.key}>{b}", state[p.key]["ref"],
                         ov.render(tpl["template"], a=p.category, b=b), sorted(targets), tpl,
                         attribute=b, reference_category=p.category))
        e = rng.choice(sorted(state[p.key]["edits"]))
        chosen = rng.sample(members, min(COMPOSE_TARGETS, len(members)))
        targets = sorted(w.edit(q, state[q.key]["img"], e, split) for q in chosen)
        tpl = _pick(rng, split, "compose-object")
        text = ov.render(tpl["template"], a=p.category, b=b, look=rng.choice(ov.LOOKS))
        rows.append(_row("compose-object", p, f"{p.key}>{b}:{e}", state[p.key]["edits"][e], text, targets, tpl,
                         edit=e, attribute=b, reference_category=p.category))
    return rows


def build_open_vocab(out: Path, inp: Inputs, seed: int) -> dict:
    """Open-vocabulary operation triplets and per-split galleries; returns the manifest's counts."""
    w = _Writer(out / IMAGES_DIRNAME)
    photos = sorted((p for p in inp.photos if not is_held_out(p.source)), key=lambda p: p.key)
    queries: dict[str, list[dict]] = {s: [] for s in SPLITS}
    by_split: dict[str, list] = {s: [] for s in SPLITS}
    state: dict[str, dict] = {}
    for p in _progress(photos, "open_vocab: photos", show=inp.progress):
        split = photo_split(p)
        rng = random.Random(f"{seed}:open-vocab:{p.key}")
        ref, img = w.original(p, split)
        queries[split] += _colour_rows(w, p, img, ref, split, rng)
        rows, edits = _light_rows(w, p, img, ref, split, rng)
        queries[split] += rows
        state[p.key] = {"ref": ref, "img": img, "edits": edits}
        by_split[split].append(p)
    for split in SPLITS:
        queries[split] += _category_rows(w, split, by_split[split], state, seed)
    counts = {}
    for split in SPLITS:
        queries[split].sort(key=lambda q: q["id"])
        write_jsonl(out / f"{split}.jsonl", queries[split])
        write_jsonl(out / f"{split}_gallery.jsonl", [{"image": r} for r in sorted(w.images[split])])
        counts[split] = {"queries": len(queries[split]), "gallery": len(w.images[split]), "photos": len(by_split[split]),
                         "by_kind": dict(sorted(Counter(q["kind"] for q in queries[split]).items()))}
    return {"counts": counts, "vocabulary": _vocabulary_counts(), "side": SIDE,
            "sources": sorted({p.source for p in photos})}


def open_vocab_recipe() -> str:
    """Hash of everything the set's rows depend on beyond the shared recipe: this builder, the vocabularies and
    templates (``engine.data.open_vocab``), the edits (``engine.data.tone``) and the XKCD table."""
    h = hashlib.sha256(json.dumps(ov.colours(), sort_keys=True).encode())
    for module in (ov, tone, recolour):
        h.update(Path(module.__file__).read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:12]


def _vocabulary_counts() -> dict:
    cats = ov.category_splits()
    offline = set(ov.offline_categories())
    out = {"colours": dict(Counter(ov.colour_splits().values())),
           "offline_categories": {s: ov.of_split({c: cats[c] for c in offline}, s) for s in SPLITS},
           "imagenet_categories": dict(Counter(cats[c] for c in ov.imagenet_categories())),
           "templates": ov.template_count()}
    return out
