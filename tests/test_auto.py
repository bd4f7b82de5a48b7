"""The automatic method (engine.compose.auto): routes chosen on validation, each query composed by its route."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from engine.compose import ComposerUnavailable, Query
from engine.compose.auto import AutoComposer, choose_routes, cross_fitted_score, load_auto, routed_vectors
from engine.compose.baselines import TextOnly, WeightedSum
from engine.compose.router import Router


def _ranks(n, good, kinds_good):
    """Rank 1 on the queries whose kind is in ``kinds_good``, rank 50 elsewhere."""
    return np.where(np.isin(good, kinds_good), 1, 50)


def test_choose_routes_gives_each_operation_the_method_that_wins_it():
    kinds = np.array(["category"] * 40 + ["night"] * 40 + ["colour"] * 40)
    classes = ["category"] * 40 + ["light:night"] * 40 + ["colour"] * 40
    ranks = {"sum": _ranks(120, kinds, ["colour"]), "text": _ranks(120, kinds, ["category"]),
             "rtic": _ranks(120, kinds, ["night"]), "context-i2w": np.full(120, 30)}
    routes = choose_routes(ranks, classes, kinds)
    assert routes == {"category": "text", "light:night": "rtic"}   # colour stays with the fallback, the sum
    groups = [f"photo{i % 20}" for i in range(120)]
    assert cross_fitted_score(ranks, classes, kinds, groups) == pytest.approx(100.0)
    # every single method is far below: the best reaches one kind in three
    assert max(float(np.mean([((r[kinds == k] <= 1).mean() + (r[kinds == k] <= 10).mean()) * 50
                              for k in ("category", "night", "colour")])) for r in ranks.values()) < 40


def test_cross_fitting_does_not_reward_routes_that_only_fit_noise():
    """Ranks that do not depend on the class: routes chosen on one half buy nothing on the other, so the
    cross-fitted score is no better than the fallback's."""
    rng = np.random.default_rng(0)
    n = 400
    kinds = np.array(["a"] * n)
    classes = [f"c{i % 10}" for i in range(n)]
    ranks = {m: rng.integers(1, 30, size=n) for m in ("sum", "text", "rtic")}
    groups = [f"g{i}" for i in range(n)]
    fallback = float(((ranks["sum"] <= 1).mean() + (ranks["sum"] <= 10).mean()) * 50)
    assert cross_fitted_score(ranks, classes, kinds, groups) < fallback + 3.0


def test_the_automatic_method_composes_each_query_by_its_routed_method(tiny):
    texts = ["a cat instead", "the same car in red"]
    emb = F.normalize(tiny.encode_texts(texts).embeddings.float(), dim=-1)
    router = Router(emb * 50.0, torch.zeros(2), ["category", "colour"])
    members = {"text": TextOnly(tiny), "sum": WeightedSum(tiny)}
    auto = AutoComposer(tiny, members, router, {"category": "text"})
    img = F.normalize(torch.randn(tiny.embed_dim), dim=0)
    q0 = Query(text=texts[0], image_embedding=img, has_image=True, alpha=0.5)
    out = auto.compose(q0)
    assert out.explanation["automatic"]["operation"] == "category" and out.explanation["automatic"]["method"] == "text"
    assert out.explanation["automatic"]["says"].startswith("Change read from your words: a different thing (")
    assert out.explanation["automatic"]["says"].endswith("composed by Text only.")
    assert np.allclose(out.vector, TextOnly(tiny).compose(Query(text=texts[0])).vector, atol=1e-5)
    q1 = Query(text=texts[1], image_embedding=img, has_image=True, alpha=0.5)
    out = auto.compose(q1)
    assert out.explanation["automatic"]["method"] == "sum"      # colour: no route, the fallback
    assert np.allclose(out.vector, WeightedSum(tiny).compose(q1).vector, atol=1e-5)
    # the batch form the evaluation uses gives the same vectors
    vecs = {"text": np.stack([np.ones(3), np.ones(3)]), "sum": np.stack([np.zeros(3), np.zeros(3)])}
    assert routed_vectors(vecs, ["category", "colour"], {"category": "text"}).tolist() == [[1, 1, 1], [0, 0, 0]]
    # an image alone has no operation to read: the weighted sum
    out = auto.compose(Query(image_embedding=img, has_image=True))
    assert out.explanation["automatic"]["method"] == "sum"
    with pytest.raises(ComposerUnavailable):
        AutoComposer(tiny, members, router, {"category": "rtic"})   # a route to a method not loaded


def test_the_query_text_is_encoded_once_by_the_automatic_method_and_the_method_it_routes_to(tiny, monkeypatch):
    texts = ["a cat instead", "the same car in red"]
    emb = F.normalize(tiny.encode_texts(texts).embeddings.float(), dim=-1)
    router = Router(emb * 50.0, torch.zeros(2), ["category", "colour"])
    auto = AutoComposer(tiny, {"text": TextOnly(tiny), "sum": WeightedSum(tiny)}, router, {"category": "text"})
    seen = []
    real = tiny.encode_texts  # the instance's: a service may have routed it through its text batcher

    def counting(batch, *a, **kw):
        seen.extend(batch)
        return real(batch, *a, **kw)

    monkeypatch.setattr(tiny, "encode_texts", counting)
    img = F.normalize(torch.randn(tiny.embed_dim), dim=0)
    for text in texts:   # routed to Text only, then to the weighted sum: each reads the router's encoding
        q = Query(text=text, image_embedding=img, has_image=True, alpha=0.5)
        auto.compose(q)
        assert q.text_embedding is not None
    assert seen == texts


def test_the_automatic_method_is_unavailable_without_a_route_table(tmp_path, tiny):
    with pytest.raises(ComposerUnavailable, match="route table"):
        load_auto(tiny, tmp_path)


def test_the_batch_path_of_each_learned_composer_equals_one_query_at_a_time(tiny):
    """compose_many (evaluation's batch path) gives the vectors and trusts of compose, query by query."""
    from engine.compose.anchor import Anchor, AnchorConfig
    from engine.compose.context_i2w import ContextI2WComposer, ContextI2WConfig, ContextI2WMapper
    from engine.compose.rtic import RTIC, RTICComposer, RTICConfig

    torch.manual_seed(0)
    d = tiny.embed_dim
    texts = ["make it red", "a dog instead of the cat", "at night", "in black and white, please"]
    bank = tiny.encode_texts(texts[:2]).embeddings.float()
    anchor = Anchor(AnchorConfig(weight=0.8, text_lo=0.0, text_hi=0.9), text_bank=bank)
    imgs = F.normalize(torch.randn(len(texts), d), dim=-1)
    x = torch.stack([tiny.preprocess(Image.new("RGB", (32, 32), c))
                     for c in ("red", "blue", "green", "white")])
    tokens = tiny.encode_images_with_tokens(x)[1]
    queries = [Query(text=t, image_embedding=imgs[i], has_image=True, image_tokens=tokens[i]) for i, t in enumerate(texts)]
    rtic = RTICComposer(tiny, RTIC(RTICConfig(dim=d, n_blocks=1)).eval(), anchor=anchor)
    cfg = ContextI2WConfig(vision_width=tiny.vision_width, token_dim=tiny.token_dim, context_dim=d,
                           placeholder=tiny.placeholder)
    ci2w = ContextI2WComposer(tiny, ContextI2WMapper(cfg).eval(), anchor=anchor)
    for comp in (rtic, ci2w):
        one = [comp.compose(q) for q in queries]
        many = comp.compose_many(queries)
        for a, b in zip(one, many):
            assert np.allclose(a.vector, b.vector, atol=1e-4)
            assert b.explanation["trust"] == pytest.approx(a.explanation["trust"], abs=1e-3)
        assert len({round(m.explanation["trust"], 3) for m in many}) > 1  # familiar and unfamiliar texts differ
