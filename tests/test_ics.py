"""ICS hashing: centres, simplex projection, centre weights, training, checkpoints, compact index, loaders."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from engine.errors import CheckpointError, IndexLoadError, InputError
from engine.eval.metrics import hamming_distances, map_at_n
from engine.index.ics import (ICSConfig, code_distance, hadamard, hash_centres, labels_to_matrix, load_ics,
                              neg_log_likelihood, neighbour_loss, pack_bits, save_ics, unpack_signs)
from engine.index.ics_baselines import ITQHasher, LSHHasher
from engine.train.ics import pgd_weights, project_simplex, train_ics, weight_objective
from engine.index.ics_index import CompactBinaryIndex, HammingScan, LSHIndex, make_ics_index
from engine.train.ics import candidate_recall
from engine.index.vectors import VECTOR_INDEXES, create_vector_index

torch.set_num_threads(1)


# -- centres -------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 16, 64, 128])
def test_hadamard_rows_orthogonal_and_balanced(k):
    h = hadamard(k).astype(np.int64)
    assert set(np.unique(h)) == {-1, 1}
    np.testing.assert_array_equal(h @ h.T, k * np.eye(k, dtype=np.int64))
    assert (h[0] == 1).all()
    np.testing.assert_array_equal(h[1:].sum(1), 0)  # every row but the first has as many +1 as -1


def test_hadamard_needs_power_of_two():
    with pytest.raises(InputError):
        hadamard(24)


def _pairwise_hamming(c):
    return (c.shape[1] - c @ c.T) / 2


def test_centres_from_hadamard_rows_when_labels_fit():
    c, strategy = hash_centres(10, 32, seed=3)
    assert strategy == "hadamard" and c.shape == (10, 32)
    h = hadamard(32)
    assert all(any((row == hr).all() for hr in h) for row in c)
    d = _pairwise_hamming(c)
    np.testing.assert_array_equal(d[~np.eye(10, dtype=bool)], 16)  # every pair exactly K/2 apart
    np.testing.assert_array_equal(c.sum(1), 0)  # the all-ones row is avoided while others are free
    c2, _ = hash_centres(10, 32, seed=3)
    np.testing.assert_array_equal(c, c2)


def test_centres_from_hadamard_and_its_negation():
    c, strategy = hash_centres(40, 32, seed=0)
    assert strategy == "hadamard2" and c.shape == (40, 32)
    pool = np.concatenate([hadamard(32), -hadamard(32)])
    assert all(any((row == p).all() for p in pool) for row in c)
    assert len(np.unique(c, axis=0)) == 40
    d = _pairwise_hamming(c)[~np.eye(40, dtype=bool)]
    assert set(np.unique(d)) <= {16.0, 32.0}  # K/2, or K for a row and its negation


def test_centres_bernoulli_when_too_many_labels_or_odd_length():
    for m, k in [(100, 32), (5, 24)]:
        c, strategy = hash_centres(m, k, seed=1)
        assert strategy == "bernoulli" and c.shape == (m, k)
        assert set(np.unique(c)) <= {-1.0, 1.0}
    c, _ = hash_centres(400, 64, seed=2)
    assert abs((c > 0).mean() - 0.5) < 0.02  # fair bits
    d = _pairwise_hamming(c)[~np.eye(400, dtype=bool)]
    assert abs(d.mean() - 32) < 0.5


# -- simplex projection --------------------------------------------------------------------------
def _brute_force_projection(v, radius=1.0):
    """Exact projection by enumerating supports (KKT: w_S = v_S - t, t fixed by the sum, w_S >= 0)."""
    best, best_d = None, np.inf
    n = len(v)
    for r in range(1, n + 1):
        for support in itertools.combinations(range(n), r):
            s = list(support)
            t = (v[s].sum() - radius) / r
            w = np.zeros(n)
            w[s] = v[s] - t
            if (w[s] >= -1e-12).all():
                d = ((w - v) ** 2).sum()
                if d < best_d:
                    best, best_d = w, d
    return best


def test_simplex_projection_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 6))
        v = rng.normal(scale=rng.uniform(0.1, 3), size=n)
        got = project_simplex(torch.tensor(v)).numpy()
        np.testing.assert_allclose(got, _brute_force_projection(v), atol=1e-9)
    v = rng.normal(size=(50, 4))
    got = project_simplex(torch.tensor(v), radius=2.5).numpy()
    for row, g in zip(v, got):
        np.testing.assert_allclose(g, _brute_force_projection(row, 2.5), atol=1e-9)


def test_simplex_projection_with_mask_only_uses_free_coordinates():
    rng = np.random.default_rng(1)
    v = rng.normal(size=(100, 5))
    mask = rng.random((100, 5)) < 0.6
    mask[0] = False
    got = project_simplex(torch.tensor(v), torch.tensor(mask)).numpy()
    np.testing.assert_array_equal(got[0], 0)
    for row, m, g in zip(v[1:], mask[1:], got[1:]):
        np.testing.assert_array_equal(g[~m], 0)
        if m.any():
            np.testing.assert_allclose(g[m], _brute_force_projection(row[m]), atol=1e-9)


# -- losses and centre weights -------------------------------------------------------------------
def test_code_distance_and_likelihood_formulas():
    rng = np.random.default_rng(2)
    h = np.tanh(rng.normal(size=(4, 8)))
    c = np.where(rng.random((3, 8)) < 0.5, -1.0, 1.0)
    got = code_distance(torch.tensor(h), torch.tensor(c)).numpy()
    for i in range(4):
        for j in range(3):
            p, t = (1 + h[i]) / 2, (1 + c[j]) / 2
            want = -np.mean(t * np.log(p) + (1 - t) * np.log(1 - p))
            assert abs(got[i, j] - want) < 1e-9
    at_centre = code_distance(torch.tensor(c * (1 - 1e-9)), torch.tensor(c)).numpy()
    assert np.diag(at_centre).max() < 1e-5 and (at_centre + np.eye(3) * 99).min() > 1  # 0 only at the centre
    d = torch.linspace(0, 5, 11, dtype=torch.float64)
    nll = neg_log_likelihood(d, beta=0.5).numpy()
    np.testing.assert_allclose(nll, -np.log(2 / (1 + np.exp(d.numpy() / 0.5))), atol=1e-12)
    assert nll[0] == 0 and (np.diff(nll) > 0).all()


def _losses_for_codes(seed=0, n=64, labels=4, bits=32):
    """Per-centre losses of relaxed codes sitting between their image's label centres."""
    rng = np.random.default_rng(seed)
    centres, _ = hash_centres(labels, bits, seed)
    mask = np.ones((n, labels), dtype=bool)
    mix = rng.dirichlet(np.ones(labels), size=n)
    h = np.clip(mix @ centres + rng.normal(scale=0.3, size=(n, bits)), -0.99, 0.99)
    d = code_distance(torch.tensor(h), torch.tensor(centres))
    return neg_log_likelihood(d, 0.5), torch.tensor(mask)


def test_lambda_small_gives_uniform_weights_large_gives_nearest_centre():
    ell, mask = _losses_for_codes()
    small = pgd_weights(ell, mask, lam=0.01).numpy()
    assert np.abs(small - 0.25).max() < 0.01
    large = pgd_weights(ell, mask, lam=100.0).numpy()
    nearest = ell.numpy().argmin(1)
    assert (large.argmax(1) == nearest).all()
    assert large[np.arange(len(large)), nearest].mean() > 0.95
    for lam in (0.3, 1.0, 3.0):  # in between: the closed-form minimiser softmax(-lam * l)
        w = pgd_weights(ell, mask, lam=lam, steps=100)
        ref = np.exp(-lam * ell.numpy())
        ref /= ref.sum(1, keepdims=True)
        gap = weight_objective(w.double(), ell.double(), mask, lam) - weight_objective(
            torch.tensor(ref), ell.double(), mask, lam)
        assert gap.min() > -1e-6 and gap.max() < 1e-3  # optimal value reached; ref is the minimiser
        assert np.abs(w.numpy() - ref).max() < 0.02


def test_pgd_objective_never_increases_and_respects_labels():
    ell, _ = _losses_for_codes(seed=5, n=200, labels=6)
    rng = np.random.default_rng(5)
    mask = torch.tensor(rng.random((200, 6)) < 0.5)
    mask[:, 0] = True
    for lam in (0.1, 1.0, 10.0, 100.0):
        hist = []
        w = pgd_weights(ell, mask, lam=lam, history=hist)
        assert len(hist) == 11
        for before, after in zip(hist, hist[1:]):
            assert (after <= before + 1e-9).all()
        assert (hist[-1] < hist[0] - 1e-6).any()
        assert torch.allclose(w.sum(1), torch.ones(200), atol=1e-5)
        assert (w[~mask] == 0).all() and (w >= 0).all()
        obj = weight_objective(w.double(), ell.double(), mask, lam)
        assert torch.allclose(obj, hist[-1].to(obj.dtype), atol=1e-5)


# -- training on a real labelled set -------------------------------------------------------------
def _digits_multilabel():
    """The real 8x8 digits set bundled with scikit-learn, with labels {digit, even/odd, <5 / >=5}."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    perm = np.random.default_rng(0).permutation(len(x))
    x, y = x[perm].astype(np.float32), y[perm]
    x -= x[:1000].mean(0)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    labels = np.stack([y == d for d in range(10)] + [y % 2 == 0, y % 2 == 1, y < 5, y >= 5], 1)
    return x, labels, y


def test_training_beats_lsh_on_held_out_real_data():
    """The paper's objective (no neighbour term) lowers its loss and beats LSH codes on mAP."""
    x, labels, digit = _digits_multilabel()
    tr, q, db = slice(0, 1000), slice(1000, 1300), slice(1300, None)
    model = train_ics(x[tr], labels[tr], ICSConfig(bits=32, hidden=256, epochs=10, neighbour_weight=0.0),
                      progress=False)
    hist = model.record["history"]
    assert hist[-1]["central"] < hist[0]["central"] - 0.1  # training lowers the loss
    ics = map_at_n(labels[q], labels[db], 100, query_codes=model.encode(x[q]), db_codes=model.encode(x[db]),
                   bits=32)
    lsh_h = LSHHasher(x.shape[1], 32, seed=0)
    lsh = map_at_n(labels[q], labels[db], 100, query_codes=lsh_h.encode(x[q]), db_codes=lsh_h.encode(x[db]),
                   bits=32)
    assert ics > lsh + 0.03, (ics, lsh)
    # single-label view (c_i = 1): the digit alone, as integer ids
    one = labels_to_matrix([[int(v)] for v in digit])
    model1 = train_ics(x[tr], digit[tr], ICSConfig(bits=16, hidden=256, epochs=10, neighbour_weight=0.0),
                       progress=False)
    ics1 = map_at_n(one[q], one[db], 100, query_codes=model1.encode(x[q]), db_codes=model1.encode(x[db]), bits=16)
    lsh1_h = LSHHasher(x.shape[1], 16, seed=0)
    lsh1 = map_at_n(one[q], one[db], 100, query_codes=lsh1_h.encode(x[q]), db_codes=lsh1_h.encode(x[db]), bits=16)
    assert ics1 > lsh1 + 0.1, (ics1, lsh1)


def test_neighbour_loss_is_zero_when_code_ranking_matches_and_has_gradients():
    torch.manual_seed(0)
    h = torch.tanh(torch.randn(12, 16)).requires_grad_(True)
    sims = (h @ h.T / 16).detach()
    shift = torch.randn(12, 1)  # a constant per anchor row does not change the softmax
    assert neighbour_loss(sims + shift, h, tau=0.1).item() < 1e-6
    other = torch.randn(12, 12)
    loss = neighbour_loss(other, h, tau=0.1)
    assert loss.item() > 0.05
    loss.backward()
    assert torch.isfinite(h.grad).all() and h.grad.abs().sum() > 0
    # the diagonal (an item against itself) is ignored
    sims_diag = sims.clone()
    sims_diag.fill_diagonal_(100.0)
    assert neighbour_loss(sims_diag, h, tau=0.1).item() < 1e-6
    assert neighbour_loss(other[:1, :1], h[:1], tau=0.1).item() == 0.0


def test_neighbour_term_keeps_float_neighbours_among_hamming_candidates():
    """Pure central similarity collapses a class onto one code, so the Hamming top-R misses the exact float
    neighbours; the neighbour term restores them and the codes still beat LSH on mAP."""
    x, labels, digit = _digits_multilabel()
    q, db = slice(1000, 1300), slice(1300, None)
    cfg = dict(bits=32, hidden=256, epochs=40)
    pure = train_ics(x[:1000], digit[:1000], ICSConfig(neighbour_weight=0.0, **cfg), progress=False)
    both = train_ics(x[:1000], digit[:1000], ICSConfig(**cfg), progress=False)
    assert both.record["history"][-1]["neighbour"] < 0.5 * both.record["history"][0]["neighbour"]
    r_pure, r_both = candidate_recall(pure, x, x[q][:200], 100), candidate_recall(both, x, x[q][:200], 100)
    assert r_both > r_pure + 0.15 and r_both > 0.9, (r_pure, r_both)
    one = labels_to_matrix([[int(v)] for v in digit])
    lsh = LSHHasher(x.shape[1], 32, seed=0)
    m_lsh = map_at_n(one[q], one[db], 100, query_codes=lsh.encode(x[q]), db_codes=lsh.encode(x[db]), bits=32)
    m_both = map_at_n(one[q], one[db], 100, query_codes=both.encode(x[q]), db_codes=both.encode(x[db]), bits=32)
    assert m_both > m_lsh + 0.1, (m_both, m_lsh)


def test_map_and_hamming_against_direct_computation():
    rng = np.random.default_rng(3)
    qb, db = rng.random((5, 16)) < 0.5, rng.random((30, 16)) < 0.5
    ham = hamming_distances(pack_bits(qb), pack_bits(db), 16)
    np.testing.assert_array_equal(ham, (qb[:, None, :] != db[None]).sum(2))
    np.testing.assert_array_equal(unpack_signs(pack_bits(qb), 16), np.where(qb, 1.0, -1.0))
    ql, dl = rng.random((5, 3)) < 0.4, rng.random((30, 3)) < 0.4
    got = map_at_n(ql, dl, 10, query_codes=pack_bits(qb), db_codes=pack_bits(db), bits=16)
    aps = []
    for i in range(5):
        order = sorted(range(30), key=lambda j: (ham[i, j], j))[:10]
        rel = [bool((ql[i] & dl[j]).any()) for j in order]
        hits, s = 0, 0.0
        for k, r in enumerate(rel, 1):
            if r:
                hits += 1
                s += hits / k
        if hits:  # a query with nothing relevant in the top 10 is skipped (docs/evaluation.md)
            aps.append(s / hits)
    assert len(aps) < 5  # the case occurs in this draw, so the skip rule is exercised
    assert abs(got - np.mean(aps)) < 1e-12


def test_itq_rotation_lowers_quantisation_error():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(500, 32)) @ rng.normal(size=(32, 32))
    itq = ITQHasher(x, 16, iterations=30)
    v = (x - itq.mean) @ itq.pca
    err = lambda r: np.linalg.norm(np.where(v @ r >= 0, 1, -1) - v @ r)  # noqa: E731
    assert err(itq.rotation) < err(np.eye(16))
    np.testing.assert_allclose(itq.rotation @ itq.rotation.T, np.eye(16), atol=1e-8)


# -- checkpoints ---------------------------------------------------------------------------------
def _small_model(dim=16, bits=16, n=300, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    means = rng.normal(size=(4, dim))
    x = means[y] + 0.3 * rng.normal(size=(n, dim))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    cfg = ICSConfig(bits=bits, hidden=32, epochs=3)
    return train_ics(x, y, cfg, progress=False), x


def test_checkpoint_roundtrip_and_fingerprint_check(tmp_path):
    model, x = _small_model()
    assert model.bits == 16 and model.encode(x).shape == (len(x), 2)
    path = save_ics(model, tmp_path / "ics-16", "bb@1")
    assert path.name == "ics-16.safetensors" and (tmp_path / "ics-16.json").is_file()
    record = json.loads((tmp_path / "ics-16.json").read_text())
    assert record["backbone_fingerprint"] == "bb@1" and record["config"]["bits"] == 16
    assert record["part"] == "ics" and record["format"] == 2
    loaded = load_ics(path, fingerprint="bb@1")
    np.testing.assert_array_equal(loaded.encode(x), model.encode(x))
    assert loaded.identity() == model.identity()
    with pytest.raises(CheckpointError, match="ics-16.safetensors"):
        load_ics(path, fingerprint="other@2")
    with pytest.raises(CheckpointError, match="ics-16.safetensors"):
        load_ics(path, dim=99)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="ics-16.safetensors"):
        load_ics(path)
    assert not list(tmp_path.glob(".*tmp"))


# -- the compact index ---------------------------------------------------------------------------
def _clustered(n=3000, dim=32, clusters=30, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    x = centres[rng.integers(0, clusters, n)] + 0.5 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_compact_index_reranks_exactly_and_recalls_neighbours(tmp_path):
    x = _clustered()
    q = x[:50] + 0.05 * np.random.default_rng(1).normal(size=(50, 32)).astype(np.float32)
    exact = np.argsort(-(q @ x.T), axis=1)[:, :10]
    full = LSHIndex(32, bits=64, rerank=len(x))  # every item re-ranked: exact search over the float16 vectors
    full.build(x)
    scores, ids = full.search(q, 10)
    sims16 = q @ x.astype(np.float16).astype(np.float32).T
    np.testing.assert_array_equal(ids, np.argsort(-sims16, axis=1, kind="stable")[:, :10])
    np.testing.assert_allclose(scores, np.take_along_axis(sims16, ids, 1), rtol=1e-5, atol=1e-5)
    idx = LSHIndex(32, bits=64, rerank=300)
    idx.build(x)
    _, ids = idx.search(q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, exact)])
    assert recall >= 0.9, recall
    assert idx.bytes_per_item() == 8.0
    d = idx.describe()
    assert d["bytes_per_item"] == 8.0 and d["bytes_per_item_with_rerank_vectors"] == 8.0 + 64
    idx.save(tmp_path)
    again = LSHIndex(32, bits=64, rerank=300)
    again.load(tmp_path, x)
    np.testing.assert_array_equal(again.codes, idx.codes)
    np.testing.assert_array_equal(again.search(q, 10)[1], ids)
    (tmp_path / "vectors.codes.npy").write_bytes(b"garbage")
    with pytest.raises(IndexLoadError, match="vectors.codes.npy"):
        LSHIndex(32, bits=64).load(tmp_path, x)


def test_fast_rerank_equals_the_numpy_gather_and_blas_path():
    """The re-rank gathers and converts float16 rows in torch and sums with einsum; it gives what numpy's
    gather + ``astype`` + BLAS product gave: the same candidates, result ids and order, and the same scores up
    to float rounding (einsum and BLAS sum in different orders)."""
    model, _ = _small_model(dim=32, bits=16)
    rng = np.random.default_rng(3)
    q = rng.normal(size=(20, 32)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    gallery = _clustered(n=2000, dim=32)
    idx = CompactBinaryIndex(32, model, kind="ics-16", rerank=300)
    idx.build(gallery)
    rows = rng.integers(0, len(gallery), 300)
    np.testing.assert_array_equal(idx.gather_f32(rows), idx.vectors16[rows].astype(np.float32))
    for row in q:
        scores, ids = idx.search(row[None], 10)
        cand = idx.candidates(row[None], 300)[0]
        s = idx.vectors16[cand].astype(np.float32) @ row
        top = np.argsort(-s, kind="stable")[:10]
        np.testing.assert_array_equal(ids[0], cand[top])
        np.testing.assert_allclose(scores[0], s[top], rtol=0, atol=1e-6)


@pytest.mark.parametrize("bits", [16, 32, 64, 128])
def test_hamming_scan_equals_a_stable_sort_of_all_distances(bits):
    """The numpy scan returns the r nearest codes by Hamming distance, ties to the lower id, nearest first, on
    one thread or split over two, and the same distances as FAISS's exhaustive binary scan."""
    import faiss

    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 256, (70_000, bits // 8), dtype=np.uint8)
    codes[35_000:] = codes[:35_000]  # every code twice: ties at every distance
    flat = faiss.IndexBinaryFlat(bits)
    flat.add(codes)
    scans = [HammingScan(codes, bits, threads=t) for t in (1, 2)]
    assert [s.threads for s in scans] == [1, 2]
    for _ in range(4):
        q = rng.integers(0, 256, bits // 8, dtype=np.uint8)
        dist = np.unpackbits(codes ^ q, axis=1).sum(1)
        for r in (1, 10, 1000, len(codes) + 5):
            want = np.argsort(dist, kind="stable")[:r]
            for scan in scans:
                np.testing.assert_array_equal(scan.search(q, r), want)
        np.testing.assert_array_equal(dist[scans[0].search(q, 1000)], flat.search(q[None], 1000)[0][0])
    # every sampled code equals the query: the sampled threshold (0) keeps too few and the shards are rescanned
    codes[::max(1, len(codes) // HammingScan.SAMPLE)] = codes[1]
    dist = np.unpackbits(codes ^ codes[1], axis=1).sum(1)
    want = np.argsort(dist, kind="stable")[:6000]
    for threads in (1, 2):
        np.testing.assert_array_equal(HammingScan(codes, bits, threads).search(codes[1], 6000), want)
    assert len(HammingScan(codes[:0], bits).search(codes[0], 10)) == 0


def test_binary_ivf_structure_probes_cells_and_reranks():
    x = _clustered()
    q = x[:50] + 0.05 * np.random.default_rng(1).normal(size=(50, 32)).astype(np.float32)
    exact = np.argsort(-(q @ x.T), axis=1)[:, :10]
    idx = LSHIndex(32, bits=64, rerank=300, binary_index="ivf", nlist=16, nprobe=16)  # every cell: exhaustive
    idx.build(x)
    flat = LSHIndex(32, bits=64, rerank=300)
    flat.build(x)
    assert idx.describe()["binary_index"] == "ivf" and idx.index.nlist == 16 and idx.scan is None
    qc = idx.hasher.encode(q)

    def dist(ids):  # Hamming distances of the candidates (which of equally near codes is kept may differ)
        return np.sort([np.unpackbits(idx.codes[row] ^ c, axis=1).sum(1) for row, c in zip(ids, qc)], 1)

    np.testing.assert_array_equal(dist(idx.candidates(q, 300)), dist(flat.candidates(q, 300)))
    idx.index.nprobe = 4
    _, ids = idx.search(q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, exact)])
    assert 0.5 <= recall <= 1, recall
    with pytest.raises(InputError, match="ivf"):
        LSHIndex(32, bits=64, binary_index="ivf2")


def test_query_codes_of_the_small_batch_head_equal_the_module_outputs():
    model, x = _small_model(dim=16, bits=16)
    full = pack_bits(model.outputs(x) >= 0)
    np.testing.assert_array_equal(np.concatenate([model.encode(row[None]) for row in x]), full)
    np.testing.assert_array_equal(model.encode(x[:16]), full[:16])
    np.testing.assert_array_equal(model._small_outputs(x[:3]), model.outputs(x[:3]))


def test_small_gallery_and_bad_queries():
    x = _clustered(n=5)
    idx = LSHIndex(32, bits=16)
    idx.build(x)
    scores, ids = idx.search(x[:2], 8)
    assert ids.shape == (2, 8) and (ids[:, 5:] == -1).all() and ids[0, 0] == 0
    with pytest.raises(InputError):
        idx.search(np.zeros((1, 7), np.float32), 3)
    with pytest.raises(InputError, match="threads"):
        LSHIndex(32, bits=16, threads=0)


def test_registered_ics_types_need_a_matching_checkpoint(tmp_path):
    for bits in (16, 32, 64, 128):
        assert f"ics-{bits}" in VECTOR_INDEXES
    with pytest.raises(CheckpointError, match="python -m engine train ics --bits 16"):
        create_vector_index("ics-16", 16, 10, checkpoint_dir=tmp_path, fingerprint="bb@1")
    model, x = _small_model(dim=16, bits=16)
    save_ics(model, tmp_path / "ics-16", "bb@1")
    with pytest.raises(CheckpointError, match="ics-16.safetensors"):
        create_vector_index("ics-16", 16, 10, checkpoint_dir=tmp_path, fingerprint="bb@2")
    vi = create_vector_index("ics-16", 16, len(x), checkpoint_dir=tmp_path, fingerprint="bb@1", rerank=50)
    assert isinstance(vi, CompactBinaryIndex) and vi.kind == "ics-16"
    vi.build(x)
    assert vi.bytes_per_item() == 2.0 and vi.describe()["bits"] == 16
    _, ids = vi.search(x[:5], 3)
    assert (ids[:, 0] == np.arange(5)).all()
    with pytest.raises(CheckpointError):
        make_ics_index(32, 16, checkpoint_dir=tmp_path)


# -- label formats -------------------------------------------------------------------------------
def test_label_file_loaders(tmp_path):
    from engine.train.ics import label_matrix, load_coco, load_label_csv, load_nuswide

    coco = {"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"},
                       {"id": 3, "file_name": "c.jpg"}],
            "categories": [{"id": 7, "name": "dog"}, {"id": 9, "name": "cat"}],
            "annotations": [{"image_id": 1, "category_id": 7}, {"image_id": 1, "category_id": 9},
                            {"image_id": 1, "category_id": 7}, {"image_id": 2, "category_id": 9}]}
    (tmp_path / "inst.json").write_text(json.dumps(coco))
    items = load_coco(tmp_path / "inst.json", tmp_path / "img")
    assert items == [(str(tmp_path / "img" / "a.jpg"), ["cat", "dog"]), (str(tmp_path / "img" / "b.jpg"), ["cat"])]
    (tmp_path / "list.txt").write_text("x/1.jpg 0 1 1\nx/2.jpg 1 0 0\n")
    (tmp_path / "concepts.txt").write_text("sky\nsea\nsun\n")
    items = load_nuswide(tmp_path / "list.txt", tmp_path, tmp_path / "concepts.txt")
    assert [ls for _, ls in items] == [["sea", "sun"], ["sky"]]
    (tmp_path / "ImageList.txt").write_text("a\\1.jpg\na\\2.jpg\n")
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "Labels_sky.txt").write_text("1\n0\n")
    (tmp_path / "labels" / "Labels_sea.txt").write_text("1\n1\n")
    items = load_nuswide(tmp_path / "ImageList.txt", tmp_path, labels_dir=tmp_path / "labels")
    assert items[0] == (str(tmp_path / "a/1.jpg"), ["sea", "sky"]) and items[1][1] == ["sea"]
    (tmp_path / "l.csv").write_text("path,labels\np1.png,red|round\np2.png,blue\n")
    items = load_label_csv(tmp_path / "l.csv", tmp_path)
    assert [ls for _, ls in items] == [["red", "round"], ["blue"]]
    y, vocab = label_matrix([ls for _, ls in items])
    assert vocab == ["blue", "red", "round"] and y.tolist() == [[False, True, True], [True, False, False]]
    (tmp_path / "bad.txt").write_text("x.jpg 0 q\n")
    with pytest.raises(InputError, match="bad.txt"):
        load_nuswide(tmp_path / "bad.txt", tmp_path)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError, match="bad.json"):
        load_coco(tmp_path / "bad.json", tmp_path)


def test_train_cli_on_feature_file(tmp_path, capsys):
    from engine.train.ics import main

    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 400)
    x = rng.normal(size=(5, 24))[y] + 0.4 * rng.normal(size=(400, 24))
    np.savez(tmp_path / "f.npz", embeddings=x.astype(np.float32), labels=y, fingerprint="bb@9")
    rc = main(["--features", str(tmp_path / "f.npz"), "--bits", "16", "--epochs", "40", "--hidden", "32",
               "--neighbour-weight", "0.5", "--out", str(tmp_path / "ck"), "--quiet"])
    assert rc == 0
    record = json.loads((tmp_path / "ck" / "ics-16-bb.json").read_text())  # ics-<K>-<backbone slug>
    assert record["backbone_fingerprint"] == "bb@9" and record["bits"] == 16
    assert record["splits"] == {"train": 320, "query": 16, "db": 64}
    assert record["eval"]["map_ics"] > record["eval"]["map_lsh"]
    assert record["eval"]["rerank"] == 20 and 0 < record["eval"]["recall10_ics"] <= 1  # 5% of 384 items
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed[0]["bits"] == 16
    model = load_ics(tmp_path / "ck" / "ics-16-bb.safetensors", fingerprint="bb@9")
    assert model.bits == 16 and model.config.neighbour_weight == 0.5
    with pytest.raises(InputError, match="--bits"):
        main(["--features", str(tmp_path / "f.npz"), "--bits", "12", "--out", str(tmp_path / "ck")])


def test_bench_tables_on_small_data():
    from engine.bench.ics import PAPER, map_table, million_table, recall_table, to_markdown

    x, labels, digit = _digits_multilabel()
    table, models = map_table("digits", x[:1000], labels[:1000], x[1000:1100], labels[1000:1100], x[1100:],
                              labels[1100:], (16,), 50, epochs=2)
    row = table["bits"][16]
    assert set(row) >= {"ics", PAPER, "lsh", "itq"} and all(0 <= row[k] <= 1 for k in ("ics", PAPER, "lsh", "itq"))
    hashers = {"lsh-16": LSHHasher(x.shape[1], 16), "ics-16": models["ics", 16]}
    # recall@10 grows with the re-rank pool R: below 1 while R is a small share of the 1,797 items (16-bit
    # codes cannot rank the true neighbours first), exactly 1 when every item is re-ranked in float
    curve = {r: recall_table(x, x[:20], r, hashers)["rows"] for r in (30, 300, len(x))}
    for name in hashers:
        got = [curve[r][name]["recall@10"] for r in (30, 300, len(x))]
        assert 0 < got[0] < got[1] < 1 and got[2] == 1.0, (name, got)
    rec = {"items": len(x), "rerank": 30, "rows": curve[30]}
    mil = million_table(n=3000, dim=64, queries=5, rerank=100, clusters=10, epochs=1)
    assert mil["rows"]["ics-64"]["bytes"] == 8
    # 100 of 3,000 items re-ranked: every hasher finds some of the true top 10, none finds them all
    assert all(0 < r["recall@10"] < 1 for r in mil["rows"].values()), mil["rows"]
    assert set(mil["rows"]) == {"lsh-64", "itq-64", "ics-64"}
    md = to_markdown({"maps": [table], "recall": rec, "million": mil})
    assert "| 16 |" in md and "ics-64" in md and "3,000 synthetic" in md
    lim = mil["limits"]
    assert lim["limit_ms"] == lim["scan_ms"] + lim["rerank_ms"] and all(lim[k] > 0 for k in ("scan_ms", "rerank_old_ms"))
    assert "**design limit** (scan + re-rank)" in md and "target <= 3.0 ms" in md
    ivf = mil["ivf"]  # the binary IVF variant: nprobe chosen on validation queries, then timed on the test ones
    assert [(c["rerank"], c["nprobe"]) for c in ivf["validation"]] == [(r, p) for r in (100, 150) for p in (8, 16, 32, 64)]
    assert ivf["nprobe"] in (8, 16, 32, 64) and ivf["rerank"] in (100, 150)
    assert 0 < ivf["recall@10"] <= 1 and ivf["ms"] > 0 and "binary IVF (" in md and "(chosen)" in md


def test_ics_bench_million_only_keeps_the_previous_tables(tmp_path):
    from types import SimpleNamespace

    from engine.bench.ics import section_ics as bench_section

    old = ("# Benchmarks\n\nWritten by `python -m engine bench` on 2026-11-29.\n\n## ics\n\nmAP@1000 on X\n\n"
           "| bits | ICS |\n|---|---|\n| 64 | 0.7 |\n\n1,000,000 synthetic 512-d vectors, one thread, single queries: "
           "exact float scan 1 ms\n\n| index | bytes/image (codes) |\n|---|---|\n| ics-64 | 8 |\n\n"
           "![mAP vs bits](ics_map.png)\n\n## integrity\n\nother\n")
    (tmp_path / "B.md").write_text(old)
    args = SimpleNamespace(sizes=[2000], dim=64, ics_million_only=True, out=str(tmp_path / "B.md"))
    md, fig = bench_section(args, {})
    assert set(fig) == {"million"} and fig["million"]["items"] == 2000
    assert md.count("| 64 | 0.7 |") == 1 and "2026-11-29" in md and "--ics-million-only" in md
    assert "1,000,000 synthetic" not in md and "2,000 synthetic 64-d" in md and "**design limit**" in md
    (tmp_path / "B.md").write_text("## ics\n\n_Measured 2026-12-02 on X._\n\n" + md)  # a 1M-only run again
    md2, _ = bench_section(args, {})
    assert "2026-11-29" in md2 and md2.count("| 64 | 0.7 |") == 1 and md2.count("**design limit**") == 1
