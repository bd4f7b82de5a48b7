"""Training the operation router of a learned composer's anchor (engine.compose.router) from language alone.

Texts are written from the open-vocabulary templates of the *train* side only (``engine.data.open_vocab``), their
slots filled with *train* words (XKCD colour names; category names, the ImageNet ones included since no picture
is needed; light phrases), plus the offline CIR set's training texts with their kinds. Each text's class is its
operation. The classifier is a multinomial logistic regression on the backbone's text embeddings.
"""
from __future__ import annotations

import random
from typing import Dict, List, Tuple

import numpy as np
import torch

from ..compose.router import Router
from ..data import open_vocab as ov
from ..data.features import embed_texts
from ..data.cir_triplets import load_offline_cir

PER_CLASS = 240
FILLS = 3  # each template written this many times, with other train words
SEED = 0


def operation_texts(per_class: int = PER_CLASS, seed: int = SEED) -> List[Tuple[str, str]]:
    """[(text, operation class)] of the train side: templates x train words, at most ``per_class`` each."""
    from ..data.builders import ensure_built

    ensure_built("cir")  # the explicit build step of this trainer (quick when built): the in-domain texts

    rng = random.Random(f"router:{seed}")
    colours = ov.of_split(ov.colour_splits(), "train")
    things = ov.of_split(ov.category_splits(), "train")
    light_x = [c for e in ov.LIGHT_CORES if e != "tint" for c in ov.of_split(ov.core_splits("light", e), "train")]
    by: Dict[str, List[str]] = {}

    def fill(family: str, edit: str = "") -> List[str]:
        out = []
        for t in [t for t in ov.templates(family, "train", edit) for _ in range(FILLS)]:
            a, b = rng.sample(things, 2)
            slots = {"c": rng.choice(colours), "a": a, "b": b, "look": rng.choice(ov.LOOKS), "x": rng.choice(light_x)}
            used = {k: v for k, v in slots.items() if "{" + k + "}" in t["template"]
                    or "{" + k.upper() + "}" in t["template"]}
            out.append(ov.render(t["template"], **used))
        return out

    for family in ("colour", "category", "compose-object", "compose-look"):
        by[family] = fill(family)
    for edit in ov.LIGHT_CORES:
        by[f"light:{edit}"] = fill("light", edit)
    by["undo"] = [t for edit in ov.UNDO_CORES for t in fill("undo", edit)]
    for trip in load_offline_cir("train", hold_out=True):
        kind = str(trip.meta.get("kind", "other"))
        by.setdefault("colour" if kind == "recolour" else f"cir:{kind}", []).append(trip.text)
    out = []
    for cls in sorted(by):
        texts = sorted(set(by[cls]))
        rng.shuffle(texts)
        out += [(t, cls) for t in texts[:per_class]]
    return out


def train_router(backbone, texts: List[Tuple[str, str]], steps: int = 300, l2: float = 1e-3):
    """(Router with zero trust, training accuracy) fitted on ``texts``."""
    classes = sorted({c for _, c in texts})
    y = torch.tensor([classes.index(c) for _, c in texts])
    x = torch.nn.functional.normalize(torch.from_numpy(np.asarray(embed_texts(backbone, [t for t, _ in texts]),
                                                                  dtype=np.float32)), dim=-1)
    x = x[:, : getattr(backbone, "text_dim", x.shape[1])]
    torch.manual_seed(SEED)
    w = torch.zeros(len(classes), x.shape[1], requires_grad=True)
    b = torch.zeros(len(classes), requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        logits = x @ w.T + b
        loss = torch.nn.functional.cross_entropy(logits * 10.0, y) + l2 * (w ** 2).sum()
        loss.backward()
        opt.step()
    with torch.no_grad():
        w10, b10 = w.detach() * 10.0, b.detach() * 10.0
        acc = float(((x @ w10.T + b10).argmax(1) == y).float().mean())
    return Router(w10, b10, classes), acc
