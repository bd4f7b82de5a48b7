"""Query expansion: baseline formulas, LAttQE properties, DBA, training, checkpoints, metrics."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from engine.errors import CheckpointError, InputError
from engine.expand import EXPANDERS, ExpanderUnavailable
from engine.expand.baselines import expand_batch
from engine.expand.dba import dba_vectors, knn
from engine.expand.lattqe import (
    LAttQEConfig, LAttQEExpander, LAttQEModel, expand_numpy, load_lattqe, save_lattqe,
)
from engine.train.lattqe import (
    TrainConfig, average_precisions, bench_expanders, contrastive_loss, evaluate_expanders, fixed_loss,
    qe_map, split_classes, train_lattqe, validation_queries,
)


def unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture
def qnd():
    rng = np.random.default_rng(1)
    q = unit(rng.standard_normal(16))
    nb = unit(0.25 * rng.standard_normal((6, 16)) + q)
    nb[5] = unit(-q + 0.1 * rng.standard_normal(16))  # one neighbour with negative similarity
    return q.astype(np.float32), nb.astype(np.float32), (nb @ q).astype(np.float32)


def clustered(n_classes=8, per_class=40, dim=24, noise=0.9, seed=0):
    """Gaussian clusters on the sphere with overlapping classes."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_classes, dim))
    x = np.repeat(centres, per_class, 0) + noise * rng.standard_normal((n_classes * per_class, dim))
    y = np.repeat(np.arange(n_classes), per_class)
    return unit(x).astype(np.float32), y


# ----------------------------------------------------------------------------- baselines
def test_aqe_is_normalised_sum(qnd):
    q, nb, s = qnd
    out = EXPANDERS.get("aqe")().expand(q, nb, s)
    direct = q.astype(np.float64).copy()
    for d in nb:
        direct += d
    np.testing.assert_allclose(out.vector, unit(direct), atol=1e-6)
    np.testing.assert_allclose(out.weights, np.ones(6))


def test_aqewd_weights_decay_linearly_with_rank(qnd):
    q, nb, s = qnd
    out = EXPANDERS.get("aqewd")().expand(q, nb, s)
    n = len(nb)
    direct = q.astype(np.float64).copy()
    expected_w = []
    for i in range(1, n + 1):  # rank i gets (n - i + 1) / n
        w = (n - i + 1) / n
        expected_w.append(w)
        direct += w * nb[i - 1]
    np.testing.assert_allclose(out.weights, expected_w, rtol=1e-6)
    assert out.weights[0] == 1.0 and out.weights[-1] == pytest.approx(1 / n)
    np.testing.assert_allclose(out.vector, unit(direct), atol=1e-6)


def test_alpha_qe_weights_are_similarity_power(qnd):
    q, nb, s = qnd
    out = EXPANDERS.get("alpha-qe")(alpha=3.0).expand(q, nb, s)
    direct = q.astype(np.float64).copy()
    for d in nb:
        sim = float(np.dot(q, d))
        direct += (max(sim, 0.0) ** 3) * d
    np.testing.assert_allclose(out.vector, unit(direct), atol=1e-6)
    assert out.weights[5] == 0.0  # negative similarity clipped
    assert out.explanation["weights"][0] == pytest.approx(float(s[0]) ** 3, rel=1e-5)


def test_batched_baselines_match_single(qnd):
    q, nb, s = qnd
    for m in ("aqe", "aqewd", "alpha-qe"):
        one = EXPANDERS.get(m)().expand(q, nb, s).vector
        batch = expand_batch(m, np.stack([q, q]), np.stack([nb, nb]))
        np.testing.assert_allclose(batch[1], one, atol=1e-6)


def test_no_neighbours_and_bad_shapes(qnd):
    q, nb, s = qnd
    out = EXPANDERS.get("aqe")().expand(q, np.zeros((0, 16), np.float32), np.zeros(0, np.float32))
    np.testing.assert_allclose(out.vector, q, atol=1e-6)
    with pytest.raises(InputError):
        EXPANDERS.get("aqe")().expand(q, nb[:, :8], s)
    with pytest.raises(InputError):
        EXPANDERS.get("alpha-qe")().expand(q, nb, s[:3])


def test_registry_has_all_expanders(tmp_path):
    for name in ("aqe", "aqewd", "alpha-qe", "lattqe"):
        assert name in EXPANDERS
    with pytest.raises(ExpanderUnavailable, match="no LAttQE checkpoint"):
        EXPANDERS.get("lattqe")(embed_dim=16, checkpoint_dir=str(tmp_path), fingerprint="bb@1")


# ----------------------------------------------------------------------------- LAttQE model
def small_model(positional=True, dim=16, seed=0):
    torch.manual_seed(seed)
    return LAttQEModel(LAttQEConfig(dim=dim, layers=2, heads=2, dropout=0.0, positional=positional)).eval()


def test_lattqe_output_in_gallery_span_and_normalised(qnd):
    q, nb, s = qnd
    q32, nb32 = np.tile(q, 2), np.tile(nb, (1, 2))  # 32-d vectors, span of 7 of them is 7-d
    q32 = unit(q32 + np.r_[np.zeros(16), np.linspace(0, 1, 16)]).astype(np.float32)
    model = small_model(dim=32)
    out = LAttQEExpander(model).expand(q32, nb32, nb32 @ q32)
    assert np.linalg.norm(out.vector) == pytest.approx(1.0, abs=1e-5)
    basis = np.vstack([q32, nb32]).T.astype(np.float64)  # (32, 7)
    coef, *_ = np.linalg.lstsq(basis, out.vector.astype(np.float64), rcond=None)
    assert np.linalg.norm(basis @ coef - out.vector) < 1e-5
    # and exactly the documented combination q + sum w_i d_i of the ORIGINAL neighbours
    np.testing.assert_allclose(out.vector, unit(q32 + out.weights @ nb32), atol=1e-5)
    assert np.all(np.abs(out.weights) <= 1 + 1e-6) and np.ptp(out.weights) > 0


def test_without_positional_encoding_order_does_not_matter(qnd):
    q, nb, _ = qnd
    perm = np.array([3, 0, 5, 1, 4, 2])
    model = small_model(positional=False)
    v1, w1 = expand_numpy(model, q[None], nb[None])
    v2, w2 = expand_numpy(model, q[None], nb[perm][None])
    np.testing.assert_allclose(v1, v2, atol=1e-5)
    np.testing.assert_allclose(w1[0][perm], w2[0], atol=1e-5)


def test_with_positional_encoding_order_matters(qnd):
    q, nb, _ = qnd
    perm = np.array([3, 0, 5, 1, 4, 2])
    model = small_model(positional=True)
    v1, _ = expand_numpy(model, q[None], nb[None])
    v2, _ = expand_numpy(model, q[None], nb[perm][None])
    assert np.abs(v1 - v2).max() > 1e-3


def test_masked_neighbours_are_ignored(qnd):
    q, nb, _ = qnd
    model = small_model()
    qt, nbt = torch.as_tensor(q[None]), torch.as_tensor(nb[None])
    mask = torch.tensor([[True, True, True, True, False, False]])
    with torch.no_grad():
        v_mask, w_mask, _ = model.expand(qt, nbt, mask)
        v_cut, w_cut, _ = model.expand(qt, nbt[:, :4])
    assert torch.all(w_mask[0, 4:] == 0)
    torch.testing.assert_close(v_mask, v_cut, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w_mask[:, :4], w_cut, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- DBA
def test_dba_matches_direct_computation():
    x, _ = clustered(n_classes=3, per_class=10, dim=8)
    k = 4
    for method in ("aqe", "alpha-qe"):
        got = dba_vectors(x, method, k, alpha=3.0, progress=False)
        for i in (0, 7, 29):
            sims = x @ x[i]
            sims[i] = -np.inf
            top = np.argsort(-sims, kind="stable")[:k]
            w = np.ones(k) if method == "aqe" else np.clip(sims[top], 0, None) ** 3
            np.testing.assert_allclose(got[i], unit(x[i] + w @ x[top]), atol=1e-5)


def test_lattdba_uses_the_model_per_item():
    x, _ = clustered(n_classes=3, per_class=10, dim=16)
    model = small_model()
    got = dba_vectors(x, "lattqe", 5, model=model, progress=False)
    i = 11
    sims = x @ x[i]
    sims[i] = -np.inf
    top = np.argsort(-sims, kind="stable")[:5]
    one = LAttQEExpander(model).expand(x[i], x[top], sims[top]).vector
    np.testing.assert_allclose(got[i], one, atol=1e-5)
    with pytest.raises(InputError):
        dba_vectors(x, "lattqe", 5)


# ----------------------------------------------------------------------------- metrics
def test_average_precision_against_eval_metrics():
    from engine.eval.metrics import mean_average_precision

    x, y = clustered(n_classes=4, per_class=12, dim=6, seed=3)
    qids = np.arange(0, 48, 5)
    scores = x[qids] @ x.T
    ours = average_precisions(torch.as_tensor(scores), torch.as_tensor(y[qids]), torch.as_tensor(y),
                              torch.as_tensor(qids)).numpy()
    # independent: drop the query's own column, then the project's metric
    for r, qi in enumerate(qids):
        keep = np.arange(48) != qi
        rel = (y[keep] == y[qi])[None]
        ref = mean_average_precision(scores[r:r + 1, keep], rel)
        assert ours[r] == pytest.approx(ref, abs=1e-6)
    # hand-made: relevant at ranks 1 and 3 of 4 -> (1/1 + 2/3) / 2
    ap = average_precisions(torch.tensor([[0.9, 0.8, 0.7, 0.6]]), torch.tensor([1]), torch.tensor([1, 0, 1, 0]))
    assert float(ap) == pytest.approx((1 + 2 / 3) / 2)


def test_split_classes_is_disjoint():
    y = np.repeat(np.arange(10), 3)
    tr, va = split_classes(y, 0.3, seed=1)
    assert not set(y[tr]) & set(y[va]) and len(set(y[va])) == 3 and (tr | va).all()
    with pytest.raises(InputError):
        split_classes(np.zeros(5), 0.3)


def test_contrastive_loss_formula():
    z = torch.tensor([0.05, 0.3, 0.02, 0.2])
    y = torch.tensor([1.0, 1.0, 0.0, 0.0])
    m = 0.1
    expected = (0.05 ** 2 + 0.3 ** 2 + (m - 0.02) ** 2 + 0.0) / 4
    assert float(contrastive_loss(z, y, m)) == pytest.approx(expected, rel=1e-6)


def test_qe_helps_on_clustered_data():
    x, y = clustered(n_classes=6, per_class=40, dim=16, noise=0.8)
    qids = np.arange(0, len(x), 3)
    base = qe_map("none", x, y, 8, qids)
    assert qe_map("aqe", x, y, 8, qids) > base
    res = evaluate_expanders(x, y, None, nqe_list=(2, 8), n_queries=60, progress=False)
    assert set(res["curves"]) == {"aqe", "aqewd", "alpha-qe", "adba", "adba+aqe", "alpha-dba",
                                  "alpha-dba+alpha-qe"}
    assert all(0 < v <= 1 for c in res["curves"].values() for v in c.values())


# ----------------------------------------------------------------------------- training + checkpoints
def test_training_lowers_loss_and_checkpoint_round_trip(tmp_path):
    torch.set_num_threads(1)
    x, y = clustered(n_classes=60, per_class=8, dim=16, noise=0.7, seed=5)
    tr, va = split_classes(y, 0.3, seed=0)
    cfg = TrainConfig(epochs=6, queries_per_epoch=1024, lr=1e-3, layers=1, heads=2, k_min=8, k_max=16,
                      val_nqe=16, val_queries=100, pool_size=200, dropout=0.0)
    torch.manual_seed(0)
    model = LAttQEModel(LAttQEConfig(dim=16, layers=1, heads=2, dropout=0.0, trained_max_k=16))
    init = copy.deepcopy(model)
    before = fixed_loss(init, x[tr], y[tr], 16, cfg)
    last, hist = train_lattqe(x[tr], y[tr], x[va], y[va], cfg, progress=False, model=model, keep="last")
    after = fixed_loss(last, x[tr], y[tr], 16, cfg)
    assert len(hist) == 6
    # the objective (contrastive + auxiliary BCE) on a fixed augmentation-free tuple set went down
    assert after["loss"] < before["loss"] - 0.02
    assert np.mean([h["loss"] for h in hist[-2:]]) < np.mean([h["loss"] for h in hist[:2]])
    vq = validation_queries(int(va.sum()), cfg)
    vy = np.unique(y[va], return_inverse=True)[1]
    assert qe_map("lattqe", x[va], vy, 16, vq, model=last) == pytest.approx(hist[-1]["val_map"], abs=1e-6)
    # keep="best" returns the epoch with the best validation mAP
    cfg.epochs = 2
    model, hist = train_lattqe(x[tr], y[tr], x[va], y[va], cfg, progress=False, model=copy.deepcopy(init))
    best = max(hist, key=lambda h: h["val_map"])
    assert qe_map("lattqe", x[va], vy, 16, vq, model=model) == pytest.approx(best["val_map"], abs=1e-6)

    model.center.copy_(torch.as_tensor(x[tr].mean(0)))  # the input centre is part of the checkpoint
    path = save_lattqe(model, tmp_path / "lattqe.safetensors", "bb@abc", {"val_map": best["val_map"]})
    rec = json.loads(path.with_suffix(".json").read_text())
    assert rec["backbone_fingerprint"] == "bb@abc" and rec["config"]["dim"] == 16 and rec["part"] == "lattqe"
    assert rec["val_map"] == best["val_map"] and rec["validation"] == {}  # one score: no comparison to record
    loaded, _ = load_lattqe(path, fingerprint="bb@abc")
    v1, _ = expand_numpy(model, x[:4], np.stack([x[4:9]] * 4))
    v2, _ = expand_numpy(loaded, x[:4], np.stack([x[4:9]] * 4))
    np.testing.assert_allclose(v1, v2, atol=1e-6)
    with pytest.raises(CheckpointError, match="lattqe.safetensors"):
        load_lattqe(path, fingerprint="other@1")
    ex = EXPANDERS.get("lattqe")(embed_dim=16, checkpoint_dir=str(tmp_path), fingerprint="bb@abc")
    assert isinstance(ex, LAttQEExpander)
    with pytest.raises(ExpanderUnavailable):
        EXPANDERS.get("lattqe")(embed_dim=16, checkpoint_dir=str(tmp_path), fingerprint="other@1")
    with pytest.raises(ExpanderUnavailable):
        EXPANDERS.get("lattqe")(embed_dim=32, checkpoint_dir=str(tmp_path), fingerprint="bb@abc")
    path.write_bytes(path.read_bytes()[:100])  # damaged weights
    with pytest.raises(CheckpointError, match="lattqe.safetensors"):
        load_lattqe(path)


def test_bench_reports_latency_and_throughput():
    res = bench_expanders(dim=32, k=8, n_gallery=300, n_queries=10, batch=8)
    assert set(res) == {"aqe", "aqewd", "alpha-qe", "lattqe"}
    for r in res.values():
        assert r["expand_ms"] > 0 and r["batched_qps"] > 0
        assert r["added_ms"] == pytest.approx(r["expand_ms"] + r["second_search_ms"])


def test_knn_excludes_self():
    x, _ = clustered(n_classes=2, per_class=5, dim=4)
    _, ids = knn(x, x, 3, self_ids=np.arange(10))
    assert not np.any(ids == np.arange(10)[:, None])


# ----------------------------------------------------------------------------- real labelled data
def _fashion_mnist_or_skip():
    from engine.data import fashion_mnist

    if not fashion_mnist.available():
        pytest.skip("Fashion-MNIST IDX files not installed (Debian package dataset-fashion-mnist)")


def test_trained_lattqe_beats_no_expansion_on_held_out_fashion_mnist():
    """Short training on 7 Fashion-MNIST classes (pixels -> PCA 32, the stand-in embedding);
    mAP on the 3 held-out classes with LAttQE at nQE=32 must beat plain search."""
    _fashion_mnist_or_skip()
    from engine.train.lattqe import fashion_mnist_pca

    torch.set_num_threads(1)
    x, y, _ = fashion_mnist_pca(dim=32, per_class=200, seed=0)
    tr, va = ~np.isin(y, (7, 8, 9)), np.isin(y, (7, 8, 9))
    cfg = TrainConfig(epochs=2, queries_per_epoch=256, heads=4, layers=2, val_nqe=32, val_queries=150)
    model, hist = train_lattqe(x[tr], y[tr], x[va], y[va], cfg, progress=False)
    xv, yv = x[va], y[va]
    qids = np.arange(0, len(xv), 2)  # other queries than validation used
    none = qe_map("none", xv, yv, 32, qids)
    lattqe = qe_map("lattqe", xv, yv, 32, qids, model=model)
    assert lattqe > none + 0.005, (lattqe, none)


def test_trained_lattqe_beats_aqe_where_relevance_is_learnable():
    """LAttQE must beat plain AQE (and no expansion), not only no expansion, at nQE 32 and 64. Data: Fashion-MNIST
    classes 0-4 for training, 5 and 6 held out (validation picks the epoch; the mAP uses the other items as
    queries), PCA 32 fit on 0-4 only; 7-9 are not used. The held-out split of the test above (7-9) cannot
    carry this claim: there the neighbours' relevance is not predictable from the embeddings (docs/lattqe.md,
    "What the Fashion-MNIST stand-in can show")."""
    _fashion_mnist_or_skip()
    from engine.train.lattqe import fashion_mnist_pca

    torch.set_num_threads(1)
    x, y, _ = fashion_mnist_pca(dim=32, per_class=200, seed=0, val_classes=(5, 6, 7, 8, 9))
    tr, va = y <= 4, np.isin(y, (5, 6))
    cfg = TrainConfig(epochs=10, queries_per_epoch=1024, lr=1e-3, heads=4, layers=2, val_nqe=64, val_queries=150)
    model, _ = train_lattqe(x[tr], y[tr], x[va], y[va], cfg, progress=False)
    xv, yv = x[va], y[va]
    qids = np.setdiff1d(np.arange(len(xv)), validation_queries(len(xv), cfg))  # not the epoch-picking queries
    for nqe in (32, 64):
        none, aqe, lattqe = (qe_map(m, xv, yv, nqe, qids, model=model) for m in ("none", "aqe", "lattqe"))
        assert lattqe > max(aqe, none) + 0.005, (nqe, lattqe, aqe, none)


def test_cli_fashion_mnist_class_options_refuse_bad_lists():
    from engine.train.lattqe import main

    with pytest.raises(InputError, match="class numbers 0 to 9"):
        main(["--fashion-mnist", "--val-classes", "shoes"])
    with pytest.raises(InputError, match="some, not all"):
        main(["--fashion-mnist", "--classes", "7,8,9", "--val-classes", "7,8,9"])


def test_cli_trains_from_features_and_writes_checkpoint_and_report(tmp_path):
    from engine.train.lattqe import main

    x, y = clustered(n_classes=6, per_class=20, dim=16, noise=0.8, seed=2)
    feats = tmp_path / "f.npz"
    np.savez(feats, embeddings=x, labels=y, fingerprint=np.array("bb@cli"))
    rc = main(["--features", str(feats), "--out", str(tmp_path / "ck"), "--report", str(tmp_path / "rep"),
               "--epochs", "1", "--queries-per-epoch", "64", "--layers", "1", "--heads", "2", "--k-min", "4",
               "--k-max", "8", "--val-nqe", "8", "--eval-queries", "20", "--quiet", "--dropout", "0", "--nqe-list", "2,8"])
    assert rc == 0
    rec = json.loads((tmp_path / "ck" / "lattqe.json").read_text())
    assert rec["backbone_fingerprint"] == "bb@cli" and rec["best_epoch"] == 1 and len(rec["history"]) == 1
    assert set(rec["val_classes"]).isdisjoint(set(rec["train_classes"]))
    res = json.loads((tmp_path / "rep" / "lattqe_eval.json").read_text())
    assert "lattqe" in res["curves"] and "lattdba+lattqe" in res["curves"]
    for png in ("lattqe_map_vs_nqe.png", "lattqe_training.png"):
        assert (tmp_path / "rep" / png).read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ExpanderUnavailable):
        EXPANDERS.get("lattqe")(embed_dim=16, checkpoint_dir=str(tmp_path / "ck"), fingerprint="bb@other")
