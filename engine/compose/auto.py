"""The automatic method: each query composed by the method that validation found best for its *operation*.

No single composer wins every kind of edit: an anchored Context-I2W is strongest where the text names a new
object, RTIC where it asks for a light or tone edit, and the words alone where the reference has nothing to give.
The operation router (``engine.compose.router``, trained from language alone and stored with every anchored
composer) reads the operation ``c = argmax_k p_k(text)`` from the sentence; a *route table* ``c -> method``,
chosen on the validation side of the held-out-domain suite (:func:`choose_routes`, run by ``python -m engine eval
generalise --side val --choose``) and stored in the defaults record (``routes``), names the method that composes
the query. The query is that method's own composition (so its explanation, its share of the learned correction
included, is shown as it is), with the operation read and the method used added. A query without an image or
without a text has no operation to route and is composed by the weighted sum.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence
from zlib import crc32

import numpy as np

from ..defaults import engine_defaults
from ..labels import method_label
from .anchor import composable
from .base import COMPOSERS, Composer, ComposerUnavailable, Composition, Query, encoded_text
from .rtic import load_rtic_composer

# the methods a route may name (those that compose a text with an image and take a text alone)
MEMBERS = ("text", "sum", "rtic", "rtic+gcn", "context-i2w")


class AutoComposer(Composer):
    name, label, uses_alpha = "auto", "Automatic", True

    def __init__(self, backbone, members: Dict[str, Composer], router, routes: Dict[str, str], fallback: str = "sum"):
        super().__init__(backbone)
        missing = sorted({m for m in routes.values() if m not in members} | ({fallback} - set(members)))
        if missing:
            raise ComposerUnavailable(f"the automatic method needs {', '.join(missing)}, not available here")
        self.members, self.router, self.routes, self.fallback = members, router, dict(routes), fallback

    def method_for(self, text_embedding) -> tuple:
        """(operation class, its probability, method name) for one (1, D) text embedding."""
        op, prob = self.router.top(text_embedding)
        return op, prob, self.routes.get(op, self.fallback)

    def compose(self, query: Query) -> Composition:
        has_text = bool(query.text and query.text.strip())
        if not (has_text and query.has_image):
            comp = self.members[self.fallback].compose(query)
            comp.explanation = {**comp.explanation, "automatic": {"method": self.fallback, "operation": None}}
            return comp
        t = encoded_text(self.backbone, query)[0].float().cpu().reshape(1, -1)  # the routed method reuses it
        op, prob, method = self.method_for(t)
        comp = self.members[method].compose(query)
        auto = {"operation": op, "probability": round(prob, 3), "method": method}
        comp.explanation = {**comp.explanation, "automatic": {**auto, "says": says(auto)}}
        return comp


    def compose_many(self, queries: List[Query]) -> List[Composition]:
        if not composable(queries):
            return super().compose_many(queries)
        t = self.backbone.encode_texts([q.text for q in queries]).embeddings.float().cpu()
        p = self.router.probabilities(t)
        ops = [self.router.classes[i] for i in p.argmax(dim=-1).tolist()]
        methods = [self.routes.get(op, self.fallback) for op in ops]
        out: List[Composition] = [None] * len(queries)  # type: ignore[list-item]
        for m in sorted(set(methods)):
            idx = [i for i, x in enumerate(methods) if x == m]
            for i, comp in zip(idx, self.members[m].compose_many([queries[i] for i in idx])):
                comp.explanation = {**comp.explanation, "automatic": {"operation": ops[i], "method": m,
                                                                      "probability": round(float(p[i].max()), 3)}}
                out[i] = comp
        return out


def routed_vectors(vectors: Dict[str, np.ndarray], classes: Sequence[str], routes: Dict[str, str],
                   fallback: str = "sum") -> np.ndarray:
    """The automatic method's (Q, D) query vectors from each member's own (what :class:`AutoComposer` returns
    for queries with an image and a text), ``classes`` the router's class of each query."""
    out = np.empty_like(vectors[fallback])
    for i, c in enumerate(classes):
        out[i] = vectors[routes.get(c, fallback)][i]
    return out


def overall_of_ranks(ranks: np.ndarray, kinds: np.ndarray) -> float:
    """The suite's overall score: the mean over kinds of (R@1 + R@10) / 2 (engine.eval.generalise)."""
    vals = [((ranks[kinds == k] <= 1).mean() + (ranks[kinds == k] <= 10).mean()) * 50.0 for k in np.unique(kinds)]
    return float(np.mean(vals)) if vals else float("nan")


def choose_routes(ranks: Dict[str, np.ndarray], classes: Sequence[str], kinds: np.ndarray,
                  fallback: str = "sum", passes: int = 3) -> Dict[str, str]:
    """The route table (operation class -> method) with the best overall score on these queries, by coordinate
    ascent from "every class to ``fallback``"; a class keeps the fallback unless another method scores higher.
    ``ranks``: each candidate method's best-target rank per query; ``classes``: the router's class per query."""
    classes = np.asarray(list(classes))
    names = [m for m in ranks if m != fallback]
    routes = {c: fallback for c in sorted(set(classes.tolist()))}

    def score(table):
        pick = np.array([table[c] for c in classes])
        r = np.empty(len(classes), dtype=np.int64)
        for m in {*pick.tolist()}:
            r[pick == m] = ranks[m][pick == m]
        return overall_of_ranks(r, kinds)

    best = score(routes)
    for _ in range(passes):
        moved = False
        for c in sorted(routes):
            for m in names + [fallback]:
                if m == routes[c]:
                    continue
                trial = {**routes, c: m}
                s = score(trial)
                if s > best + 1e-9:
                    routes, best, moved = trial, s, True
        if not moved:
            break
    return {c: m for c, m in routes.items() if m != fallback}


def cross_fitted_score(ranks: Dict[str, np.ndarray], classes: Sequence[str], kinds: np.ndarray, groups: Sequence[str],
                       fallback: str = "sum") -> float:
    """The overall score of routes chosen on one half of the queries (split by ``groups``, e.g. the reference
    photo, so no photo is on both sides) and applied to the other, both ways: an honest figure to compare the
    automatic method with single methods chosen on the same queries."""
    groups = list(groups)
    fold = np.array([crc32(str(g).encode()) % 2 for g in groups])
    classes = np.asarray(list(classes))
    out = np.empty(len(groups), dtype=np.int64)
    for f in (0, 1):
        fit_on, apply_to = fold != f, fold == f
        routes = choose_routes({m: r[fit_on] for m, r in ranks.items()}, classes[fit_on], kinds[fit_on], fallback)
        pick = np.array([routes.get(c, fallback) for c in classes[apply_to]])
        idx = np.flatnonzero(apply_to)
        for m in set(pick.tolist()):
            out[idx[pick == m]] = ranks[m][idx[pick == m]]
    return overall_of_ranks(out, kinds)


def router_of(members: Dict[str, Composer]):
    """The operation router stored with the anchored members (the same one, trained from language alone)."""
    for name in ("context-i2w", "rtic", "rtic+gcn"):
        anchor = getattr(members.get(name), "anchor", None)
        if anchor is not None and getattr(anchor, "router", None) is not None:
            return anchor.router
    return None


def load_members(backbone, checkpoint_dir, names: Sequence[str],
                 loaded: Optional[Mapping[str, Composer]] = None) -> Dict[str, Composer]:
    """{name: composer} of the routed ``names`` (the RTIC+GCN checkpoint is a variant of ``rtic``); a member in
    ``loaded`` on the same backbone is that one (a composer holds no gallery state), not a second copy."""
    out: Dict[str, Composer] = {}
    for n in names:
        have = (loaded or {}).get(n)
        if have is not None and have.backbone is backbone:
            out[n] = have
            continue
        out[n] = (load_rtic_composer(backbone, checkpoint_dir, variant="rtic+gcn") if n == "rtic+gcn"
                  else COMPOSERS.get(n)(backbone, checkpoint_dir=checkpoint_dir))
    return out


def load_auto(backbone, checkpoint_dir=None, loaded: Optional[Mapping[str, Composer]] = None) -> AutoComposer:
    """The automatic method for ``backbone``: the route table of its defaults record and the routed methods
    (those in ``loaded``, the composers the engine has made already, are reused); ComposerUnavailable (one
    sentence) without a record that has routes."""
    d = engine_defaults(backbone, checkpoint_dir=checkpoint_dir)
    routes = d.evidence.get("routes") if isinstance(d.evidence.get("routes"), dict) else None
    if not routes or not all(isinstance(v, str) and v in MEMBERS for v in routes.values()):
        raise ComposerUnavailable("the automatic method needs a route table for this backbone; choose one with "
                                  "python -m engine eval generalise --side val --choose")
    names: List[str] = sorted(set(routes.values()) | {"sum"})
    members = load_members(backbone, checkpoint_dir, names, loaded)
    router = router_of(members) or router_of(load_members(backbone, checkpoint_dir, ["rtic"], loaded))
    if router is None:
        raise ComposerUnavailable("the automatic method needs the operation router of an anchored composer")
    return AutoComposer(backbone, members, router, routes)


COMPOSERS.register("auto", reuses_loaded=True)(
    lambda backbone, checkpoint_dir=None, loaded=None: load_auto(backbone, checkpoint_dir, loaded))


def says(auto: dict) -> str:
    """One plain sentence for the page: which change was read from the words and which method composed it."""
    return (f"Change read from your words: {operation_words(auto['operation'])} "
            f"({float(auto.get('probability', 0)):.0%} sure); composed by {method_label(auto['method'])}.")


OPERATION_WORDS = {"category": "a different thing", "colour": "a new colour", "compose-object": "a new object, same look",
                   "compose-look": "a new look, same object", "undo": "undoing an edit"}


def operation_words(op: str) -> str:
    if op in OPERATION_WORDS:
        return OPERATION_WORDS[op]
    if op.startswith("light:"):
        return {"bw": "black and white", "night": "at night", "upside-down": "upside down"}.get(op[6:], op[6:])
    if op.startswith("cir:"):
        return op[4:].replace("_", " ")
    return op
