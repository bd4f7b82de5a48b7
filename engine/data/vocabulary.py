"""What trainers read: every word (:func:`training_vocabulary`) and every modification text
(:func:`training_texts`) of the offline sets outside the held-out sources (``engine.data.heldout``), so the
held-out suites (``engine.eval.generalise``, ``engine.eval.generalise_open``) can use only what no trainer saw.

Above the sets it reads (the offline CIR and caption sets, the tone phrasings, the open-vocabulary set's
train side); nothing in ``engine.data`` imports it.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Set

from . import open_vocab
from .formats import load_split
from .heldout import _root, is_held_out, words
from .tone import TONE_TEXTS


def training_vocabulary() -> frozenset:
    """Every word of every text a trainer can see: the offline CIR queries of every split, the captions of
    every non-held-out source (every split), the tone-edit phrasings and the open-vocabulary set's train side
    (its template words, colour names and category names: ``engine.data.open_vocab.training_words``)."""
    return _training_vocabulary(_root())


@lru_cache(maxsize=4)
def _training_vocabulary(root: str) -> frozenset:
    vocab: Set[str] = set()
    for split in ("train", "val", "test"):
        for q in load_split("cir", split):
            vocab |= words(q["text"])
        for c in load_split("captions", split):
            if not is_held_out(c.get("source", "")):
                vocab |= words(c["caption"])
    for phrasings in TONE_TEXTS.values():
        for t in phrasings:
            vocab |= words(t)
    return frozenset(vocab | open_vocab.training_words())


def training_texts() -> frozenset:
    """The exact modification texts trainers use (offline CIR queries of every split and the tone phrasings),
    lower-cased: no suite phrasing may equal one of them."""
    return _training_texts(_root())


@lru_cache(maxsize=4)
def _training_texts(root: str) -> frozenset:
    texts = {q["text"].strip().lower() for split in ("train", "val", "test") for q in load_split("cir", split)}
    texts |= {t.lower() for phrasings in TONE_TEXTS.values() for t in phrasings}
    return frozenset(texts)
