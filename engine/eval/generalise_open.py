"""The held-out-domain suite's open-vocabulary kinds (``engine eval generalise``), on the held-out photos and in
the words and templates of the suite's side only (``engine.data.open_vocab``: ``val`` words and templates on
the ``val`` side, ``test`` ones on ``test``; no trainer sees either):

* ``compositional``: keep the thing and change the look ("the same {a} but after dark" -> the photo's edit),
  or change the thing and keep the look (the photo's edit + "a {b} in the same style" -> the same edit of
  every photo of that thing on the side);
* ``colour-new``: recolour the object to an XKCD colour name of the side (photos whose object can be
  recoloured, ``engine.data.recolour``);
* ``light``: brightness, saturation, contrast, blur, flips, negative (``engine.data.tone.LIGHT_EDITS``);
* ``undo``: an edited version + "back to daylight" -> the photo itself;
* ``rephrased``: the old edits (black and white, night, sepia, colour casts) in the side's new phrasings.

Every query of these kinds ranks against one gallery, ``open``: every photo of the side with each version
these queries made of it, so a photo's other versions are the hardest negatives.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

from ..data import open_vocab as ov
from ..data.vocabulary import training_texts
from ..data.open_vocab import render, templates
from ..data.tone import LIGHT_EDITS, edited_file

OPEN_KINDS = ("compositional", "colour-new", "light", "undo", "rephrased")
OLD_EDITS = ("bw", "night", "sepia", "tint-red", "tint-green", "tint-blue")
GALLERY = "open"


def _family_edit(edit: str) -> str:
    return "tint" if edit.startswith("tint-") else edit


def _phrase(templates: List[dict], i: int, **slots) -> str:
    """The ``i``-th template (cyclically) filled in; one that reads like a training text is passed over."""
    seen = training_texts()
    for k in range(len(templates)):
        text = render(templates[(i + k) % len(templates)]["template"], **slots)
        if text.strip().lower() not in seen:
            return text
    raise ValueError(f"every template of the side reads like a training text (e.g. {text!r})")


def _edit_text(family: str, side: str, edit: str, i: int) -> str:
    fam_edit = _family_edit(edit)
    slots = {"c": edit.split("-", 1)[1]} if fam_edit == "tint" else {}
    return _phrase(templates(family, side, fam_edit), i, **slots)


def open_queries(side: str, photos: List[dict], add: Callable[[str, Path], str], edit_root=None,
                 seed: int = 0) -> List[dict]:
    """The open kinds' queries of one side; ``add(gallery, path)`` puts a picture into a gallery and returns
    its item id; edited pictures are written once under the cache (``edit_root``: elsewhere)."""
    rng = np.random.default_rng([seed, 7, 0 if side == "val" else 1])
    edited: Dict[tuple, str] = {}

    def version(p: dict, edit: str) -> str:
        key = (str(p["image"]), edit)
        if not edit:
            return add(GALLERY, p["image"])
        if key not in edited:
            edited[key] = add(GALLERY, edited_file(p["image"], edit, edit_root))
        return edited[key]

    queries: List[dict] = []

    def query(kind: str, i: int, edit: str, text: str, ref: str, targets: List[str]) -> None:
        queries.append({"id": f"{side}:{kind}:{i}:{edit}", "kind": kind, "edit": edit, "text": text,
                        "reference": ref, "gallery": GALLERY, "targets": targets})

    undo_edits = OLD_EDITS + LIGHT_EDITS
    for i, p in enumerate(photos):
        ref = add(GALLERY, p["image"])
        light = LIGHT_EDITS[i % len(LIGHT_EDITS)]
        query("light", i, light, _edit_text("light", side, light, i), ref, [version(p, light)])
        old = OLD_EDITS[i % len(OLD_EDITS)]
        query("rephrased", i, old, _edit_text("light", side, old, i), ref, [version(p, old)])
        back = undo_edits[(i * 5 + 3) % len(undo_edits)]
        query("undo", i, back, _edit_text("undo", side, back, i), version(p, back), [ref])
    queries += _colour_queries(side, photos, add, rng, edit_root)
    queries += _compositional_queries(side, photos, version, rng)
    return queries


def _colour_queries(side: str, photos: List[dict], add, rng, edit_root) -> List[dict]:
    from PIL import Image

    from ..data import recolour

    names = ov.of_split(ov.colour_splits(), side)
    tpls = ov.templates("colour", side)
    out = []
    for i, p in enumerate(photos):
        with Image.open(p["image"]) as img:
            img.load()
            analysis, _ = recolour.analyse(img)
        if analysis is None:
            continue
        far = [n for n in names if float(recolour.hue_distance(ov.colour_hsv(n)[0], analysis.hue)) >= recolour.MIN_TARGET_DIST]
        if not far:
            continue
        name = str(rng.choice(far))
        target = ov.recoloured_file(p["image"], name, edit_root)
        if target is None:
            continue
        out.append({"id": f"{side}:colour-new:{i}:{name}", "kind": "colour-new", "edit": f"xkcd:{name}",
                    "text": _phrase(tpls, i, c=name), "reference": add(GALLERY, p["image"]), "gallery": GALLERY,
                    "targets": [add(GALLERY, target)]})
    return out


def _compositional_queries(side: str, photos: List[dict], version, rng) -> List[dict]:
    """Keep the named thing and change its look; change the thing and keep the look."""
    edits = ("bw", "night", "sepia", *LIGHT_EDITS)
    by_name: Dict[str, List[dict]] = {}
    for p in photos:
        if p["name"]:
            by_name.setdefault(p["name"], []).append(p)
    names = sorted(by_name)
    look_tpls, object_tpls = ov.templates("compose-look", side), ov.templates("compose-object", side)
    out = []
    for i, p in enumerate(q for q in photos if q["name"]):
        e = edits[i % len(edits)]
        xs = [t["core"] for t in ov.templates("light", side, e)]
        x = xs[i % len(xs)]
        out.append({"id": f"{side}:compositional:look:{i}", "kind": "compositional", "edit": e,
                    "text": _phrase(look_tpls, i, a=p["name"], x=x), "reference": version(p, ""),
                    "gallery": GALLERY, "targets": [version(p, e)]})
        others = [n for n in names if n != p["name"]]
        if not others:
            continue
        b = str(rng.choice(others))
        look = ov.LOOKS[i % len(ov.LOOKS)]
        out.append({"id": f"{side}:compositional:object:{i}", "kind": "compositional", "edit": e,
                    "text": _phrase(object_tpls, i, a=p["name"], b=b, look=look), "reference": version(p, e),
                    "gallery": GALLERY, "targets": [version(q, e) for q in by_name[b]]})
    return out
