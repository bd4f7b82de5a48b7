"""Twemoji images and metadata from the npm package ``emoji-datasource-twitter``.

The package ships 64 px PNGs (``img/twitter/64``) and ``emoji.json`` with names, categories,
subcategories and skin-tone variations. Images: CC-BY 4.0 (Twitter / Twemoji contributors);
data: MIT (Cal Henderson, emoji-data).

This module reads the package (installing it with ``npm install --prefix <cache>`` when needed, never
into the repository) and derives *attribute variants* from the Unicode sequences:

* skin tone: the listed ``skin_variations`` (single tone, or the same tone for every person);
* gender: ``<x> ZWJ FEMALE/MALE SIGN`` next to ``<x>``, ``WOMAN/MAN ZWJ <y>`` next to
  ``PERSON ZWJ <y>``, and person / woman / man, child / girl / boy, older person / old woman / old man;
* hair: ``<x> ZWJ RED/CURLY/WHITE HAIR or BALD`` next to ``<x>``;
* direction: ``<x> ZWJ RIGHT ARROW`` ("facing right") next to ``<x>``.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..config import cache_dir
from ..errors import EngineError, InputError
from .locations import configured

PACKAGE = "emoji-datasource-twitter"
VERSION = "16.0.0"
ENV_DIR = "CIS_TWEMOJI_DIR"
IMAGE_SUBDIR = "img/twitter/64"
LICENCE_IMAGES = "CC-BY-4.0 (Twemoji graphics, Twitter Inc. and contributors)"
LICENCE_DATA = "MIT (emoji-data, Cal Henderson)"

SKIN_TONES = {
    "1F3FB": "light",
    "1F3FC": "medium-light",
    "1F3FD": "medium",
    "1F3FE": "medium-dark",
    "1F3FF": "dark",
}
GENDER_SIGNS = {"2640": "woman", "2642": "man"}
GENDER_LEADS = {"1F469": "woman", "1F468": "man"}
NEUTRAL_PERSON = "1F9D1"
STANDALONE_GENDER = {  # neutral -> {value: code}
    "1F9D1": {"woman": "1F469", "man": "1F468"},
    "1F9D2": {"girl": "1F467", "boy": "1F466"},
    "1F9D3": {"old woman": "1F475", "old man": "1F474"},
}
HAIR = {"1F9B0": "red hair", "1F9B1": "curly hair", "1F9B3": "white hair", "1F9B2": "bald"}
DIRECTION = {"27A1": "facing right"}
SKIP_CATEGORIES = {"Component"}


def attribute_text(kind: str, value: str) -> str:
    """Modification text for an attribute change, e.g. ``("skin_tone", "dark")`` -> "with dark skin tone"."""
    if kind == "skin_tone":
        return f"with {value} skin tone"
    if kind == "gender":
        article = "an" if value[0] in "aeiou" else "a"
        return f"as {article} {value}"
    if kind == "hair":
        return "bald, with no hair" if value == "bald" else f"with {value}"
    if kind == "direction":
        return value
    raise ValueError(f"unknown attribute kind {kind!r}")


@dataclass(frozen=True)
class Emoji:
    """One Twemoji image: a base emoji or one of its skin-tone variations."""

    key: str            # unified code sequence of the image, e.g. "1F469-200D-1F9B0-1F3FF"
    node: str           # unified code of the base entry (without skin tone)
    name: str           # e.g. "woman: red hair, dark skin tone" (lower case)
    short_name: str
    category: str
    subcategory: str
    image: str          # file name inside img/twitter/64
    skin_tone: Optional[str] = None   # None (default yellow) or a SKIN_TONES value
    gender: Optional[str] = None      # woman / man / girl / boy / ... when the sequence says so
    sort_order: int = 0


@dataclass(frozen=True)
class Edge:
    """A composed-retrieval query with a known answer: ``src`` + ``text`` -> ``dst``."""

    src: str
    dst: str
    kind: str
    value: str
    text: str
    derived_tone: Optional[str] = field(default=None, compare=False)


# npm installs the package into the project's own git-ignored .cache/npm (no global install); a copy that an
# earlier version installed into the user cache is still found
PROJECT_NPM = Path(__file__).resolve().parents[2] / ".cache" / "npm"


def default_package_dir() -> Path:
    for prefix in (PROJECT_NPM, cache_dir() / "packages" / "npm"):
        path = prefix / "node_modules" / PACKAGE
        if (path / "emoji.json").is_file():
            return path
    return PROJECT_NPM / "node_modules" / PACKAGE


def package_dir(install: bool = True, folder: Optional[str] = None) -> Path:
    """Folder of the installed package: ``folder``, else the one the entry point configured
    (``CIS_TWEMOJI_DIR``, :mod:`engine.data.locations`), else the cache; installs it with npm if allowed."""
    given = str(configured().twemoji_dir if folder is None else folder).strip()
    if given:
        path = Path(given)
        if not (path / "emoji.json").is_file():
            raise InputError(f"{ENV_DIR} points to a folder without emoji.json ({path.name})")
        return path
    path = default_package_dir()
    if (path / "emoji.json").is_file():
        return path
    if not install:
        raise EngineError(f"npm package {PACKAGE} is not installed in the cache")
    npm = shutil.which("npm")
    if npm is None:
        raise EngineError(
            f"the Twemoji data needs the npm package {PACKAGE}@{VERSION}; install Node.js/npm "
            f"(apt-get install npm) or set {ENV_DIR} to an unpacked copy of the package"
        )
    prefix = PROJECT_NPM
    prefix.mkdir(parents=True, exist_ok=True)
    cmd = [npm, "install", "--prefix", str(prefix), "--no-save", "--no-audit", "--no-fund",
           f"{PACKAGE}@{VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not (path / "emoji.json").is_file():
        raise EngineError(f"npm install {PACKAGE}@{VERSION} failed: {proc.stderr.strip()[-500:]}")
    return path


def installed_version(pkg_dir: Path) -> str:
    try:
        return json.loads((pkg_dir / "package.json").read_text(encoding="utf-8")).get("version", "unknown")
    except (OSError, json.JSONDecodeError):
        return "unknown"


def _tone_of(key: str) -> Optional[str]:
    """Tone name of a skin-variation key: '1F3FF' or '1F3FF-1F3FF' -> 'dark'; mixed tones -> None."""
    parts = key.split("-")
    if parts and all(p == parts[0] for p in parts) and parts[0] in SKIN_TONES:
        return SKIN_TONES[parts[0]]
    return None


def _components(unified: str) -> list[str]:
    return unified.upper().split("-200D-")


def _strip_fe0f(comp: str) -> str:
    return comp.replace("-FE0F", "")


def _gender_of(unified: str) -> Optional[str]:
    comps = _components(unified)
    for c in comps:
        if _strip_fe0f(c) in GENDER_SIGNS:
            return GENDER_SIGNS[_strip_fe0f(c)]
    if comps[0] in GENDER_LEADS:
        return GENDER_LEADS[comps[0]]
    for neutral, values in STANDALONE_GENDER.items():
        for value, code in values.items():
            if unified.upper() == code:
                return value
    return None


def load_emoji(pkg_dir: Path) -> list[Emoji]:
    """Every emoji image of the package that has a Twemoji PNG (base entries and single-tone variations)."""
    path = Path(pkg_dir) / "emoji.json"
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path.name} of {PACKAGE} could not be read: {exc}") from None
    img_dir = Path(pkg_dir) / IMAGE_SUBDIR
    out: list[Emoji] = []
    for e in entries:
        if e.get("category") in SKIP_CATEGORIES or not e.get("has_img_twitter"):
            continue
        node = e["unified"].upper()
        name = (e.get("name") or e.get("short_name") or node).lower()
        if not (img_dir / e["image"]).is_file():
            continue
        gender = _gender_of(node)
        common = dict(node=node, short_name=e.get("short_name", ""), category=e.get("category", ""),
                      subcategory=e.get("subcategory", ""), sort_order=int(e.get("sort_order", 0)),
                      gender=gender)
        out.append(Emoji(key=node, name=name, image=e["image"], **common))
        for tone_key, var in sorted((e.get("skin_variations") or {}).items()):
            tone = _tone_of(tone_key)
            if tone is None or not var.get("has_img_twitter") or not (img_dir / var["image"]).is_file():
                continue
            out.append(Emoji(key=var["unified"].upper(), name=f"{name}, {tone} skin tone", image=var["image"],
                             skin_tone=tone, **common))
    return out


def attribute_relations(emojis: list[Emoji]) -> list[tuple[str, str, str, str]]:
    """Relations between base entries: ``(base_node, kind, value, variant_node)``."""
    nodes = {e.node for e in emojis}
    rels: set[tuple[str, str, str, str]] = set()
    for node in sorted(nodes):
        comps = _components(node)
        # <x> ZWJ sign / hair / arrow  ->  <x>
        for i, comp in enumerate(comps):
            bare = _strip_fe0f(comp)
            for table, kind in ((GENDER_SIGNS, "gender"), (HAIR, "hair"), (DIRECTION, "direction")):
                if bare in table and len(comps) > 1:
                    base = "-200D-".join(comps[:i] + comps[i + 1:])
                    if base in nodes:
                        rels.add((base, kind, table[bare], node))
        # WOMAN/MAN ZWJ <y>  ->  PERSON ZWJ <y>
        if comps[0] in GENDER_LEADS and len(comps) > 1:
            base = "-200D-".join([NEUTRAL_PERSON] + comps[1:])
            if base in nodes:
                rels.add((base, "gender", GENDER_LEADS[comps[0]], node))
    for neutral, values in STANDALONE_GENDER.items():
        for value, code in values.items():
            if neutral in nodes and code in nodes:
                rels.add((neutral, "gender", value, code))
    return sorted(rels)


def variant_edges(emojis: list[Emoji], rng, tone_pairs_per_node: int = 2, tones_per_relation: int = 2) -> list[Edge]:
    """Composed queries with known answers among emoji images.

    * skin tone: default -> each tone, plus ``tone_pairs_per_node`` random tone -> other tone pairs;
    * gender / hair / direction: base -> variant and variant -> sibling variant (same attribute kind),
      on the default-colour images and on ``tones_per_relation`` random tones shared by both ends.
    ``rng`` is a ``random.Random``; iteration order is sorted, so a seeded rng gives the same list.
    """
    by_node: dict[str, dict[Optional[str], str]] = {}
    for e in emojis:
        by_node.setdefault(e.node, {})[e.skin_tone] = e.key
    edges: list[Edge] = []
    for node in sorted(by_node):
        tones = by_node[node]
        named = sorted(t for t in tones if t is not None)
        if None in tones:
            for t in named:
                edges.append(Edge(tones[None], tones[t], "skin_tone", t, attribute_text("skin_tone", t)))
        pairs = [(a, b) for a in named for b in named if a != b]
        for a, b in rng.sample(pairs, min(tone_pairs_per_node, len(pairs))):
            edges.append(Edge(tones[a], tones[b], "skin_tone", b, attribute_text("skin_tone", b)))
    rels = attribute_relations(emojis)
    family: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for base, kind, value, variant in rels:
        family.setdefault((base, kind), []).append((value, variant))
    for (base, kind), variants in sorted(family.items()):
        node_pairs = [(base, value, variant) for value, variant in variants]
        node_pairs += [(va, vb_value, vb) for _, va in variants for vb_value, vb in variants if va != vb]
        for src, value, dst in node_pairs:
            text = attribute_text(kind, value)
            s_t, d_t = by_node.get(src, {}), by_node.get(dst, {})
            if None in s_t and None in d_t:
                edges.append(Edge(s_t[None], d_t[None], kind, value, text))
            shared = sorted(t for t in set(s_t) & set(d_t) if t is not None)
            for t in rng.sample(shared, min(tones_per_relation, len(shared))):
                edges.append(Edge(s_t[t], d_t[t], kind, value, text, derived_tone=t))
    return edges


def variant_groups(emojis: list[Emoji]) -> dict[str, str]:
    """Image key -> group id: connected components of base entries linked by any attribute relation.

    Skin-tone variations belong to their base entry's group, so a split by group keeps every variant
    of one emoji (and of its gender / hair siblings) together; see :func:`is_loose_relation` for the
    links that are left out.
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for e in emojis:
        find(e.node)
    for base, kind, _, variant in attribute_relations(emojis):
        if not is_loose_relation(base, kind, variant):
            union(base, variant)
    return {e.key: f"twemoji:{find(e.node)}" for e in emojis}


def is_loose_relation(base: str, kind: str, variant: str) -> bool:
    """Gender links that do not merge groups: person / man / woman (child, older person) and their hair
    variants would otherwise form one family holding every hair emoji, so all hair queries would fall in
    a single split. Queries along a loose link are kept only when both ends land in the same split."""
    if kind != "gender":
        return False
    if base in STANDALONE_GENDER:
        return True
    return any(_strip_fe0f(c) in HAIR for c in _components(base) + _components(variant))


def caption(e: Emoji) -> str:
    """Plain-English caption of an emoji image from its Unicode name."""
    return f"{e.name.replace(': ', ', ')} emoji"
