"""RTIC composer: architecture (Table 6), gate, graph construction, losses, training, loaders, checkpoints."""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from PIL import Image

from engine.compose.base import COMPOSERS, ComposerUnavailable, Query
from engine.compose.rtic import (
    RTIC,
    RTICComposer,
    RTICConfig,
    count_parameters,
    load_rtic,
    load_rtic_composer,
    save_rtic,
)
from engine.data.cir_triplets import (
    LoadReport,
    Triplet,
    TripletSet,
    embed_triplets,
    index_triplets,
    join_fashioniq_captions,
    load_cirr,
    load_fashioniq,
    load_jsonl,
)
from engine.errors import CheckpointError, InputError
from engine.train.gcn_graph import GCNStream, build_graph, gcn_bce_loss, propagate
from engine.train.rtic.loop import _permutation
from engine.train.rtic import (
    TrainConfig,
    batch_hard_triplet_loss,
    dml_loss,
    evaluate_rtic,
    fit,
    grouped_permutation,
    main,
    negatives_mask,
    pair_loss,
    split_by_reference_group,
    synthetic_triplets,
    train_rtic,
)

torch.set_num_threads(1)


# -- architecture ---------------------------------------------------------------------------------------


# The paper's Table 6 (Appendix B) for D = 512, written out row by row with its numbers: (part, layer,
# input width, output width). Parameter counts below come from these rows alone, not from the model code.
TABLE6_D512 = [
    ("fusion", "BatchNorm", 1024, 1024), ("fusion", "LeakyReLU", 1024, 1024), ("fusion", "Linear", 1024, 512),
    *[row for _ in range(4) for row in (
        ("block", "Linear", 512, 256), ("block", "BatchNorm", 256, 256), ("block", "LeakyReLU", 256, 256),
        ("block", "Linear", 256, 256), ("block", "BatchNorm", 256, 256), ("block", "LeakyReLU", 256, 256),
        ("block", "Linear", 256, 512))],
    ("gate", "Linear", 512, 512), ("gate", "BatchNorm", 512, 512), ("gate", "LeakyReLU", 512, 512),
    ("gate", "Linear", 512, 512), ("gate", "Sigmoid", 512, 512),
]
_TORCH = {"Linear": nn.Linear, "BatchNorm": nn.BatchNorm1d, "LeakyReLU": nn.LeakyReLU, "Sigmoid": nn.Sigmoid}


def _table_params(part=None) -> int:
    """Trainable parameters of Table 6's rows: Linear i*o weights + o biases, BatchNorm a scale and a shift per
    channel, activations none."""
    per = {"Linear": lambda i, o: i * o + o, "BatchNorm": lambda i, o: 2 * o}
    return sum(per.get(layer, lambda i, o: 0)(i, o) for p, layer, i, o in TABLE6_D512 if part in (None, p))


def test_parameter_count_matches_table6_for_512():
    model = RTIC(RTICConfig(dim=512))
    assert _table_params() == 2_372_096  # the figure docs/rtic.md quotes
    assert count_parameters(model) == _table_params()
    assert count_parameters(model.fusion) == _table_params("fusion")
    assert sum(count_parameters(b) for b in model.blocks) == _table_params("block")
    assert count_parameters(model.gate) == _table_params("gate")
    # no gate / fewer blocks change the count by exactly those parts of the table
    assert count_parameters(RTIC(RTICConfig(dim=512, gating=False))) == _table_params() - _table_params("gate")
    assert count_parameters(RTIC(RTICConfig(dim=512, n_blocks=2))) == _table_params() - _table_params("block") // 2


def _layers(part: str, modules):
    """The model's layers of one part as Table 6 rows (activations carry the width of what they follow)."""
    rows, width = [], None
    for m in modules:
        if isinstance(m, nn.Linear):
            rows.append((part, "Linear", m.in_features, m.out_features))
            width = m.out_features
        elif isinstance(m, nn.BatchNorm1d):
            rows.append((part, "BatchNorm", m.num_features, m.num_features))
            width = m.num_features
        else:
            name = next(k for k, t in _TORCH.items() if isinstance(m, t))
            rows.append((part, name, width, width))
    return rows


def test_module_structure_matches_table6():
    model = RTIC(RTICConfig(dim=512))
    f = model.fusion
    got = _layers("fusion", [f.bn, f.act, f.fc])
    for b in model.blocks:
        got += _layers("block", b.net)
    got += _layers("gate", model.gate.net)
    assert got == TABLE6_D512


def _manual_forward(model: RTIC, img, txt, inner_skip=True):
    x = model.fusion.fc(model.fusion.act(model.fusion.bn(torch.cat([txt, img], 1))))
    h = x
    for b in model.blocks:
        h = h + b.net(h) if inner_skip else b.net(h)
    return x, h


def test_forward_follows_the_equations_and_ablation_switches():
    torch.manual_seed(0)
    img, txt = torch.randn(6, 8), torch.randn(6, 8)
    model = RTIC(RTICConfig(dim=8)).eval()
    x, h = _manual_forward(model, img, txt)
    s = model.gate.net(x)
    assert torch.allclose(model(img, txt), (1 - s) * h + s * img, atol=1e-6)

    no_skip = RTIC(RTICConfig(dim=8, inner_skip=False)).eval()
    _, h2 = _manual_forward(no_skip, img, txt, inner_skip=False)
    assert torch.allclose(no_skip(img, txt), (1 - no_skip.gate.net(_manual_forward(no_skip, img, txt)[0])) * h2
                          + no_skip.gate.net(_manual_forward(no_skip, img, txt)[0]) * img, atol=1e-6)

    no_gate = RTIC(RTICConfig(dim=8, gating=False)).eval()
    assert no_gate.gate is None
    _, h3 = _manual_forward(no_gate, img, txt)
    out, s3 = no_gate.compose(img, txt)
    assert s3 is None and torch.allclose(out, h3, atol=1e-6)


def test_gate_one_returns_reference_exactly():
    torch.manual_seed(1)
    v, h = torch.randn(4, 16), torch.randn(4, 16)
    assert torch.equal(RTIC.mix(h, v, torch.ones(4, 16)), v)
    assert torch.equal(RTIC.mix(h, v, torch.zeros(4, 16)), h)
    # drive the real gate to s = 1: last linear -> zero weights, huge bias
    model = RTIC(RTICConfig(dim=16)).eval()
    last = model.gate.net[3]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(1e4)
    img, txt = torch.randn(5, 16), torch.randn(5, 16)
    out, s = model.compose(img, txt)
    assert torch.equal(s, torch.ones_like(s))
    assert torch.equal(out, img)


def test_image_projection_keeps_raw_reference_in_the_skip():
    model = RTIC(RTICConfig(dim=8, image_proj=True, text_proj=True)).eval()
    with torch.no_grad():
        model.image_proj.weight.mul_(3.0)
        model.gate.net[3].weight.zero_()
        model.gate.net[3].bias.fill_(1e4)
    img = torch.randn(3, 8)
    assert torch.equal(model(img, torch.randn(3, 8)), img)


# -- graph -------------------------------------------------------------------------------------------------


def _unit(deg):
    r = math.radians(deg)
    return [math.cos(r), math.sin(r)]


def test_graph_small_hand_case():
    # angles 0, 10, 90, 105 degrees: largest off-diagonal similarity is cos(10) (pair 0-1), then cos(15)
    feats = torch.tensor([_unit(0), _unit(10), _unit(90), _unit(105)])
    # k = round(0.15 * 16) = 2 ordered edges -> tau = cos(10 deg), only 0-1 and 1-0 survive
    g = build_graph(feats, density=0.15, p=0.33, block=3)
    assert g.tau == pytest.approx(math.cos(math.radians(10)), abs=1e-6)
    assert g.degree.tolist() == [1, 1, 0, 0]
    a_bin = g.binary_rows(torch.arange(4))
    expected_bin = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]])
    assert torch.equal(a_bin, expected_bin)
    # re-weighting: self 1, neighbour 0.33 / 1; row sums d = [1.33, 1.33, 1, 1]; Â = D^-1/2 A' D^-1/2
    expected = torch.tensor(
        [
            [1 / 1.33, 0.33 / 1.33, 0, 0],
            [0.33 / 1.33, 1 / 1.33, 0, 0],
            [0, 0, 1, 0],
            [0, 0, 0, 1],
        ]
    )
    assert torch.allclose(g.to_dense(), expected, atol=1e-6)

    # k = round(0.3 * 16) = 5 ordered edges: 0-1, 2-3 (4) and the 5th is cos(80) (1-2), tied with 2-1 -> 6 edges
    g2 = build_graph(feats, density=0.3, p=0.33)
    assert g2.tau == pytest.approx(math.cos(math.radians(80)), abs=1e-6)
    assert g2.degree.tolist() == [1, 2, 2, 1]
    # row 1 has neighbours 0 and 2: weights 0.33/2 each; d = 1 + 0.33 for every row
    a_hat = g2.to_dense()
    assert a_hat[1, 0] == pytest.approx(0.165 / 1.33, abs=1e-6)
    assert a_hat[0, 1] == pytest.approx(0.33 / 1.33, abs=1e-6)
    assert a_hat[1, 1] == pytest.approx(1 / 1.33, abs=1e-6)


def _graph_by_hand(feats: np.ndarray, density: float, p: float):
    f = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    c = f @ f.T
    n = len(f)
    off = np.sort(c[~np.eye(n, dtype=bool)])[::-1]
    tau = off[int(round(density * n * n)) - 1]
    a = (c >= tau).astype(np.float64)
    np.fill_diagonal(a, 0)
    deg = a.sum(1)
    aw = np.where(deg[:, None] > 0, p * a / np.maximum(deg, 1)[:, None], 0)
    np.fill_diagonal(aw, 1)
    d = aw.sum(1)
    return a, tau, aw / np.sqrt(d[:, None] * d[None, :])


def test_graph_random_case_density_symmetry_normalisation():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(150, 12)) + 2 * rng.normal(size=(6, 12))[rng.integers(0, 6, 150)]
    g = build_graph(torch.tensor(feats, dtype=torch.float32), density=0.15, p=0.33, block=40, bins=256)
    a, tau, a_hat = _graph_by_hand(feats, 0.15, 0.33)
    assert g.tau == pytest.approx(tau, abs=1e-5)
    bin_rows = g.binary_rows(torch.arange(150)).numpy()
    np.testing.assert_array_equal(bin_rows - np.eye(150), a)
    np.testing.assert_array_equal(bin_rows, bin_rows.T)  # symmetric
    assert abs(g.mean_degree / 150 - 0.15) < 2 / 150  # density close to 15 %
    np.testing.assert_allclose(g.to_dense().numpy(), a_hat, atol=1e-6)
    assert g.col.dtype == torch.int32 and g.values.dtype == torch.float32  # compact sparse storage
    np.testing.assert_allclose(g.propagation_transposed().to_dense().numpy(), a_hat.T, atol=1e-6)
    # the custom backward (Âᵀ G) gives the same gradient as the dense product
    x = torch.randn(150, 5, requires_grad=True)
    w = torch.randn(150, 5)
    (propagate(g.propagation(), x, g.propagation_transposed()) * w).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), a_hat.T @ w.numpy(), atol=1e-5)
    assert g.nbytes() < 150 * 150 * 4 / 2 * 1.5


# -- losses ------------------------------------------------------------------------------------------------


def test_dml_loss_matches_direct_computation():
    torch.manual_seed(2)
    comp, tgt, scale = torch.randn(5, 7), torch.randn(5, 7), torch.tensor(3.5)
    total = 0.0
    for i in range(5):
        ci = comp[i] / comp[i].norm()
        sims = [float(scale * ci @ (tgt[j] / tgt[j].norm())) for j in range(5)]
        total += -sims[i] + math.log(sum(math.exp(s) for s in sims))
    assert float(dml_loss(comp, tgt, scale)) == pytest.approx(total / 5, rel=1e-5)
    # a masked column is removed from row i's denominator
    mask = torch.zeros(5, 5, dtype=torch.bool)
    mask[0, 3] = True
    c0 = comp[0] / comp[0].norm()
    s0 = [float(scale * c0 @ (tgt[j] / tgt[j].norm())) for j in range(5)]
    row0 = -s0[0] + math.log(sum(math.exp(s0[j]) for j in range(5) if j != 3))
    per_row = torch.nn.functional.cross_entropy(
        (scale * torch.nn.functional.normalize(comp, dim=1) @ torch.nn.functional.normalize(tgt, dim=1).T)
        .masked_fill(mask, float("-inf")), torch.arange(5), reduction="none")
    assert float(per_row[0]) == pytest.approx(row0, rel=1e-5)
    assert float(dml_loss(comp, tgt, scale, mask)) == pytest.approx(float(per_row.mean()), rel=1e-6)


def test_cosine_term_adds_the_mean_distance_to_the_targets():
    torch.manual_seed(5)
    model = RTIC(RTICConfig(dim=6)).requires_grad_(False)
    comp, tgt = torch.randn(4, 6), torch.randn(4, 6)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    plain = float(pair_loss(model, comp, tgt, mask, TrainConfig()))
    assert plain == pytest.approx(float(dml_loss(comp, tgt, model.logit_scale, mask)), rel=1e-6)
    dist = sum(1 - float(comp[i] @ tgt[i] / (comp[i].norm() * tgt[i].norm())) for i in range(4)) / 4
    with_cos = float(pair_loss(model, comp, tgt, mask, TrainConfig(cos_weight=0.3)))
    assert with_cos == pytest.approx(plain + 0.3 * dist, rel=1e-5)
    # the term is zero for outputs on their targets' directions, whatever their length
    assert float(pair_loss(model, 2 * tgt, tgt, mask, TrainConfig(cos_weight=5.0))) == pytest.approx(
        float(dml_loss(2 * tgt, tgt, model.logit_scale, mask)), abs=1e-5)


def test_negatives_mask_and_batch_hard_triplet():
    tgt = torch.tensor([0, 1, 0, 2])
    q = torch.tensor([0, 1, 2, 1])
    m = negatives_mask(tgt, q)
    expected = torch.zeros(4, 4, dtype=torch.bool)
    expected[0, 2] = expected[2, 0] = True  # same target
    expected[1, 3] = expected[3, 1] = True  # same query
    assert torch.equal(m, expected)
    torch.manual_seed(3)
    comp, t = torch.randn(4, 6), torch.randn(4, 6)
    cn, tn = comp / comp.norm(dim=1, keepdim=True), t / t.norm(dim=1, keepdim=True)
    total = 0.0
    for i in range(4):
        d = [1 - float(cn[i] @ tn[j]) for j in range(4)]
        hardest = min(d[j] for j in range(4) if j != i)
        total += max(0.0, 0.3 + d[i] - hardest)
    assert float(batch_hard_triplet_loss(comp, t, 0.3)) == pytest.approx(total / 4, rel=1e-5)


def test_gcn_stream_shapes_and_bce():
    torch.manual_seed(4)
    cfg = RTICConfig(dim=8)
    feats = torch.randn(12, 8)
    g = build_graph(feats, density=0.2)
    stream = GCNStream(RTIC(cfg), 8, layers=2)
    w = stream(torch.randn(12, 8), torch.randn(12, 8), g.propagation())
    assert w.shape == (12, 8)
    out = torch.randn(3, 8, requires_grad=True)
    rows = g.binary_rows(torch.tensor([0, 5, 7]))
    loss = gcn_bce_loss(out, w, rows)
    logits = out @ w.T
    direct = -(rows * torch.log(torch.sigmoid(logits)) + (1 - rows) * torch.log(1 - torch.sigmoid(logits))).mean()
    assert loss.item() == pytest.approx(direct.item(), rel=1e-5)
    loss.backward()
    assert out.grad is not None and all(p.grad is not None for p in stream.layers.parameters())


# -- training ----------------------------------------------------------------------------------------------


def _small_synthetic():
    data = synthetic_triplets(n_objects=24, n_attributes=4, dim=16, seed=0)
    return split_by_reference_group(data, data.ref // 4, held_out=0.25, seed=0)


def test_training_lowers_loss_and_beats_baselines():
    train, test = _small_synthetic()
    cfg = TrainConfig(epochs=10, batch_size=32, lr=3e-3, gcn=True)
    result = train_rtic(train, RTICConfig(dim=16), cfg, progress=False)
    for name in ("rtic", "rtic+gcn"):
        hist = result["history"][name]
        assert hist[-1]["pair"] < 0.6 * hist[0]["pair"], name
    gcn_hist = result["history"]["rtic+gcn"]
    assert gcn_hist[-1]["gcn"] < gcn_hist[0]["gcn"]  # the BCE of the GCN stream goes down too
    assert gcn_hist[0]["gcn"] > 0 and result["history"]["rtic"][0]["gcn"] == 0
    assert abs(result["graph"]["mean_degree_fraction"] - 0.15) < 0.02
    metrics = evaluate_rtic(test, result["models"])
    # held-out objects: learned composers beat every training-free baseline at R@1
    for name in ("rtic", "rtic+gcn"):
        assert metrics[name]["R@1"] > max(metrics[b]["R@1"] for b in ("image", "text", "sum")) + 20, metrics


def test_triplet_loss_option_and_sgd_schedule():
    train, _ = _small_synthetic()
    cfg = TrainConfig(epochs=4, batch_size=32, optimizer="sgd", lr=0.05, step_every=2, loss="triplet")
    model = RTIC(RTICConfig(dim=16))
    hist = fit(model, train, cfg, progress=False)
    assert hist[-1]["loss"] < hist[0]["loss"]
    assert [h["lr"] for h in hist] == pytest.approx([0.05, 0.05 / math.sqrt(2), 0.05 / math.sqrt(2), 0.025])
    assert not model.training  # left in eval mode


@pytest.mark.parametrize("grouped", ["", "reference", "photo"])
def test_resume_continues_exactly(tmp_path, grouped):
    train, _ = _small_synthetic()
    if grouped == "photo":  # two references per photo
        train = TripletSet(train.images, train.texts, train.ref, train.text, train.tgt, train.query, photo=train.ref // 2)
    groups = {"group_by_reference": grouped == "reference", "group_by_photo": grouped == "photo"}
    cfg = TrainConfig(epochs=3, batch_size=32, **groups)
    torch.manual_seed(0)
    straight = RTIC(RTICConfig(dim=16))
    start_state = {k: v.clone() for k, v in straight.state_dict().items()}
    h_straight = fit(straight, train, cfg, progress=False)
    part = RTIC(RTICConfig(dim=16))
    part.load_state_dict(start_state)
    state = tmp_path / "state.pt"
    fit(part, train, TrainConfig(epochs=1, batch_size=32, **groups), state_path=state,
        fingerprint="fp", progress=False)
    resumed = RTIC(RTICConfig(dim=16))
    h_resumed = fit(resumed, train, cfg, state_path=state, resume=True, fingerprint="fp", progress=False)
    assert len(h_resumed) == 3
    assert [h["loss"] for h in h_resumed] == pytest.approx([h["loss"] for h in h_straight], rel=1e-5)
    with pytest.raises(CheckpointError, match="state.pt"):
        fit(RTIC(RTICConfig(dim=16)), train, cfg, state_path=state, resume=True, fingerprint="other", progress=False)


def test_grouped_permutation_keeps_each_reference_together_in_a_random_order():
    """--group-by-reference: every row once, the rows of one reference image adjacent (so a batch holds that
    photo's other edits as negatives), references and rows shuffled by the generator, the same for one seed."""
    ref = torch.tensor([3, 1, 3, 2, 1, 3, 0, 2, 2, 1, 0, 3])
    perm = grouped_permutation(ref, torch.Generator().manual_seed(0))
    assert sorted(perm.tolist()) == list(range(len(ref)))
    assert sorted(ref[perm].unique_consecutive().tolist()) == [0, 1, 2, 3]  # each reference one run of adjacent rows
    again = grouped_permutation(ref, torch.Generator().manual_seed(0))
    assert torch.equal(perm, again)
    orders = {tuple(grouped_permutation(ref, torch.Generator().manual_seed(s)).tolist()) for s in range(20)}
    assert len(orders) > 10
    assert {tuple(ref[torch.tensor(o)].unique_consecutive().tolist()) for o in orders} != {(0, 1, 2, 3)}


def test_rows_name_their_source_photo_and_photo_batches_keep_it_together():
    """--group-by-photo: a row's photo is the one its triplet names (an open-vocabulary photo and its edited
    versions), else its reference image; the epoch order keeps each photo's rows adjacent."""
    trips = [Triplet("a", "p1.png", "at night", ["p1-night.png"], {"photo": "p1"}),
             Triplet("b", "p1-night.png", "back to day", ["p1.png"], {"photo": "p1"}),
             Triplet("c", "p1.png", "a dog instead", ["d1.png", "d2.png"], {"photo": "p1"}),
             Triplet("d", "p2.png", "in sepia", ["p2-sepia.png"]),
             Triplet("e", "p2.png", "at night", ["p2-night.png"]),
             Triplet("f", "p1.png", "in red", ["p1-red.png"])]   # no photo named: its reference stands for it
    _, _, rows = index_triplets(trips)
    assert rows["photo"].tolist() == [0, 0, 0, 0, 1, 1, 2]
    assert rows["ref"].tolist() == [0, 1, 0, 0, 4, 4, 0]
    data = TripletSet(torch.eye(12), torch.eye(6), rows["ref"], rows["text"], rows["tgt"], rows["query"],
                      photo=rows["photo"])
    assert data.subset(torch.tensor([6, 1])).photos.tolist() == [2, 0]
    plain = TripletSet(data.images, data.texts, data.ref, data.text, data.tgt, data.query)
    assert torch.equal(plain.photos, plain.ref) and plain.subset(torch.tensor([4])).photo is None
    for seed in range(10):
        perm = _permutation(data, TrainConfig(group_by_photo=True), torch.Generator().manual_seed(seed))
        assert sorted(perm.tolist()) == list(range(7))
        assert sorted(data.photos[perm].unique_consecutive().tolist()) == [0, 1, 2]
    by_ref = [_permutation(data, TrainConfig(group_by_reference=True), torch.Generator().manual_seed(s)) for s in range(30)]
    assert any(len(data.photos[p].unique_consecutive()) > 3 for p in by_ref)  # references alone split photo 0


def test_evaluate_rtic_on_a_hand_case():
    # 3 gallery images on axes; query 0: ref e0, text e1 -> target 1; query 1: ref e2, text e0 -> target 0
    images = torch.eye(3)
    texts = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    data = TripletSet(images, texts, torch.tensor([0, 2]), torch.tensor([0, 1]), torch.tensor([1, 0]),
                      torch.tensor([0, 1]))
    m = evaluate_rtic(data, ks=(1, 2))
    # image only: reference is excluded, remaining ties are broken arbitrarily -> R@2 = 100 for both
    assert m["image"]["R@2"] == 100.0
    assert m["text"] == {"R@1": 100.0, "R@2": 100.0}
    # sum: 0.5*e0 + 0.5*e1 -> after removing ref e0, target e1 is first
    assert m["sum"]["R@1"] == 100.0
    # a gallery distractor closer to the text query pushes query 0's target to rank 2
    # (text 0 = (0, 1, 0.1) scores 0.995 with image 1 but 0.9997 with image 3 = (0, 1, 0.2) / norm)
    images4 = torch.cat([torch.eye(3), torch.tensor([[0.0, 1.0, 0.2]]) / math.sqrt(1.04)])
    texts2 = torch.tensor([[0.0, 1.0, 0.1], [1.0, 0.0, 0.0]])
    data2 = TripletSet(images4, texts2, data.ref, data.text, data.tgt, data.query, gallery=torch.tensor([3]))
    m2 = evaluate_rtic(data2, ks=(1, 2))
    assert m2["text"] == {"R@1": 50.0, "R@2": 100.0}
    assert evaluate_rtic(data2, ks=(1,), gallery_ids=torch.tensor([0]))["text"]["R@1"] == 100.0


# -- loaders -----------------------------------------------------------------------------------------------


def _png(path, colour):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), colour).save(path)


def test_fashioniq_loader_official_format(tmp_path):
    root = tmp_path / "fashionIQ"
    for name, c in [("B001", "red"), ("B002", "blue"), ("B003", "green")]:
        _png(root / "images" / f"{name}.png", c)
    (root / "captions").mkdir()
    (root / "captions" / "cap.dress.train.json").write_text(json.dumps([
        {"target": "B002", "candidate": "B001", "captions": ["Is blue.", "has shorter sleeves"]},
        {"target": "B003", "candidate": "B002", "captions": ["is green and longer", "Is more flowy?"]},
        {"target": "B999", "candidate": "B001", "captions": ["missing", "image"]},
    ]))
    (root / "captions" / "cap.shirt.train.json").write_text(json.dumps([
        {"target": "B001", "candidate": "B003", "captions": ["is red", "has a collar"]},
    ]))
    report = LoadReport()
    trips = load_fashioniq(root, "train", ["dress", "shirt"], report=report)
    assert len(trips) == 3 and report.missing_images == 1 and report.missing_examples == ["B999"]
    assert trips[0].text == "Is blue and has shorter sleeves"
    assert trips[1].text == "is green and longer and is more flowy"
    assert trips[0].reference.endswith("B001.png") and trips[0].targets[0].endswith("B002.png")
    assert trips[2].meta["category"] == "shirt"
    both = load_fashioniq(root, "train", ["dress"], both_orders=True)
    assert [t.text for t in both[:2]] == ["Is blue and has shorter sleeves", "has shorter sleeves and is blue"]
    assert join_fashioniq_captions("", "Red") == "red"
    with pytest.raises(InputError, match="cap.toptee.train.json"):
        load_fashioniq(root, "train", ["toptee"])


def test_cirr_loader_official_format(tmp_path):
    root = tmp_path / "CIRR"
    names = {"train-1-0-img0": "./train/0/train-1-0-img0.png", "train-1-0-img1": "./train/0/train-1-0-img1.png",
             "train-2-1-img0": "./train/1/train-2-1-img0.png"}
    for i, rel in enumerate(names.values()):
        _png(root / rel, (40 * i, 10, 10))
    (root / "cirr" / "captions").mkdir(parents=True)
    (root / "cirr" / "image_splits").mkdir(parents=True)
    (root / "cirr" / "image_splits" / "split.rc2.train.json").write_text(json.dumps(names))
    (root / "cirr" / "captions" / "cap.rc2.train.json").write_text(json.dumps([
        {"pairid": 12063, "reference": "train-1-0-img0", "target_hard": "train-1-0-img1",
         "target_soft": {"train-1-0-img1": 1.0}, "caption": " Same dog but lying on grass ",
         "img_set": {"id": 3, "members": ["train-1-0-img0", "train-1-0-img1", "train-2-1-img0"],
                     "reference_rank": 0, "target_rank": 1}},
        {"pairid": 7, "reference": "train-2-1-img0", "target_hard": "train-9-9-img9",
         "target_soft": {}, "caption": "missing target", "img_set": {"id": 4, "members": []}},
    ]))
    report = LoadReport()
    trips = load_cirr(root, "train", report=report)
    assert len(trips) == 1 and report.missing_images == 1
    t = trips[0]
    assert t.query_id == "12063" and t.text == "Same dog but lying on grass"
    assert t.reference.endswith("train-1-0-img0.png") and t.targets[0].endswith("train-1-0-img1.png")
    assert len(t.meta["subset"]) == 3
    assert len(load_cirr(root, "train", skip_missing=False)) == 2


def test_jsonl_loader_and_cached_embedding(tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cis-cache"))  # shared feature cache goes here
    for n, c in [("a.png", "red"), ("b.png", "blue"), ("c.png", "green")]:
        _png(tmp_path / "img" / n, c)
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"reference": "a.png", "text": "make it blue", "target": "b.png"},
        {"reference": "a.png", "caption": "make it green", "targets": ["c.png", "b.png"], "kind": "x"},
    ]) + "\n")
    trips = load_jsonl(f, tmp_path / "img")
    assert len(trips) == 2 and trips[1].targets[0].endswith("c.png") and trips[1].meta == {"kind": "x"}
    bb = FakeBackbone(dim=6)
    data = embed_triplets(bb, trips, cache_dir=tmp_path / "cache", progress=False)
    assert len(data) == 3  # one row per target
    assert data.images.shape == (3, 6) and data.texts.shape == (2, 6)
    assert data.query.tolist() == [0, 1, 1]
    again = embed_triplets(bb, trips, cache_dir=tmp_path / "cache", progress=False)
    assert torch.equal(again.images, data.images) and bb.image_calls == 1  # second call from the cache
    # training cap: one row per query; a gallery image joins the image table and the gallery ids
    _png(tmp_path / "img" / "d.png", "yellow")
    capped = embed_triplets(bb, trips, cache_dir=tmp_path / "cache", progress=False, max_targets=1,
                            gallery=[str(tmp_path / "img" / "d.png")])
    assert len(capped) == 2 and len(capped.gallery) == 1
    assert capped.image_keys[int(capped.gallery[0])].endswith("d.png")
    assert capped.images.shape[0] == len(capped.image_keys)
    assert capped.image_keys[int(capped.tgt[1])] in trips[1].targets
    (tmp_path / "bad.jsonl").write_text('{"reference": "a.png"}\n')
    with pytest.raises(InputError, match="bad.jsonl line 1"):
        load_jsonl(tmp_path / "bad.jsonl")


# -- composer + checkpoints ------------------------------------------------------------------------------


class FakeBackbone:
    """Deterministic stand-in: texts hash to unit vectors, images = mean colour padded."""

    def __init__(self, dim=16, tag="a"):
        self.name, self.embed_dim, self._tag, self.image_calls = f"fake-{tag}", dim, tag, 0

    @property
    def fingerprint(self):
        return f"{self.name}@{self._tag}"

    def encode_texts(self, texts):
        from engine.backbones.base import TextEncoding

        vecs = []
        for t in texts:
            seed = int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)
            v = torch.randn(self.embed_dim, generator=torch.Generator().manual_seed(seed))
            vecs.append(v / v.norm())
        return TextEncoding(torch.stack(vecs), [])

    def preprocess(self, image):
        arr = torch.tensor(np.asarray(image.convert("RGB"), dtype=np.float32)).mean((0, 1)) / 255.0
        return arr

    def encode_images(self, pixels):
        self.image_calls += 1
        out = torch.zeros(len(pixels), self.embed_dim)
        out[:, :3] = pixels + 0.1
        return out / out.norm(dim=1, keepdim=True)


def test_checkpoint_roundtrip_and_composer(tmp_path):
    bb = FakeBackbone(dim=16)
    with pytest.raises(ComposerUnavailable, match="no RTIC checkpoint for fake-a"):
        COMPOSERS.get("rtic")(bb, checkpoint_dir=tmp_path)
    torch.manual_seed(5)
    model = RTIC(RTICConfig(dim=16))
    model.train()
    model(torch.randn(8, 16), torch.randn(8, 16))  # move BatchNorm running stats away from init
    model.eval()
    save_rtic(tmp_path / "rtic-fake-a.safetensors", model, bb.fingerprint, bb.name, variant="rtic")
    assert json.loads((tmp_path / "rtic-fake-a.json").read_text())["config"]["dim"] == 16
    loaded, record = load_rtic(tmp_path / "rtic-fake-a.safetensors", bb.fingerprint)
    x, t = torch.randn(3, 16), torch.randn(3, 16)
    assert torch.equal(loaded(x, t), model(x, t)) and not loaded.training
    with pytest.raises(CheckpointError, match="rtic-fake-a.safetensors"):
        load_rtic(tmp_path / "rtic-fake-a.safetensors", "other@fp")
    (tmp_path / "rtic-broken.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="rtic-broken.safetensors"):
        load_rtic(tmp_path / "rtic-broken.safetensors")
    # another backbone finds nothing; the right one gets the composer
    with pytest.raises(ComposerUnavailable):
        COMPOSERS.get("rtic")(FakeBackbone(dim=16, tag="b"), checkpoint_dir=tmp_path)
    composer = COMPOSERS.get("rtic")(bb, checkpoint_dir=tmp_path)
    assert isinstance(composer, RTICComposer)
    img = torch.nn.functional.normalize(torch.randn(16), dim=0)
    q = Query(text="make it blue", image_embedding=img, has_image=True)
    comp = composer.compose(q)
    text = bb.encode_texts(["make it blue"]).embeddings
    direct = model(img[None], text)[0].detach()
    np.testing.assert_allclose(comp.vector, (direct / direct.norm()).numpy(), atol=1e-6)
    assert comp.vector.dtype == np.float32 and abs(np.linalg.norm(comp.vector) - 1) < 1e-5
    s = model.compose(img[None], text)[1].detach()
    assert comp.explanation["gate_mean"] == pytest.approx(float(s.mean()), abs=1e-6)
    chans = comp.explanation["top_changed_channels"]
    delta = np.abs(comp.vector - img.numpy())
    assert chans[0]["channel"] == int(delta.argmax()) and len(chans) == 5
    # no text: nothing to correct, so the training-free prior (the image alone here), saying so
    alone = composer.compose(Query(text="", image_embedding=img, has_image=True))
    np.testing.assert_allclose(alone.vector, (img / img.norm()).numpy(), atol=1e-6)
    assert "prior_only" in alone.explanation and alone.explanation["trust"] == 0.0
    # plain RTIC is the default when both exist (never chosen by test numbers); an explicit variant picks one
    save_rtic(tmp_path / "rtic-gcn-fake-a.safetensors", model, bb.fingerprint, bb.name, variant="rtic+gcn")
    assert load_rtic_composer(bb, tmp_path).record["part"] == "rtic"
    assert load_rtic_composer(bb, tmp_path, variant="rtic").record["file"] == "rtic-fake-a.safetensors"
    # the rule is the variant (plain first), not stored test-split figures nor the file name: here the GCN
    # checkpoint has the better held-out R@10 and the earlier name, and plain RTIC is still the one loaded
    other = tmp_path / "rule"
    save_rtic(other / "rtic-b-fake-a.safetensors", model, bb.fingerprint, bb.name,
              {"variant": "rtic", "held_out": {"R@10": 40.0}})
    save_rtic(other / "rtic-a-fake-a.safetensors", model, bb.fingerprint, bb.name,
              {"variant": "rtic+gcn", "held_out": {"R@10": 70.0}})
    chosen = load_rtic_composer(bb, other).record
    assert (chosen["part"], chosen["file"]) == ("rtic", "rtic-b-fake-a.safetensors")
    assert load_rtic_composer(bb, other, variant="rtic+gcn").record["file"] == "rtic-a-fake-a.safetensors"


def test_cli_synthetic_run_writes_checkpoints_and_report(tmp_path):
    rc = main(["--data", "synthetic", "--synthetic-dim", "16", "--synthetic-objects", "16", "--epochs", "2", "--gcn", "--quiet",
               "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "ckpt"),
               "--report", str(tmp_path / "report.json")])
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["held_out"]) == {"image", "text", "sum", "rtic", "rtic+gcn"}
    assert len(report["history"]["rtic+gcn"]) == 2
    files = sorted(p.name for p in (tmp_path / "ckpt").glob("*.safetensors"))
    assert files == ["rtic-gcn-synthetic.safetensors", "rtic-synthetic.safetensors"]
    _, record = load_rtic(tmp_path / "ckpt" / files[0], "synthetic@16-0")
    assert record["part"] == "rtic+gcn" and record["graph"]["nodes"] == report["train_triplets"]
    # the sidecar names the split its held-out figures come from (validation for a shipped run)
    assert record["eval_split"] == "test" and record["held_out"] == report["held_out"]["rtic+gcn"]


# ----------------------------------------------------------------------------- faithfulness (issue #18)
def _authors_block_from_the_paper(p: dict, v: torch.Tensor, t: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Independent functional RTIC forward, written from the paper's description (Appendix B) with the
    authors' activation, ``F.leaky_relu`` at PyTorch's default slope 0.01, and their concatenation
    order (image, then text). Eval-mode batch norm; ``p`` holds plain tensors."""
    import torch.nn.functional as Fn

    def bn(x, name):
        return Fn.batch_norm(x, p[name + ".rm"], p[name + ".rv"], p[name + ".w"], p[name + ".b"], False, 0.0, 1e-5)

    def act(x):
        return Fn.leaky_relu(x)  # default negative_slope = 0.01

    x = Fn.linear(act(bn(torch.cat([v, t], 1), "f.bn")), p["f.fc.w"], p["f.fc.b"])
    h = x
    for k in range(n_blocks):
        e = Fn.linear(h, p[f"e{k}.0.w"], p[f"e{k}.0.b"])
        e = act(bn(e, f"e{k}.1"))
        e = act(bn(Fn.linear(e, p[f"e{k}.3.w"], p[f"e{k}.3.b"]), f"e{k}.4"))
        h = h + Fn.linear(e, p[f"e{k}.6.w"], p[f"e{k}.6.b"])
    g = torch.sigmoid(Fn.linear(act(bn(Fn.linear(x, p["g.0.w"], p["g.0.b"]), "g.1")), p["g.3.w"], p["g.3.b"]))
    return (1 - g) * h + g * v


def _port_weights(model: RTIC, d: int) -> dict:
    """The project's parameters in the reference's layout (its fusion sees (image, text), ours (text, image))."""
    swap = torch.cat([torch.arange(d, 2 * d), torch.arange(0, d)])  # reference column j <- our column swap[j]
    p = {}

    def put_bn(name, m, perm=None):
        sel = (lambda x: x[perm]) if perm is not None else (lambda x: x)
        p.update({name + ".w": sel(m.weight), name + ".b": sel(m.bias), name + ".rm": sel(m.running_mean),
                  name + ".rv": sel(m.running_var)})

    put_bn("f.bn", model.fusion.bn, swap)
    p["f.fc.w"], p["f.fc.b"] = model.fusion.fc.weight[:, swap], model.fusion.fc.bias
    for k, blk in enumerate(model.blocks):
        for i in (0, 3, 6):
            p[f"e{k}.{i}.w"], p[f"e{k}.{i}.b"] = blk.net[i].weight, blk.net[i].bias
        put_bn(f"e{k}.1", blk.net[1])
        put_bn(f"e{k}.4", blk.net[4])
    p["g.0.w"], p["g.0.b"], p["g.3.w"], p["g.3.b"] = (model.gate.net[0].weight, model.gate.net[0].bias,
                                                      model.gate.net[3].weight, model.gate.net[3].bias)
    put_bn("g.1", model.gate.net[1])
    return {k: v.detach().clone() for k, v in p.items()}


def test_default_slope_matches_the_authors_block_after_porting_weights():
    d, n = 16, 2
    gen = torch.Generator().manual_seed(0)
    outs = {}
    for slope in (None, 0.2):
        torch.manual_seed(1)
        cfg = RTICConfig(dim=d, n_blocks=n) if slope is None else RTICConfig(dim=d, n_blocks=n, negative_slope=slope)
        model = RTIC(cfg)
        with torch.no_grad():  # non-trivial batch-norm statistics so every BN matters
            for m in model.modules():
                if isinstance(m, nn.BatchNorm1d):
                    m.running_mean.normal_(0, 0.5, generator=gen)
                    m.running_var.uniform_(0.5, 2.0, generator=gen)
                    m.weight.normal_(1, 0.3, generator=gen)
                    m.bias.normal_(0, 0.3, generator=gen)
        model.eval()
        v, t = torch.randn(32, d, generator=gen), torch.randn(32, d, generator=gen)
        with torch.no_grad():
            outs[slope] = (model(v, t) - _authors_block_from_the_paper(_port_weights(model, d), v, t, n)).abs().max()
    assert RTICConfig().negative_slope == 0.01
    assert outs[None] < 1e-6  # the default reproduces the authors' block
    assert outs[0.2] > 1e-3  # the old slope does not


def test_checkpoint_without_recorded_slope_loads_as_legacy_0_2(tmp_path):
    cfg = RTICConfig(dim=8, n_blocks=1)
    assert RTICConfig.from_dict({k: v for k, v in cfg.__dict__.items() if k != "negative_slope"}).negative_slope == 0.2
    assert RTICConfig.from_dict(cfg.__dict__).negative_slope == 0.01
