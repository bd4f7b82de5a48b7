"""Whether an expander earns its place on the page: the figures the defaults choice (``engine.eval.generalise``)
records per expander beside ``queries_changed``, read by ``engine.defaults.EngineDefaults.offers``."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..compose.auto import overall_of_ranks
from ..expand.base import expander_reads_text


def texts_of(ev: dict, expander=None) -> dict:
    """``rank_suite``'s ``texts`` argument from an evaluation (none when it holds no text embeddings, or when
    ``expander`` is given and does not read the text), so a text-conditioned expander is measured with the queries'
    texts as the page runs it. An evaluation may hold them as a function that encodes them (``evaluate``): they
    are encoded on the first call that needs them and kept."""
    if expander is not None and not expander_reads_text(expander):
        return {}
    texts = ev.get("texts")
    if callable(texts):
        texts = ev["texts"] = texts()
    return {"texts": texts} if texts is not None else {}


def queries_changed(ev: dict, expander, nqe: int, floor: float, fraction: float, rank: Callable) -> int:
    """How many (composer, validation query) pairs the expander at (nqe, floor) moves the target of (``rank``: the
    suite's ranking): an expander that moves none is not offered on the page for this backbone (engine.defaults)."""
    suite = ev["suite_obj"]
    gallery, gemb, pos = ev["tensors"]
    hub, density = ev.get("hub") or {}, ev.get("density")
    return int(sum((rank(v, suite, gallery, gemb, pos, expander, nqe, fraction, floor, hub.get(n, 0.0), density,
                         **texts_of(ev, expander))
                    != rank(v, suite, gallery, gemb, pos, hub=hub.get(n, 0.0), density=density)).sum()
                   for n, v in ev["vectors"].items()))


def overall_change(ev: dict, expander, nqe: int, floor: float, fraction: float, rank: Callable) -> list:
    """[overall score without, with ``expander`` at (nqe, floor)] of the evaluation's method vectors (averaged
    over them; ``rank``: the suite's ranking, ``engine.eval.generalise.rank_suite``): an expander below no
    expansion there is not offered on the page (engine.defaults)."""
    suite, kinds = ev["suite_obj"], ev["kinds"]
    gallery, gemb, pos = ev["tensors"]
    hub, density = ev.get("hub") or {}, ev.get("density")
    out = np.zeros(2)
    for n, v in ev["vectors"].items():
        out += [overall_of_ranks(rank(v, suite, gallery, gemb, pos, hub=hub.get(n, 0.0), density=density), kinds),
                overall_of_ranks(rank(v, suite, gallery, gemb, pos, expander, nqe, fraction, floor, hub.get(n, 0.0),
                                      density, **texts_of(ev, expander)), kinds)]
    return [round(float(x) / max(1, len(ev["vectors"])), 2) for x in out]
