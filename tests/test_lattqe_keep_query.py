"""LAttQE keeps the query when its neighbours do not help: non-negative weights, a weight floor chosen on
validation classes (never test), and floor 1 giving exactly the un-expanded query."""
import numpy as np
import pytest
import torch

from engine.expand.lattqe import LAttQEConfig, LAttQEModel, expand_numpy, floor_weights
from engine.train.lattqe import TrainConfig, choose_floor, qe_map, split_classes, train_lattqe, validation_queries


def _unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def test_floor_weights_formula():
    cos = torch.tensor([[0.9, 0.5, 0.2, -0.4]])
    assert torch.equal(floor_weights(cos, None), cos)  # older checkpoints: the paper's raw cosine
    np.testing.assert_allclose(floor_weights(cos, 0.0).numpy(), [[0.9, 0.5, 0.2, 0.0]])
    np.testing.assert_allclose(floor_weights(cos, 0.4).numpy(), [[0.5 / 0.6, 0.1 / 0.6, 0.0, 0.0]], atol=1e-6)
    assert not floor_weights(cos, 1.0).any()
    with pytest.raises(ValueError, match="weight_floor"):
        LAttQEConfig(dim=8, heads=2, weight_floor=1.5)


def test_floor_one_returns_the_query_itself():
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    model = LAttQEModel(LAttQEConfig(dim=16, layers=1, heads=2, dropout=0.0, weight_floor=1.0)).eval()
    q, nb = _unit(rng.standard_normal((3, 16))), _unit(rng.standard_normal((3, 5, 16)))
    out, w = expand_numpy(model, q, nb)
    np.testing.assert_allclose(out, q, atol=1e-6)
    assert not np.any(w)
    model.config.weight_floor = 0.0
    out, w = expand_numpy(model, q, nb)
    assert np.all(w >= 0) and np.any(w > 0) and not np.allclose(out, q, atol=1e-3)


def _classes(n_classes, per_class, dim, noise, seed):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_classes, dim))
    x = np.repeat(centres, per_class, 0) + noise * rng.standard_normal((n_classes * per_class, dim))
    return _unit(x), np.repeat(np.arange(n_classes), per_class)


def test_choose_floor_keeps_the_query_where_neighbours_mislead_and_expands_where_they_help():
    torch.set_num_threads(1)
    x, y = _classes(60, 8, 16, 0.7, seed=5)
    tr, va = split_classes(y, 0.3, seed=0)
    cfg = TrainConfig(epochs=4, queries_per_epoch=1024, lr=1e-3, layers=1, heads=2, k_min=8, k_max=16,
                      val_nqe=16, val_queries=100, pool_size=200, dropout=0.0)
    model, _ = train_lattqe(x[tr], y[tr], x[va], y[va], cfg, progress=False)
    assert model.config.weight_floor == 0.0  # trained with non-negative weights
    vq = validation_queries(int(va.sum()), cfg)
    vy = np.unique(y[va], return_inverse=True)[1]
    # validation classes with structure: the chosen floor is at least as good as no expansion, per nQE mean
    sel = choose_floor(model, x[va], y[va], cfg, nqes=(8, 16))
    by = {float(f): np.mean(v) for f, v in sel["val_map_by_floor"].items()}
    assert sel["weight_floor"] == model.config.weight_floor and by[sel["weight_floor"]] == max(by.values())
    assert by[1.0] == pytest.approx(qe_map("none", x[va], vy, 16, vq), abs=1e-6)  # floor 1 = no expansion
    # labels that carry no information about the embedding: expanding can only hurt on average, and a
    # floor that expands is chosen only when it measured at least as well as keeping the query
    rng = np.random.default_rng(1)
    y_noise = rng.permutation(y[va])
    noise = choose_floor(model, x[va], y_noise, cfg, nqes=(8, 16))
    nb = {float(f): np.mean(v) for f, v in noise["val_map_by_floor"].items()}
    assert nb[noise["weight_floor"]] >= nb[1.0]
    # a guard (e.g. composed retrieval on another validation set) restricts the floors that may be chosen:
    # the best of the allowed ones by the same validation figure, 1.0 when none is allowed
    allowed = [f for f in (0.6, 0.8) if f != sel["weight_floor"]]
    g = choose_floor(model, x[va], y[va], cfg, nqes=(8, 16), allowed=allowed)
    assert g["weight_floor"] == max(allowed, key=lambda f: (round(by[f], 6), f))
    assert choose_floor(model, x[va], y[va], cfg, nqes=(8, 16), allowed=[])["weight_floor"] == 1.0


def test_gallery_side_uses_its_own_floor():
    from engine.expand.dba import dba_vectors
    from engine.expand.lattqe import gallery_side

    rng = np.random.default_rng(3)
    x = _unit(rng.standard_normal((30, 16)))
    torch.manual_seed(0)
    model = LAttQEModel(LAttQEConfig(dim=16, layers=1, heads=2, dropout=0.0, weight_floor=1.0,
                                     dba_weight_floor=0.0)).eval()
    with gallery_side(model):
        assert model.config.weight_floor == 0.0
    assert model.config.weight_floor == 1.0  # restored
    g = dba_vectors(x, "lattqe", 5, model=model, progress=False)
    assert not np.allclose(g, x, atol=1e-3)  # the gallery side expands (floor 0) ...
    q, _ = expand_numpy(model, x[:3], np.stack([x[3:8]] * 3))
    np.testing.assert_allclose(q, x[:3], atol=1e-6)  # ... while the query side keeps the query (floor 1)
