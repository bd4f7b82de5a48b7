"""Open vocabularies and phrasing templates for training composers on OPERATIONS, not on a few phrasings.

Every vocabulary is split BY WORD and every template family BY TEMPLATE into ``train`` / ``val`` / ``test``
(about 70 / 15 / 15, from a stable hash of the word or template core, so the split never changes with the
data): a trainer sees only ``train`` words in ``train`` templates; validation and the held-out-domain suite
(``engine eval generalise``) use only ``val`` / ``test`` ones. Each side is guaranteed at least one member.

* **colours**: matplotlib's XKCD colour table, names kept when their RGB has enough chroma for a recolour to
  show (:data:`MIN_CHROMA`, :data:`MIN_VALUE`), each with its RGB;
* **categories**: the offline sets' category nouns (image-backed: ``engine.data.builders.common``'s
  ``CATEGORY_RULES``) and the ImageNet class names the backbone's classifier knows (language only);
* **templates**: families ``colour`` (slot ``{c}``), ``light`` (one core list per photo edit of
  ``engine.data.tone``), ``category`` (``{a}`` / ``{b}``: the reference's and the target's thing, ``{A}`` /
  ``{B}`` with an article), ``compose-object`` (change the thing, keep the look: ``{look}``), ``compose-look``
  (keep the thing ``{a}``, change the look ``{x}``) and ``undo`` (one core list per edit). A core is the split
  unit; its wrappings (:func:`wrappers`: politeness prefixes) multiply the cores into hundreds of templates on every side.

The built triplets are the ``open_vocab`` offline set (``engine.data.builders.open_vocab``;
``python -m engine.data.builders build --only open_vocab``); :func:`load_open_vocab` reads it.
"""
from __future__ import annotations

import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..config import cache_dir
from ..fileio import atomic_path
from .formats import image_path, load_split
from .heldout import words
from .rules import CATEGORY_RULES, SPLIT_FRACTIONS, assign_split, unit_hash

SPLITS = ("train", "val", "test")
SEED = 0
MIN_CHROMA = 0.30   # max(RGB) - min(RGB) of a colour name kept for recolouring
MIN_VALUE = 0.35    # max(RGB)
WRAPPERS = ("{t}", "please {t}", "now {t}", "could you show it {t}?", "{t}, please")
WRAPPERS_VERB = ("{t}", "please {t}", "now {t}", "could you {t}?", "{t}, please")
WRAPPERS_PLAIN = ("{t}", "please, {t}", "now {t}", "ok, {t}", "{t}, please")
VERBS = frozenset("make turn paint colour color dye change recolour recolor give switch swap repaint replace show try do "
                  "find trade exchange brighten darken drain remove restore put undo fix tone flip turn sharpen invert "
                  "keep".split())

COLOUR_CORES = (
    "make it {c}", "turn it {c}", "paint it {c}", "colour it {c}", "color it {c}", "dye it {c}", "change it to {c}",
    "change the colour to {c}", "change the color to {c}", "recolour it {c}", "recolor it {c}", "the same thing but {c}",
    "the same one but {c}", "the same object but {c}", "the same item in {c}", "a {c} version", "{c} version",
    "in {c}", "now in {c}", "I want it {c}", "I want it in {c}", "show me this in {c}", "show me it in {c}",
    "could it be {c}", "what about {c}", "try {c}", "same but {c}", "but {c}", "{c} instead", "a {c} one",
    "one in {c}", "coloured {c}", "colored {c}", "but make it {c}", "in a {c} shade", "in {c} colour",
    "with a {c} finish", "give it a {c} colour", "switch the colour to {c}", "as a {c} one", "do it in {c}",
    "this but {c}", "{c}, please", "make the object {c}", "swap the colour for {c}", "repaint it {c}",
)
LIGHT_CORES: Dict[str, tuple] = {
    "bw": ("in black and white", "black and white", "monochrome", "as a monochrome photo", "greyscale",
           "in greyscale", "in grayscale", "without any colour", "without color", "colourless", "drain the colour",
           "remove the colour", "as a black-and-white shot", "in shades of grey", "grey tones only"),
    "night": ("at night", "after dark", "by night", "at nighttime", "in the dark", "at midnight", "as a night shot",
              "when it is dark", "late at night", "under the night sky", "in the evening darkness", "at dusk, dark"),
    "sepia": ("sepia", "in sepia", "sepia toned", "like an old photo", "in vintage brown", "with an antique look",
              "with an old-fashioned brown tint", "like a faded old print", "in brown tones", "aged, sepia"),
    "tint": ("{c} tinted", "washed in {c}", "with a {c} hue over everything", "under {c} light", "{c} toned",
             "as if lit by {c} lamps", "through {c} glass", "with a strong {c} cast"),
    "bright": ("brighter", "much brighter", "overexposed", "blown out", "lighter", "with more light",
               "brighten it", "brightened up", "in bright light", "lit up", "too bright", "sunnier"),
    "dark": ("darker", "much darker", "underexposed", "dimmer", "darkened", "with less light", "in dim light",
             "shadowy", "gloomier", "too dark", "murky"),
    "faded": ("faded", "washed out", "desaturated", "with muted colours", "pale", "less colourful",
              "with dull colours", "bleached", "less saturated", "sun-faded"),
    "contrast": ("more contrast", "high contrast", "punchier", "with stronger contrast", "contrasty",
                 "with harsher contrast", "with crisper tones", "with deep blacks and bright whites"),
    "blur": ("blurred", "blurry", "out of focus", "in soft focus", "fuzzy", "smudged", "unsharp", "defocused",
             "with motion blur", "not sharp"),
    "flip": ("mirrored", "flipped", "flipped horizontally", "as a mirror image", "facing the other way",
             "reversed left to right", "turned the other way round", "as seen in a mirror"),
    "upside-down": ("upside down", "flipped vertically", "turned over", "rotated 180 degrees", "on its head",
                    "inverted top to bottom", "the wrong way up"),
    "negative": ("negative", "as a negative", "with inverted colours", "colour inverted", "as a photo negative",
                 "inverted", "like a film negative", "with every colour reversed"),
}
UNDO_CORES: Dict[str, tuple] = {
    "bw": ("in colour again", "back in colour", "restore the colour", "put the colour back", "with its colours back",
           "undo the black and white", "colourised", "in full colour"),
    "night": ("back to daylight", "in daylight", "during the day", "by day", "in the daytime", "as a day shot",
              "in the morning light", "at noon"),
    "sepia": ("without the sepia", "remove the brown tone", "with the original colours", "without the old look",
              "not sepia", "modern colours again"),
    "tint": ("without the cast", "remove the colour cast", "with neutral colours", "natural colours again",
             "without the tint", "white-balanced"),
    "bright": ("less bright", "tone down the exposure", "fix the overexposure", "not so bright", "dimmed down",
               "properly exposed"),
    "dark": ("lighter again", "undo the darkening", "not so dark", "fix the underexposure", "brightened back up",
             "well lit"),
    "faded": ("restore the colours", "more vivid", "full colours again", "more saturated", "vibrant again",
              "unfaded"),
    "contrast": ("softer contrast", "less contrast", "undo the contrast", "gentler tones", "flatter", "less harsh"),
    "blur": ("sharp again", "in focus", "sharpen it", "unblurred", "crisp again", "focused"),
    "flip": ("flip it back", "in the original orientation", "unmirrored", "the right way round", "not mirrored",
             "facing the original way"),
    "upside-down": ("the right way up", "turn it back over", "upright", "not upside down", "rotated back"),
    "negative": ("undo the negative", "with normal colours", "positive again", "invert it back", "not inverted",
                 "as a positive"),
}
CATEGORY_CORES = (
    "{B} instead", "{b} instead", "replace the {a} with {B}", "swap it for {B}", "swap the {a} for {B}",
    "make it {B}", "turn it into {B}", "change it to {B}", "show me {B}", "{B} rather than {A}", "not {A}, {B}",
    "the same but {B}", "I want {B}", "what about {B}?", "could it be {B}?", "{B} in place of the {a}",
    "give me {B}", "show {B} instead", "replace it with {B}", "exchange the {a} for {B}", "{B}, not {A}",
    "the same picture with {B}", "instead of the {a}, {B}", "a picture of {B} instead", "find {B} like this",
    "{B} this time", "switch to {B}", "less {a}, more {b}", "trade the {a} for {B}", "make the {a} {B}",
)
LOOKS = ("look", "style", "light", "colours", "tone", "mood", "treatment", "filter", "edit", "colouring")
COMPOSE_OBJECT_CORES = (
    "{B} in the same {look}", "the same {look} but {B}", "keep the {look}, make it {B}", "{B} with the same {look}",
    "{B}, same {look}", "swap in {B} but keep the {look}", "{B} that looks like this", "{B} with this {look}",
    "{B} done the same way", "the same {look}, only {B}", "change the {a} to {B}, keep the {look}",
    "{B} instead, same {look}", "keep this {look} but show {B}", "{B} edited like this",
)
COMPOSE_LOOK_CORES = (
    "the same {a} but {x}", "this {a}, {x}", "keep the {a}, {x}", "{A}, {x}", "the {a} {x}", "the same {a} {x}",
    "keep the {a} and make it {x}", "still {A} but {x}", "my {a} {x}", "{A} like this one, {x}",
    "the {a} again, {x}", "this very {a} {x}",
)
COMPOSE_WRAPPERS = ("{t}", "please {t}", "now {t}")

FAMILIES = ("colour", "light", "category", "compose-object", "compose-look", "undo")


# -- splits ----------------------------------------------------------------------------------------------------


def _unit(key: str) -> float:
    return unit_hash(SEED, f"open-vocab:{key}")


def split_members(items: Sequence[str], scope: str, train_only: frozenset = frozenset()) -> Dict[str, str]:
    """``{item: split}`` by a stable hash of (scope, item), 70 / 15 / 15; ``train_only`` items are train; when
    there are at least three others, every side gets one (the lowest-hash train items move to an empty side)."""
    out = {it: "train" if it.lower() in train_only else assign_split(f"open-vocab:{scope}:{it}", SEED, SPLIT_FRACTIONS)
           for it in items}
    if len(out) >= 3:
        for side in ("test", "val"):
            if side not in out.values():
                pool = sorted((it for it, s in out.items() if s == "train" and it.lower() not in train_only),
                              key=lambda it: _unit(f"{scope}:{it}"))
                if len(pool) > 1:
                    out[pool[0]] = side
    return out


def of_split(mapping: Dict[str, str], split: str) -> List[str]:
    return sorted(k for k, s in mapping.items() if s == split)


# -- vocabularies ------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def colours() -> Dict[str, tuple]:
    """XKCD colour name -> RGB (0..255) of every name with enough chroma and value to show as a recolour."""
    from matplotlib.colors import XKCD_COLORS, to_rgb

    out = {}
    for key, hexcode in XKCD_COLORS.items():
        name = key.split(":", 1)[1].strip()
        rgb = to_rgb(hexcode)
        if not re.fullmatch(r"[a-z][a-z ]*[a-z]", name):
            continue  # apostrophes, slashes and digits read badly in a sentence
        if max(rgb) - min(rgb) >= MIN_CHROMA and max(rgb) >= MIN_VALUE:
            out[name] = tuple(int(round(255 * v)) for v in rgb)
    return dict(sorted(out.items()))


def colour_hsv(name: str) -> tuple:
    """(hue in degrees, saturation, value) of an XKCD colour name."""
    import numpy as np

    from .recolour import rgb_to_hsv

    h, s, v = rgb_to_hsv(np.asarray(colours()[name], dtype=np.float64) / 255.0)
    return float(h), float(s), float(v)


@lru_cache(maxsize=1)
def colour_splits() -> Dict[str, str]:
    """XKCD name -> split; the offline CIR set's own colour words (``recolour.PALETTE``) are always train."""
    from .recolour import PALETTE

    return split_members(list(colours()), "colour", frozenset(PALETTE))


def offline_categories() -> List[str]:
    """The offline sets' category nouns (the image-backed ones)."""
    return sorted({rule[3] for rule in CATEGORY_RULES})


def imagenet_categories() -> List[str]:
    """The ImageNet class names (torchvision's metadata; the classifier backbones know them), lower-cased."""
    from torchvision.models._meta import _IMAGENET_CATEGORIES

    return sorted({c.lower() for c in _IMAGENET_CATEGORIES})


@lru_cache(maxsize=1)
def category_splits() -> Dict[str, str]:
    """Every category name (offline and ImageNet) -> split: one hash per name, so a name shared by both lists
    falls on one side."""
    names = sorted(set(offline_categories()) | set(imagenet_categories()))
    out = split_members(names, "category")
    offline = split_members(offline_categories(), "category")  # the image-backed names get every side
    out.update(offline)
    return out


# -- templates ---------------------------------------------------------------------------------------------------


def cores(family: str, edit: str = "") -> tuple:
    if family == "colour":
        return COLOUR_CORES
    if family == "light":
        return LIGHT_CORES[edit]
    if family == "undo":
        return UNDO_CORES[edit]
    if family == "category":
        return CATEGORY_CORES
    if family == "compose-object":
        return COMPOSE_OBJECT_CORES
    if family == "compose-look":
        return COMPOSE_LOOK_CORES
    raise ValueError(f"unknown template family {family!r}; choose one of {', '.join(FAMILIES)}")


@lru_cache(maxsize=64)
def core_splits(family: str, edit: str = "") -> Dict[str, str]:
    """Core -> split; a core that is one of the ``--tone-edits`` training phrasings ("at night") is train."""
    from .tone import TONE_TEXTS

    fixed = frozenset(t.lower() for phrasings in TONE_TEXTS.values() for t in phrasings)
    return split_members(list(cores(family, edit)), f"template:{family}:{edit}", fixed)


def wrappers(family: str, core: str) -> tuple:
    """The wrappings of a core: a request ("could you …?") for a core that starts with a verb, "could you show it
    …?" for a light / undo phrase, plain prefixes otherwise."""
    if family in ("compose-object", "compose-look"):
        return COMPOSE_WRAPPERS
    if core.split(" ", 1)[0].lower() in VERBS:
        return WRAPPERS_VERB
    return WRAPPERS if family in ("light", "undo") else WRAPPERS_PLAIN


def templates(family: str, split: str, edit: str = "") -> List[dict]:
    """``[{id, template, core}]`` of one family (and edit) on one side: the side's cores in every wrapper."""
    out = []
    for core in of_split(core_splits(family, edit), split):
        idx = cores(family, edit).index(core)
        for w, wrap in enumerate(wrappers(family, core)):
            out.append({"id": f"{family}:{edit}:{idx}:{w}" if edit else f"{family}:{idx}:{w}",
                        "template": wrap.replace("{t}", core), "core": core})
    if split != "train":  # a wrapped core that reads like a training template or tone phrasing is left out
        from .tone import TONE_TEXTS

        seen = {t["template"].lower() for t in templates(family, "train", edit)}
        seen |= {t.lower() for phrasings in TONE_TEXTS.values() for t in phrasings}
        if split == "test":  # nor like a validation one
            seen |= {t["template"].lower() for t in templates(family, "val", edit)}
        out = [t for t in out if t["template"].lower() not in seen]
    return out


def template_count() -> Dict[str, int]:
    """How many templates each family has over all sides."""
    edits = {"light": tuple(LIGHT_CORES), "undo": tuple(UNDO_CORES)}
    return {f: sum(len(wrappers(f, c)) for e in edits.get(f, ("",)) for c in cores(f, e)) for f in FAMILIES}


def with_article(name: str) -> str:
    if name.endswith("s") and not name.endswith("ss"):
        return name
    return ("an " if name[0] in "aeiou" else "a ") + name


def render(template: str, **slots: str) -> str:
    """A template with its slots filled: ``c`` (colour), ``a`` / ``b`` (things; ``A`` / ``B`` with an
    article), ``look``, ``x`` (a light phrase)."""
    values = dict(slots)
    for low, up in (("a", "A"), ("b", "B")):
        if low in values:
            values[up] = with_article(values[low])
    out = template
    for key, value in values.items():
        out = out.replace("{" + key + "}", value)
    if "{" in out:
        raise ValueError(f"template {template!r} has an unfilled slot")
    return out[0].upper() + out[1:] if out.startswith("i ") else out


def texts_of_split(split: str) -> frozenset:
    """Every fixed word of the ``split`` side's templates (slots removed), lower-case: the trainers' template
    vocabulary (``engine.data.vocabulary.training_vocabulary`` adds the train side's)."""
    out = set()
    edits = {"light": tuple(LIGHT_CORES), "undo": tuple(UNDO_CORES)}
    for fam in FAMILIES:
        for edit in edits.get(fam, ("",)):
            for t in templates(fam, split, edit):
                out |= words(re.sub(r"\{[A-Za-z]+\}", " ", t["template"]))
    return frozenset(out)


def training_words() -> frozenset:
    """Words a trainer sees in the open-vocabulary set's train side: its template words, its colour names
    and its category names."""
    out = set(texts_of_split("train"))
    for name in of_split(colour_splits(), "train"):
        out |= words(name)
    for name in of_split(category_splits(), "train"):
        if name in offline_categories():
            out |= words(name)
    return frozenset(out)


# -- loading -----------------------------------------------------------------------------------------------------


def load_open_vocab(split: str, kinds: Optional[Sequence[str]] = None, limit: int = 0):
    """Triplets (``engine.data.cir_triplets.Triplet``) of one split of the built ``open_vocab`` set (never
    builds), optionally of some kinds only and at most ``limit`` (a fixed, seeded sample)."""
    from .cir_triplets import Triplet

    out = []
    for rec in load_split("open_vocab", split):
        if kinds and rec["kind"] not in kinds:
            continue
        ref = image_path("open_vocab", rec["reference"])
        tgts = [image_path("open_vocab", t) for t in rec["targets"]]
        meta = {**{k: v for k, v in rec.items() if k not in ("reference", "text", "targets")}, "gallery": "open"}
        out.append(Triplet(rec["id"], str(ref), rec["text"], [str(t) for t in tgts], meta))
    if limit and len(out) > limit:
        out = sorted(random.Random(f"open-vocab:{split}").sample(out, limit), key=lambda t: t.query_id)
    return out


def open_vocab_gallery(split: str) -> List[tuple]:
    """(image path, "open") of every image of one split of the built set."""
    return [(str(image_path("open_vocab", g["image"])), "open") for g in load_split("open_vocab", f"{split}_gallery")]


def recoloured_file(src, name: str, root=None) -> Optional[Path]:
    """The object of image ``src`` recoloured to the XKCD colour ``name`` (hue, saturation and value), written
    once under ``<cache>/tone/xkcd/``; None when the object cannot be recoloured (``engine.data.recolour``)."""
    from PIL import Image

    from ..images import sha256_file
    from . import recolour

    folder = Path(root) if root is not None else cache_dir() / "tone"
    out = folder / "xkcd" / f"{sha256_file(src)[:20]}-{name.replace(' ', '_')}.png"
    if out.is_file():
        return out
    img = Image.open(src)
    img.load()
    analysis, _ = recolour.analyse(img)
    if analysis is None:
        return None
    h, s, v = colour_hsv(name)
    with atomic_path(out) as tmp:
        recolour.recolour_to(img, analysis, h, (s, v)).save(tmp, format="PNG")
    return out
