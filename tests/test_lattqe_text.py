"""Text-conditioned LAttQE (``config.text_token``, expander ``lattqe-text``): the modification text is a token of
the sequence, the expansion stays in the span of the query and its neighbours, image-only queries still expand,
training on composed queries lowers the loss, and its checkpoint round-trips through the one loader."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.errors import CheckpointError, InputError
from engine.expand import EXPANDERS, ExpanderUnavailable
from engine.expand.base import l2n
from engine.expand.baselines import BaselineExpander
from engine.expand.lattqe import (LAttQEConfig, LAttQEModel, LAttQETextExpander, load_lattqe, make_lattqe,
                                  save_lattqe)
from engine.train.lattqe.composed import (ComposedConfig, build_set, composed_eval, fixed_composed_loss,
                                          train_composed)

D = 16


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(dim=D, layers=1, heads=2, width=8, ff_dim=16, dropout=0.0, text_token=True, weight_floor=None,
               max_positions=9, trained_max_k=8)
    cfg.update(kw)
    return LAttQEModel(LAttQEConfig(**cfg)).eval()


def _qnt(seed=0, k=6):
    rng = np.random.default_rng(seed)
    return (l2n(rng.normal(size=D)), l2n(rng.normal(size=(k, D))), l2n(rng.normal(size=D)), l2n(rng.normal(size=D)))


def test_expansion_lies_in_the_span_of_query_and_neighbours():
    q, nb, t, _ = _qnt()
    ex = LAttQETextExpander(_model())
    out = ex.expand(q, nb, nb @ q, text=t)
    assert np.isclose(np.linalg.norm(out.vector), 1.0, atol=1e-5)
    basis = np.vstack([q, nb]).T  # (D, k + 1)
    coef, *_ = np.linalg.lstsq(basis, out.vector, rcond=None)
    assert np.allclose(basis @ coef, out.vector, atol=1e-5)
    # the combination is exactly q + sum w_i d_i, normalised
    direct = q + out.weights @ nb
    assert np.allclose(direct / np.linalg.norm(direct), out.vector, atol=1e-5)
    assert out.explanation["text_token"] is True and ex.reads_text and ex.name == "lattqe-text"


def test_the_text_token_changes_the_weights():
    q, nb, t1, t2 = _qnt(1)
    ex = LAttQETextExpander(_model())
    w1 = ex.expand(q, nb, nb @ q, text=t1).weights
    w2 = ex.expand(q, nb, nb @ q, text=t2).weights
    assert np.abs(w1 - w2).max() > 1e-4
    # an image-only model given the same two texts gives the same weights (it does not read them)
    plain = LAttQETextExpander(_model(text_token=False))
    assert np.allclose(plain.expand(q, nb, nb @ q, text=t1).weights, plain.expand(q, nb, nb @ q, text=t2).weights)


def test_without_a_text_the_text_model_still_expands_and_ignores_the_token():
    q, nb, t, _ = _qnt(2)
    model = _model()
    ex = LAttQETextExpander(model)
    out = ex.expand(q, nb, nb @ q)  # an image-only query
    assert np.isfinite(out.vector).all() and out.explanation["text_token"] is False
    # the absent text is padded out: whatever sits in its slot changes nothing
    with torch.no_grad():
        qt, nt = torch.as_tensor(q[None]), torch.as_tensor(nb[None])
        a = model(qt, nt, text=torch.as_tensor(t[None]), text_mask=torch.tensor([False]))[0]
        b = model(qt, nt)[0]
        c = model(qt, nt, text=torch.as_tensor(t[None]))[0]
    assert torch.allclose(a, b, atol=1e-6) and not torch.allclose(b, c, atol=1e-4)


def test_bad_text_is_one_sentence_and_baselines_ignore_the_text():
    q, nb, t, _ = _qnt(3)
    with pytest.raises(InputError, match="text embedding must be a finite 16-d vector"):
        LAttQETextExpander(_model()).expand(q, nb, nb @ q, text=np.ones(5, np.float32))
    aqe = BaselineExpander("aqe")
    assert np.allclose(aqe.expand(q, nb, nb @ q, text=t).vector, aqe.expand(q, nb, nb @ q).vector)
    assert EXPANDERS.get("none")().expand(q, nb, nb @ q, text=t).vector.shape == (D,)


def _toy_set(seed, n_queries=48, n_gallery=60):
    """A composed set where the text says which of two clusters around the query holds the targets: the
    neighbours mix both clusters, so only a model that reads the text can tell which ones to average in."""
    rng = np.random.default_rng(seed)
    axes = l2n(rng.normal(size=(2, D)))
    qs, ts, cands, rels = [], [], [], []
    gallery = []
    for i in range(n_queries):
        base = l2n(rng.normal(size=D))
        side = int(rng.integers(2))
        members = [l2n(base + 0.6 * axes[j] + 0.15 * rng.normal(size=D)) for j in (0, 1) for _ in range(6)]
        start = len(gallery)
        gallery.extend(members)
        rows = np.arange(start, start + 12)
        sims = np.array(members) @ base
        order = rows[np.argsort(-sims)]
        qs.append(base)
        ts.append(l2n(axes[side] + 0.05 * rng.normal(size=D)))
        cands.append(order)
        rels.append((order - start) // 6 == side)
    gallery = np.array(gallery[:max(n_gallery, len(gallery))], np.float32)
    return build_set_from(np.array(qs), np.array(ts), np.array(cands), np.array(rels), gallery)


def build_set_from(q, t, cand, rel, gallery):
    from engine.train.lattqe.composed import ComposedSet

    return ComposedSet(q.astype(np.float32), t.astype(np.float32), cand, rel, gallery, np.array(["sum"] * len(q)))


def test_training_on_composed_queries_lowers_the_loss():
    train, val = _toy_set(0), _toy_set(1, n_queries=16)
    cfg = ComposedConfig(epochs=6, queries_per_epoch=96, batch=32, lr=3e-3, k_min=4, k_max=8, layers=1, heads=2,
                         width=16, ff_dim=32, dropout=0.0, rank_negatives=6, rank_positives=6, val_nqe=8)
    from engine.train.lattqe.composed import new_model

    init = new_model(cfg, train)
    before = fixed_composed_loss(init, train, cfg, k=8)
    model, hist = train_composed(train, val, cfg, progress=False, model=init)
    after = fixed_composed_loss(model, train, cfg, k=8)
    assert after < before - 0.01, (before, after)
    assert len(hist) == 6 and {"val_recall", "val_recall_none"} <= set(hist[0])
    res = composed_eval(model, val, 8)["sum"]
    assert res["queries"] == 16 and 0 <= res["top10_changed"] <= 16


def test_build_set_leaves_out_the_reference_and_other_groups():
    gallery = [{"image": f"g{i}", "gallery": "a" if i < 4 else "b"} for i in range(6)]
    gallery[3]["caption"] = "man, medium skin tone"
    gallery[1]["caption"] = "man, medium-dark skin tone"
    pos = {g["image"]: i for i, g in enumerate(gallery)}
    gemb = l2n(np.eye(6, D, dtype=np.float32) + 0.1)
    queries = [{"reference": "g0", "targets": ["g2"], "gallery": "a", "text": "x", "attribute": "medium"}]
    s = build_set({"sum": gemb[[0]]}, gemb[[1]], queries, gallery, gemb, pos, depth=5)
    got = s.cand[0][s.cand[0] >= 0]
    assert sorted(got.tolist()) == [1, 2, 3] and s.rel[0][s.cand[0] == 2].all() and s.rel[0].sum() == 1
    # weight targets: 1 for the target, the agree label for the neighbour with the edit's attribute ("medium",
    # not "medium-dark"), 0 for the rest
    labels = dict(zip(s.cand[0].tolist(), s.labels(np.array([0]), 5, 0.5)[0].tolist()))
    assert labels[2] == 1.0 and labels[3] == 0.5 and labels[1] == 0.0


def test_agrees_matches_whole_attribute_phrases():
    from engine.train.lattqe.composed import agrees

    assert agrees({"caption": "man, bald"}, "man") and not agrees({"caption": "woman, bald"}, "man")
    assert agrees({"category": "fish"}, "fish") and agrees({"colour": "blue", "caption": None}, "blue")
    assert not agrees({"caption": "hand, medium-dark skin tone"}, "medium") and not agrees({"caption": "x"}, None)


def test_checkpoint_round_trips_is_found_apart_and_a_tampered_one_is_refused(tmp_path):
    model = _model(weight_floor=0.2)
    path = save_lattqe(model, tmp_path / "lattqe-bb-text.safetensors", "bb@1",
                       {"validation": {"split": "val", "metric": "R@10", "scores": {"lattqe-text": 1.0, "none": 0.5}}})
    loaded, rec = load_lattqe(path, fingerprint="bb@1")
    assert loaded.config.text_token and loaded.config.width == 8 and rec["validation"]["metric"] == "R@10"
    q, nb, t, _ = _qnt(4)
    a = LAttQETextExpander(model).expand(q, nb, nb @ q, text=t)
    b = LAttQETextExpander(loaded).expand(q, nb, nb @ q, text=t)
    assert np.allclose(a.vector, b.vector, atol=1e-6)
    # the registry finds it as lattqe-text only; the image-only LAttQE does not take it
    ex = EXPANDERS.get("lattqe-text")(embed_dim=D, checkpoint_dir=str(tmp_path), fingerprint="bb@1")
    assert isinstance(ex, LAttQETextExpander)
    with pytest.raises(ExpanderUnavailable, match="no LAttQE checkpoint"):
        make_lattqe(embed_dim=D, checkpoint_dir=str(tmp_path), fingerprint="bb@1")
    with pytest.raises(ExpanderUnavailable, match="train lattqe --composed"):
        EXPANDERS.get("lattqe-text")(embed_dim=D, checkpoint_dir=str(tmp_path / "none"), fingerprint="bb@1")
    with pytest.raises(CheckpointError, match="lattqe-bb-text.safetensors"):
        load_lattqe(path, fingerprint="other@2")
    # tampered: bytes of the tensors changed (the header says one size, the file has another)
    raw = bytearray(path.read_bytes())
    bad = tmp_path / "bad" / "lattqe-bb-text.safetensors"
    bad.parent.mkdir()
    bad.write_bytes(bytes(raw[: len(raw) - 64]))
    with pytest.raises(CheckpointError, match="lattqe-bb-text.safetensors"):
        load_lattqe(bad, fingerprint="bb@1")
    # tampered: a text model's record without its text token cannot take the weights
    from safetensors.torch import load_file, save_file
    import json
    from engine.checkpoints import RECORD_KEY

    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    record = json.loads(meta[RECORD_KEY])
    record["config"]["text_token"] = False
    other = tmp_path / "other" / "lattqe-bb-text.safetensors"
    other.parent.mkdir()
    save_file(load_file(str(path)), str(other), metadata={RECORD_KEY: json.dumps(record)})
    with pytest.raises(CheckpointError, match="cannot load LAttQE weights"):
        load_lattqe(other, fingerprint="bb@1")


def test_an_expander_below_no_expansion_on_validation_is_not_offered(monkeypatch):
    """EngineDefaults.offers: an expander whose validation overall score with it is below the one without
    (``expander_overall_val``, filled by the defaults choice) is not offered, even when it moves answers."""
    import engine.eval.generalise as g
    from engine.defaults import EngineDefaults
    from engine.eval.expander_offer import overall_change

    ev = {"queries_changed": {"lattqe-text": 319, "aqe": 5},
          "expander_overall_val": {"lattqe-text": [65.31, 64.83], "aqe": [65.31, 65.31]}}
    d = EngineDefaults(evidence=ev)
    assert not d.offers("lattqe-text", composed_only=True) and d.offers("aqe", composed_only=True)
    assert d.offers("none") and d.offers("lattqe", composed_only=True)
    # an expander that also serves image-only queries is judged there by the labelled set, not by this loss
    assert d.offers("lattqe-text")
    assert not EngineDefaults(evidence={**ev, "expander_overall_val": {"aqe": [65.3, 60.0]}}).offers(
        "aqe", composed_only=True)
    assert EngineDefaults(evidence={"expander_overall_val": {"x": "damaged"}}).offers("x", composed_only=True)

    def fake_rank(v, suite, gallery, gemb, pos, expander=None, nqe=0, fraction=1.0, floor=-1.0, hub=0.0,
                  density=None, texts=None):
        assert expander is None or texts is not None  # the expander gets the queries' texts
        return np.where(np.arange(len(v)) < 2, 1, 50) if expander is None else np.full(len(v), 50)

    monkeypatch.setattr(g, "rank_suite", fake_rank)
    kinds = np.array(["colour"] * 4)
    evv = {"suite_obj": None, "tensors": (None, None, None), "kinds": kinds, "texts": np.zeros((4, 2)),
           "vectors": {"rtic": np.zeros((4, 2))}}
    reader = SimpleNamespace(reads_text=True)  # a stand-in for a text-conditioned expander
    without, with_ = overall_change(evv, reader, 4, -1.0, 0.02, g.rank_suite)
    assert without > with_


def test_the_suite_encodes_the_query_texts_only_for_an_expander_that_reads_them():
    """An evaluation holds its texts as a function: ``texts_of`` calls it once, for the first expander that reads the
    text, keeps the result, and hands nothing to one that does not."""
    from engine.eval.expander_offer import texts_of

    calls = []

    def encode():
        calls.append(1)
        return np.ones((3, 2))

    ev = {"texts": encode}
    assert texts_of(ev, SimpleNamespace(reads_text=False)) == {} and texts_of(ev, object()) == {} and not calls
    first = texts_of(ev, SimpleNamespace(reads_text=True))["texts"]
    again = texts_of(ev)["texts"]
    assert calls == [1] and first is again and first.shape == (3, 2)
    assert texts_of({"texts": None}, SimpleNamespace(reads_text=True)) == {}


def test_the_shipped_text_model_loads_but_the_page_does_not_offer_it(gallery_engine):
    """The bundled lattqe-text checkpoint loads for the packaged backbone; its defaults record says it scored below
    no expansion on the suite's validation side, so the page leaves it out of its choices."""
    eng = gallery_engine
    assert "lattqe-text" in eng.expanders, eng.expanders_unavailable
    assert eng.expanders["lattqe-text"].model.config.text_token
    assert "lattqe-text" not in eng.offered_expanders and not eng.defaults.offers("lattqe-text", composed_only=True)
