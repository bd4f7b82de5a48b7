"""The hub correction (engine.index.hubs): its density against the formula, the re-ranking, the index and the
one search function applying the weight the defaults record chose, and the evaluation ranking the same way."""
import json

import numpy as np
import pytest
import torch


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_density_is_the_mean_cosine_to_the_kappa_nearest_other_items():
    from engine.index.hubs import density

    v = _unit(np.random.default_rng(0).normal(size=(37, 8)))
    sims = v @ v.T
    np.fill_diagonal(sims, -np.inf)
    for kappa in (1, 5, 36, 99):
        k = min(kappa, 36)
        want = np.sort(sims, axis=1)[:, -k:].mean(axis=1)
        np.testing.assert_allclose(density(v, kappa, chunk=8), want, rtol=1e-5, atol=1e-6)  # several chunks
    assert density(v[:1]).tolist() == [0.0]


def test_a_hub_is_pulled_down_and_the_right_item_comes_first():
    from engine.index.hubs import corrected, density

    rng = np.random.default_rng(1)
    centres = _unit(rng.normal(size=(8, 16)))
    items = _unit(np.repeat(centres, 4, axis=0) + 0.3 * rng.normal(size=(32, 16)))
    hub = _unit(centres.sum(0, keepdims=True))          # close to every cluster: a hub
    gallery = np.vstack([items, hub])
    target = 5                                          # an item of cluster 1
    q = _unit(0.5 * hub + 0.5 * items[target:target + 1])[0]
    scores = gallery @ q
    order = np.argsort(-scores)
    assert order[0] == 32 and order[1] == target        # uncorrected, the hub wins
    dens = density(gallery, 12)
    assert dens.argmax() == 32                          # the hub is the densest item
    s, ids = corrected(scores[order][None], order[None], dens, 0.6)
    assert ids[0, 0] == target and np.all(np.diff(s[0]) <= 0)
    np.testing.assert_allclose(s[0], scores[ids[0]] - 0.6 * dens[ids[0]], rtol=1e-5, atol=1e-6)
    # the query's own picture (cosine 1) is an exact match, not a hub: never penalised
    own = np.vstack([gallery, items[target:target + 1]])
    dens2 = density(own, 12)
    sims = own @ items[target]
    s, ids = corrected(np.sort(sims)[::-1][None], np.argsort(-sims)[None], dens2, 0.6)
    assert ids[0, 0] in (target, 33) and s[0, 0] > 0.999
    s0, i0 = corrected(scores[order][None], order[None], dens, 0.0)
    assert i0[0].tolist() == order.tolist()              # weight 0: the search as it was
    padded = np.array([[3, -1, 5]]), np.array([[0.9, 0.8, 0.7]], dtype=np.float32)
    s, ids = corrected(padded[1], padded[0], dens, 0.5)
    assert ids[0, -1] == -1 and s[0, -1] == -np.inf      # the index's padding stays last


def test_search_applies_the_recorded_hub_weight_and_says_so(tmp_path, tiny, noise_index):
    from engine.config import Settings
    from engine.defaults import engine_defaults, write_defaults
    from engine.index.hubs import density
    from engine.compose import Query
    from engine.search import open_engine, search

    _, idx = noise_index(tiny, 40, 32, 3)
    s = Settings()
    s.checkpoints = str(tmp_path / "ck")
    write_defaults(tiny, {"method": "sum", "hub_weight": {"sum": 0.6}}, tmp_path / "ck")
    assert engine_defaults(tiny, s).hub_weight_for("sum") == 0.6 and engine_defaults(tiny, s).hub_weight_for("text") == 0
    eng = open_engine(idx, backbone=tiny, settings=s)
    r = search(eng, image=0, text="noise", method="sum", k=8, explain=True, exclude_reference=True)
    assert r.explanation["hubs"]["weight"] == 0.6
    emb = eng.index.vectors_f32()
    comp = eng.composers["sum"].compose(Query(text="noise", image_embedding=torch.from_numpy(emb[0]), has_image=True))
    cos = emb @ comp.vector
    want = cos - 0.6 * density(emb)
    want[0] = -np.inf                                                       # the reference left out
    assert [x.id for x in r.results] == np.argsort(-want, kind="stable")[:8].tolist()
    np.testing.assert_allclose([x.score for x in r.results], want[[x.id for x in r.results]], atol=2e-3)
    plain = search(eng, image=0, text="noise", method="text", k=8, explain=True, exclude_reference=True)
    assert "hubs" not in plain.explanation                                 # no weight for text: no correction
    assert [x.id for x in plain.results] != [x.id for x in r.results]


@pytest.mark.parametrize("bad", [{"rtic": 2.0}, {"rtic": "strong"}, [0.2], {"rtic": True}])
def test_a_hub_weight_out_of_range_makes_the_record_ignored(bad, tmp_path, tiny):
    from engine.defaults import engine_defaults

    (tmp_path / "defaults-x.json").write_text(json.dumps({"kind": "defaults", "backbone_fingerprint": tiny.fingerprint,
                                                          "method": "rtic", "hub_weight": bad}))
    d = engine_defaults(tiny, checkpoint_dir=tmp_path)
    assert d.source != "defaults-x.json" and d.hub_weight_for("rtic") == 0.0


def test_the_evaluation_ranks_with_the_same_correction_as_the_search():
    from engine.eval.cir import group_density, rank_queries
    from engine.index.hubs import density

    rng = np.random.default_rng(4)
    gemb = _unit(rng.normal(size=(20, 6)))
    gallery = [{"image": f"{g}{i}", "gallery": g} for g in "ab" for i in range(10)]
    pos = {g["image"]: i for i, g in enumerate(gallery)}
    dens = group_density(gallery, gemb)
    np.testing.assert_allclose(dens[10:], density(gemb[10:]), rtol=1e-6)   # within its own gallery only
    qv = _unit(rng.normal(size=(1, 6)))
    query = {"reference": "b0", "targets": ["b5"], "gallery": "b"}
    got = rank_queries(qv, [query], gallery, gemb, pos, density=dens, hub=0.4)["none"][0]
    s = gemb[11:] @ qv[0] - 0.4 * dens[11:]                                 # no cosine near 1 here
    assert got == int((s > s[5 - 1]).sum()) + 1


def test_the_density_is_saved_with_the_index_and_read_back_not_recomputed(tmp_path, monkeypatch):
    """The density is computed when an index version is saved (off the first search's path), stored as a
    checksummed file of the version, and loaded with it; a version without the file computes it on first use."""
    from engine.errors import IndexLoadError
    from engine.index import hubs
    from engine.index.store import DENSITY, GalleryIndex

    x = np.random.default_rng(3).standard_normal((30, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    items = [{"id": i, "path": f"{i}.jpg", "sha256": f"{i:064x}", "caption": ""} for i in range(len(x))]
    gi = GalleryIndex(tmp_path / "idx", {"fingerprint": "fp", "source": str(tmp_path), "dim": 16}, items,
                      x.astype(np.float16))
    gi.attach_vectors("flat")
    version = gi.save()
    want = hubs.density(x.astype(np.float16).astype(np.float32))
    np.testing.assert_allclose(np.load(version / DENSITY), want, rtol=1e-6)
    assert DENSITY in (version / "checksums.json").read_text()

    def no_recompute(*a, **k):
        raise AssertionError("density recomputed although the index holds it")

    monkeypatch.setattr(hubs, "density", no_recompute)
    loaded = GalleryIndex.load(tmp_path / "idx")
    np.testing.assert_allclose(loaded.hub_density(), want, rtol=1e-6)
    q = x[:2] + 0.1
    np.testing.assert_array_equal(loaded.search(q, 5, hub_weight=0.4)[1],
                                  hubs.corrected(*loaded.vectors.search(q, 30), want, 0.4)[1][:, :5])
    # a damaged file of the right checksum cannot happen; one loaded unverified is still checked for its shape
    np.save(version / DENSITY, want[:-1])
    with pytest.raises(IndexLoadError, match="density"):
        GalleryIndex.load(tmp_path / "idx", verify=False)
    (version / DENSITY).unlink()                                            # an index saved before it existed
    monkeypatch.undo()
    old = GalleryIndex.load(tmp_path / "idx", verify=False)
    assert old._density is None
    np.testing.assert_allclose(old.hub_density(), want, rtol=1e-6)


def test_the_hub_weight_is_chosen_on_the_gallery_of_distinct_photos():
    """choose_hub scores each weight on the suite's category gallery (distinct photos, like a page's gallery), not
    on the edited-version galleries, where a weight that helps here can hurt there; each score is recorded."""
    from engine.compose.auto import overall_of_ranks
    from engine.eval.cir import group_density
    from engine.eval.generalise import HUB_GRID, Suite, choose_hub, rank_suite

    e = np.eye(8)
    near = lambda *parts: _unit(np.sum(parts, axis=0)[None])[0]  # noqa: E731
    # each gallery: a reference, a dense cluster around e1 (its centre: "1"), a lone picture on e2 ("5"), fillers
    rows = {"0": e[0], "1": e[1], "2": near(e[1], 0.3 * e[3]), "3": near(e[1], 0.3 * e[4]), "4": near(e[1], 0.3 * e[5]),
            "5": e[2], "6": e[6], "7": e[7], "8": near(e[6], e[7]), "9": near(e[0], e[6])}
    gallery = [{"image": f"{g}:{k}", "gallery": g} for g in ("category", "attribute") for k in rows]
    gemb = np.stack([rows[g["image"].split(":")[1]] for g in gallery]).astype(np.float32)
    pos = {g["image"]: i for i, g in enumerate(gallery)}
    q = lambda g, target, kind: {"reference": f"{g}:0", "targets": [f"{g}:{target}"], "gallery": g, "kind": kind}  # noqa: E731
    queries = [q("category", "1", "category"), q("category", "5", "category"), q("attribute", "5", "tint"),
               q("attribute", "5", "bw")]
    suite = Suite("val", queries, {}, {"category": [g["image"] for g in gallery[:10]],
                                       "attribute": [g["image"] for g in gallery[10:]]})
    kinds = np.array([x["kind"] for x in queries])
    between = near(e[1], 0.9 * e[2])          # closer to the dense cluster's centre than to the lone picture
    vectors = {"hurt": np.stack([between, e[2], between, between]),   # its category answer is a dense picture
               "helped": np.stack([e[1], between, between, between])}  # its category answer is the lone one
    ev = {"suite_obj": suite, "kinds": kinds, "density": group_density(gallery, gemb), "tensors": (gallery, gemb, pos),
          "vectors": vectors}
    chosen, grid = choose_hub(ev)
    assert chosen["hurt"] == 0.0 and chosen["helped"] > 0.0
    whole = {w: overall_of_ranks(rank_suite(vectors["hurt"], suite, gallery, gemb, pos, hub=w, density=ev["density"]),
                                 kinds) for w in HUB_GRID}
    assert max(whole, key=whole.get) > 0.0     # the whole suite would have chosen a weight for "hurt"
    assert grid["hurt"]["0"] == 100.0 and grid["hurt"]["0.6"] < 100.0


@pytest.mark.parametrize("seed", range(4))
def test_the_hub_grid_ranks_from_one_score_matrix_are_the_per_query_ranks(seed):
    """choose_hub ranks every weight of its grid from one (queries, gallery) score matrix with masks
    (hub_grid_ranks): the same ranks as rank_queries' per-query loop, weight by weight, ties, a reference that is
    also a target, a target outside the gallery, a reference outside it, a query on its target's picture and
    float32 scores included; and without a density."""
    from engine.eval.cir import group_density, hub_grid_ranks, rank_queries
    from engine.eval.generalise import HUB_GRID

    rng = np.random.default_rng(seed)
    gemb = _unit(rng.normal(size=(40, 8))).astype(np.float32)
    gemb[7] = gemb[3]                                       # a tie: the same picture twice in the gallery
    gallery = [{"image": f"{g}{i}", "gallery": g} for g in ("category", "other") for i in range(20)]
    pos = {g["image"]: i for i, g in enumerate(gallery)}
    dens = group_density(gallery, gemb)
    refs = [f"category{i}" for i in rng.integers(0, 20, size=12)] + ["other3"]   # one reference outside the group
    queries = [{"reference": r, "targets": [f"category{i}" for i in rng.choice(20, size=2, replace=False)],
                "gallery": "category"} for r in refs]
    queries[0]["targets"] = [queries[0]["reference"]]          # its only target is its reference: none left
    queries[1]["targets"] = ["other5"]                          # a target outside the ranked gallery
    queries[2]["targets"] = ["category3", "category7"]          # the tied pair
    qv = _unit(rng.normal(size=(len(queries), 8))).astype(np.float32)
    qv[3] = gemb[pos[queries[3]["targets"][0]]]                 # a query on its target's own picture
    got = hub_grid_ranks(qv, queries, gallery, gemb, pos, dens, HUB_GRID)
    for w in HUB_GRID:
        want = rank_queries(qv, queries, gallery, gemb, pos, density=dens, hub=w)["none"]
        np.testing.assert_array_equal(got[w], want, err_msg=f"weight {w}")
        assert got[w].dtype == want.dtype
    assert got[0.0][0] == 20 and got[0.0][3] == 1             # no target left: one past the 19 candidates
    without = hub_grid_ranks(qv, queries, gallery, gemb, pos, None, (0.0, 0.4))
    np.testing.assert_array_equal(without[0.4], rank_queries(qv, queries, gallery, gemb, pos, hub=0.4)["none"])
