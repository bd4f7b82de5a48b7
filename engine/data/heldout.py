"""The held-out domain: photo sources, vocabulary and phrasings that no trainer sees.

The offline sets (``docs/data.md``) split every source by group, so their validation and test splits share
sources, phrasings and category words with training. The held-out-domain suite (``engine eval generalise``)
needs data from elsewhere. This module draws the line once, for every trainer and the suite:

* **sources**: the real photographs of ``gcompris-qt-data`` and the scikit-image / scikit-learn samples are
  held out. The composer trainers (RTIC, Context-I2W) drop every training and validation row that touches
  one of them (:func:`keep_row`); the suite is built only from them.
* **vocabulary**: a category-change query of the suite names a thing whose words occur in no text of any
  offline set outside the held-out sources (``engine.data.vocabulary.training_vocabulary``).
* **phrasings**: the suite's templates (``engine.eval.generalise``) are checked against every training
  text, so none is a phrasing a trainer used.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Set

from .formats import datasets_root, load_split

HELD_OUT_SOURCES = ("gcompris-qt-data", "scikit-image", "scikit-learn")


def is_held_out(source: str) -> bool:
    return str(source) in HELD_OUT_SOURCES


def words(text: str) -> Set[str]:
    """Lower-case alphabetic words of ``text``."""
    return set(re.findall(r"[a-z]+", str(text).lower()))


def _root() -> str:
    return str(datasets_root())


def held_out_cir_images() -> frozenset:
    """Relative paths (``image_path("cir", ...)`` form) of every image of the offline CIR set that comes from
    a held-out source, recoloured copies included (they inherit their original's source)."""
    return _held_out_cir_images(_root())


@lru_cache(maxsize=4)
def _held_out_cir_images(root: str) -> frozenset:
    out = set()
    for split in ("train", "val", "test"):
        for g in load_split("cir", f"{split}_gallery"):
            if is_held_out(g.get("source", "")):
                out.add(g["image"])
    return frozenset(out)


def keep_row(paths: Iterable[str], held_out: frozenset) -> bool:
    """Whether a training row (its reference and targets as CIR-relative paths) avoids the held-out sources."""
    return not any(str(p) in held_out for p in paths)
