"""Metric tests against hand-computed values (engine/eval/metrics.py).

Every expected number is worked out in the comments from the score matrix of the test.
"""
import numpy as np
import pytest

from engine.errors import InputError
from engine.eval import metrics as M


# ----------------------------------------------------------------------------- tie-breaking
def test_ties_are_broken_by_gallery_order():
    gallery = ["a", "b", "c", "d", "e"]
    row = np.array([0.5, 0.9, 0.5, 0.9, 0.1])
    # stable by gallery order: b (0.9, idx1) before d (0.9, idx3); a (0.5, idx0) before c (0.5, idx2)
    assert M.ranked_indices(row).tolist() == [1, 3, 0, 2, 4]
    scores = row[None, :]
    # target d is second -> R@1 = 0, R@2 = 100
    assert M.recall_at_k(scores, gallery, [["d"]], ks=(1, 2)) == {"R@1": 0.0, "R@2": 100.0}
    # the same scores with d listed before b in the gallery: d now wins the tie -> R@1 = 100
    perm = [3, 0, 1, 2, 4]  # gallery d, a, b, c, e
    gallery2 = [gallery[i] for i in perm]
    scores2 = row[perm][None, :]
    assert M.recall_at_k(scores2, gallery2, [["d"]], ks=(1, 2)) == {"R@1": 100.0, "R@2": 100.0}
    # the ranking used for submissions agrees
    assert M.top_k_ids(scores, gallery, 3) == [["b", "d", "a"]]
    assert M.top_k_ids(scores2, gallery2, 3) == [["d", "b", "a"]]


def test_partial_ranking_keeps_exact_ties_on_big_gallery():
    rng = np.random.default_rng(0)
    row = rng.integers(0, 5, size=2000).astype(float)  # many ties
    full = np.argsort(-row, kind="stable")
    for k in (1, 7, 50):
        assert M.ranked_indices(row, k).tolist() == full[:k].tolist()
    excl = full[:3].tolist()
    expect = [i for i in full if i not in excl][:10]
    assert M.ranked_indices(row, 10, exclude=excl).tolist() == expect


def test_ranks_match_a_brute_force_sort():
    rng = np.random.default_rng(1)
    q, g = 6, 40
    scores = rng.integers(0, 6, size=(q, g)).astype(float)
    gallery = [f"g{i}" for i in range(g)]
    targets = [[gallery[rng.integers(g)]] for _ in range(q)]
    refs = [gallery[rng.integers(g)] for _ in range(q)]
    ranks = M.target_ranks(scores, gallery, targets, exclude=[[r] for r in refs])
    for i in range(q):
        # independent: python sort on (-score, gallery position), drop the reference
        order = sorted((j for j in range(g) if gallery[j] != refs[i]), key=lambda j: (-scores[i, j], j))
        names = [gallery[j] for j in order]
        expected = names.index(targets[i][0]) if targets[i][0] in names else np.inf
        assert ranks[i] == expected


# ----------------------------------------------------------------------------- FashionIQ
def test_fashioniq_recall_hand_computed():
    gallery = ["x1", "x2", "x3", "x4"]
    scores = np.array(
        [
            [0.9, 0.1, 0.2, 0.3],  # target x1: rank 0
            [0.9, 0.8, 0.7, 0.6],  # target x4: rank 3
            [0.5, 0.5, 0.5, 0.5],  # target x2: all tie -> gallery order -> rank 1
        ]
    )
    targets = [["x1"], ["x4"], ["x2"]]
    r = M.fashioniq_recall(scores, gallery, targets, ks=(1, 2, 4))
    # R@1: only q0 -> 1/3; R@2: q0, q2 -> 2/3; R@4: all -> 3/3
    assert r["R@1"] == pytest.approx(100 / 3)
    assert r["R@2"] == pytest.approx(200 / 3)
    assert r["R@4"] == pytest.approx(100.0)


def test_fashioniq_average_over_categories():
    per = {"dress": {"R@10": 20.0, "R@50": 40.0}, "shirt": {"R@10": 30.0, "R@50": 50.0}, "toptee": {"R@10": 40.0, "R@50": 60.0}}
    avg = M.fashioniq_average(per)
    # R@10 mean = 30, R@50 mean = 50, avg = (30 + 50) / 2 = 40
    assert avg == {"R@10": 30.0, "R@50": 50.0, "avg": 40.0}


# ----------------------------------------------------------------------------- CIRR
CIRR_GALLERY = ["A", "B", "C", "D", "E", "F"]
CIRR_SCORES = np.array(
    [
        # q100 ref A target C: order A .9, D .8, E .6, C .5, B 0, F 0; without A: D, E, C -> rank 2
        [0.9, 0.0, 0.5, 0.8, 0.6, 0.0],
        # q101 ref C target E: C .95, E .7, F .7 (tie: E first by gallery order) -> rank 0
        [0.0, 0.0, 0.95, 0.0, 0.7, 0.7],
        # q102 ref E target B: without E: A .3, C .25, D .25, B .2, F .1 -> rank 3
        [0.3, 0.2, 0.25, 0.25, 0.9, 0.1],
    ]
)
CIRR_REFS = ["A", "C", "E"]
CIRR_TARGETS = [["C"], ["E"], ["B"]]
CIRR_SUBSETS = [["A", "B", "C", "D"], ["C", "D", "E", "F"], ["E", "F", "A", "B"]]


def test_cirr_recall_excludes_reference():
    r = M.cirr_recall(CIRR_SCORES, CIRR_GALLERY, CIRR_REFS, CIRR_TARGETS, ks=(1, 3, 4, 5))
    # ranks after exclusion: 2, 0, 3 -> R@1 = 1/3, R@3 = 2/3, R@4 = 3/3
    assert r["R@1"] == pytest.approx(100 / 3)
    assert r["R@3"] == pytest.approx(200 / 3)
    assert r["R@4"] == pytest.approx(100.0)
    assert r["R@5"] == pytest.approx(100.0)
    # without exclusion the reference occupies rank 0 everywhere: ranks 3, 1, 4 -> R@1 = 0, R@4 = 2/3
    plain = M.recall_at_k(CIRR_SCORES, CIRR_GALLERY, CIRR_TARGETS, ks=(1, 4))
    assert plain["R@1"] == 0.0
    assert plain["R@4"] == pytest.approx(200 / 3)


def test_cirr_subset_recall_hand_computed():
    r = M.cirr_subset_recall(CIRR_SCORES, CIRR_GALLERY, CIRR_REFS, CIRR_TARGETS, CIRR_SUBSETS)
    # q100 members minus A: B 0, C .5, D .8 -> D, C, B -> C rank 1
    # q101 members minus C: D 0, E .7, F .7 -> E (tie, gallery order), F, D -> E rank 0
    # q102 members minus E: F .1, A .3, B .2 -> A, B, F -> B rank 1
    assert r == pytest.approx({"Rsubset@1": 100 / 3, "Rsubset@2": 100.0, "Rsubset@3": 100.0})
    # submission lists: reference never appears, subset lists only members
    top = M.top_k_ids(CIRR_SCORES, CIRR_GALLERY, 50, exclude=[[x] for x in CIRR_REFS])
    assert top[0] == ["D", "E", "C", "B", "F"]
    sub = M.top_k_ids(CIRR_SCORES, CIRR_GALLERY, 3, exclude=[[x] for x in CIRR_REFS], restrict=CIRR_SUBSETS)
    assert sub == [["D", "C", "B"], ["E", "F", "D"], ["A", "B", "F"]]


def test_valid_mask_counts_misses_and_missing_targets():
    # q1 invalid (reference image missing) -> miss even though its target ranks first;
    # q2 target "Z" is not in the gallery -> never found
    r = M.cirr_recall(CIRR_SCORES, CIRR_GALLERY, CIRR_REFS, [["C"], ["E"], ["Z"]], ks=(1, 5), valid=[True, False, True])
    # q0 rank 2 -> R@1 0/3, R@5 1/3
    assert r["R@1"] == 0.0
    assert r["R@5"] == pytest.approx(100 / 3)


# ----------------------------------------------------------------------------- CIRCO
CIRCO_GALLERY = ["101", "102", "103", "104", "105", "106", "107", "108"]
CIRCO_SCORES = np.array(
    [
        # ranking: 101 .95, 103 .9, 102 .8, 105 .7, 104 .6, 107 .5, 106 0, 108 0
        [0.95, 0.8, 0.9, 0.6, 0.7, 0.0, 0.5, 0.0],
        # ranking: 104 .9, 108 .85, 102 .5, then the zeros in gallery order
        [0.0, 0.5, 0.0, 0.9, 0.0, 0.0, 0.0, 0.85],
    ]
)
CIRCO_GTS = [["103", "105", "107"], ["104", "108"]]


def test_circo_map_with_several_ground_truths():
    m = M.circo_map(CIRCO_SCORES, CIRCO_GALLERY, CIRCO_GTS, ks=(1, 2, 5, 10))
    # q0 relevance by rank: 0,1,0,1,0,1,0,0 ; |G| = 3 ; P@2 = 1/2, P@4 = 2/4, P@6 = 3/6
    #   AP@1 = 0 ; AP@2 = (1/2) / min(2,3) = 0.25 ; AP@5 = (1/2 + 2/4) / 3 = 1/3 ; AP@10 = 1.5 / 3 = 0.5
    # q1 relevance 1,1,0,... ; |G| = 2 ; AP@1 = 1/1 ; AP@2 = (1 + 1)/2 = 1 ; AP@5 = AP@10 = 1
    assert m["mAP@1"] == pytest.approx(50.0)
    assert m["mAP@2"] == pytest.approx((0.25 + 1) / 2 * 100)
    assert m["mAP@5"] == pytest.approx((1 / 3 + 1) / 2 * 100)
    assert m["mAP@10"] == pytest.approx(75.0)


def test_circo_reference_exclusion_and_missing_ground_truth():
    ex = M.circo_map(CIRCO_SCORES, CIRCO_GALLERY, CIRCO_GTS, ks=(5,), exclude=[["101"], ["102"]])
    # q0 without 101: 103, 102, 105, 104, 107 -> rel 1,0,1,0,1: (1 + 2/3 + 3/5) / 3 = 0.75556
    # q1 unchanged (102 was below both ground truths): 1.0
    assert ex["mAP@5"] == pytest.approx((((1 + 2 / 3 + 3 / 5) / 3) + 1) / 2 * 100)
    # a ground truth that is not in the gallery (107 missing) still counts in |G|
    gallery = [g for g in CIRCO_GALLERY if g != "107"]
    scores = np.delete(CIRCO_SCORES, CIRCO_GALLERY.index("107"), axis=1)
    m = M.circo_map(scores, gallery, CIRCO_GTS, ks=(10,))
    # q0 rel 0,1,0,1,0,0,0 -> (1/2 + 2/4) / 3 = 1/3 ; q1 = 1
    assert m["mAP@10"] == pytest.approx((1 / 3 + 1) / 2 * 100)


def test_ap_at_k_formula():
    flags = np.array([1, 0, 1, 1, 0], dtype=bool)
    # P@1 = 1, P@3 = 2/3, P@4 = 3/4; |G| = 10 -> divide by min(5, 10) = 5
    assert M.ap_at_k(flags, 5, 10) == pytest.approx((1 + 2 / 3 + 3 / 4) / 5)
    assert M.ap_at_k(flags, 5, 0) == 0.0


# ----------------------------------------------------------------------------- plain mAP
def test_mean_average_precision_variants():
    # one query, gallery of 5, ranking by score: g0, g1, g2, g3, g4 ; relevant: g0, g2, g4
    scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.5]])
    rel = np.array([[1, 0, 1, 0, 1]], dtype=bool)
    # full AP: (1 + 2/3 + 3/5) / 3
    full = (1 + 2 / 3 + 3 / 5) / 3
    assert M.mean_average_precision(scores, rel) == pytest.approx(full)
    # mAP@2 hashing convention: top 2 = g0, g1 -> one relevant retrieved -> 1 / 1 = 1
    assert M.mean_average_precision(scores, rel, top_n=2) == pytest.approx(1.0)
    # mAP@2 divided by all relevant (3) -> 1/3 ; by min(2, 3) -> 1/2
    assert M.mean_average_precision(scores, rel, top_n=2, denominator="relevant") == pytest.approx(1 / 3)
    assert M.mean_average_precision(scores, rel, top_n=2, denominator="min") == pytest.approx(1 / 2)
    # a ranking computed elsewhere gives the same numbers
    ranking = np.array([[0, 1, 2, 3, 4]])
    assert M.mean_average_precision(ranking, rel, is_ranking=True) == pytest.approx(full)
    # reversed ranking g4, g3, g2, g1, g0: P@1 = 1, P@3 = 2/3, P@5 = 3/5 -> same AP by symmetry
    assert M.mean_average_precision(ranking[:, ::-1], rel, is_ranking=True) == pytest.approx(full)


def test_mean_average_precision_empty_queries_and_ties():
    scores = np.array([[0.5, 0.5, 0.5], [0.1, 0.2, 0.3]])
    rel = np.array([[0, 0, 1], [0, 0, 0]], dtype=bool)
    # q0 all tie -> gallery order -> relevant at rank 3: AP = (1/3) / 1 ; q1 has no relevant item
    assert M.mean_average_precision(scores, rel) == pytest.approx(1 / 3)  # q1 skipped
    assert M.mean_average_precision(scores, rel, empty="zero") == pytest.approx(1 / 6)


def test_bad_inputs_are_clear_errors():
    with pytest.raises(InputError, match="gallery"):
        M.recall_at_k(np.zeros((1, 3)), ["a", "b"], [["a"]])
    with pytest.raises(InputError, match="NaN"):
        M.recall_at_k(np.array([[np.nan, 1.0]]), ["a", "b"], [["a"]])
    with pytest.raises(InputError, match="twice"):
        M.recall_at_k(np.zeros((1, 2)), ["a", "a"], [["a"]])
    with pytest.raises(InputError, match="targets"):
        M.recall_at_k(np.zeros((2, 2)), ["a", "b"], [["a"]])


# ----------------------------------------------------------------------------- the one evaluation core
def test_first_hit_ranks_ties_and_reference_removal_by_hand():
    from engine.eval.metrics import first_hit_ranks, recall_from_ranks

    scores = np.array([[0.5, 0.9, 0.5, 0.1],    # positive 2 ties with 0 (earlier in gallery order) -> rank 2
                       [0.9, 0.8, 0.7, 0.6],    # reference 0 removed, positive 3 -> rank 2 among 1, 2, 3
                       [0.3, 0.2, 0.1, 0.0]])   # no positive -> inf
    positive = np.array([[0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]], bool)
    exclude = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], bool)
    ranks = first_hit_ranks(scores, positive, exclude)
    assert ranks[0] == 2 and ranks[1] == 2 and np.isinf(ranks[2])
    # R@K counts a query without any target as a miss (it stays in the denominator)
    assert recall_from_ranks(ranks, (1, 3)) == {"R@1": 0.0, "R@3": pytest.approx(200 / 3)}


def test_one_query_first_hit_rank_equals_the_batched_one_ties_included():
    """The per-query rank the suite's and the CIR ranking use (engine.eval.cir.rank_queries) is the batched
    core's, row by row: scores drawn from a few values so ties are common, float32 like the embeddings."""
    from engine.eval.metrics import first_hit_rank, first_hit_ranks

    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, (300, 40)).astype(np.float32) / 5
    positive = rng.random((300, 40)) < 0.05
    batched = first_hit_ranks(scores, positive)
    assert np.isinf(batched).any() and (batched > 0).any()  # both cases occur
    assert [first_hit_rank(s, p) for s, p in zip(scores, positive)] == batched.tolist()
    assert first_hit_rank(np.array([0.5, 0.9, 0.5], np.float32), np.array([0, 0, 1], bool)) == 2.0


def test_average_precision_exclusion_and_empty_queries_by_hand():
    from engine.eval.metrics import average_precisions, map_at_n, mean_average_precision

    scores = np.array([[0.9, 0.8, 0.7, 0.6], [0.1, 0.2, 0.3, 0.4]])
    rel = np.array([[1, 1, 0, 1], [0, 0, 0, 0]], bool)
    # query 0 with its own item (gallery 0) removed: ranking 1, 2, 3 with relevant 1 and 3
    aps = average_precisions(scores, rel, exclude=np.array([[1, 0, 0, 0], [0, 0, 0, 0]], bool))
    assert aps[0] == pytest.approx((1 / 1 + 2 / 3) / 2) and np.isnan(aps[1])
    # empty relevant sets are skipped by default (docs/evaluation.md) and count 0 with empty="zero"
    full = (1 + 2 / 2 + 3 / 4) / 3
    assert mean_average_precision(scores, rel) == pytest.approx(full)
    assert mean_average_precision(scores, rel, empty="zero") == pytest.approx(full / 2)
    # the hashing mAP@N goes through the same core: a query with nothing relevant is skipped, not 0
    ql = np.array([[1, 0], [0, 1]], bool)
    dl = np.array([[1, 0], [0, 0], [1, 0]], bool)
    qv = np.array([[1.0, 0.0], [0.0, 1.0]])
    dv = np.array([[1.0, 0.0], [0.5, 0.5], [0.2, 0.0]])
    # query 0 ranks db 0 (rel), 1, 2 (rel): AP@3 = (1 + 2/3) / 2; query 1 has no relevant item
    assert map_at_n(ql, dl, 3, query_vectors=qv, db_vectors=dv) == pytest.approx((1 + 2 / 3) / 2)


def test_hubness_counts_top_k_occurrences_and_their_skew():
    import numpy as np

    from engine.eval.hubness import hubness, k_occurrence, skewness

    # 4 queries, 5 items: item 0 is in every top 2 (a hub) unless it is the query's own reference
    scores = np.array([[0.9, 0.8, 0.1, 0.0, 0.0],
                       [0.9, 0.0, 0.8, 0.1, 0.0],
                       [0.9, 0.0, 0.1, 0.8, 0.0],
                       [0.9, 0.1, 0.0, 0.0, 0.8]])
    assert k_occurrence(scores, 2).tolist() == [4, 1, 1, 1, 1]
    assert k_occurrence(scores, 2, exclude=[0, -1, -1, -1]).tolist() == [3, 1, 2, 1, 1]  # query 0 takes 1 and 2
    c = np.array([4, 1, 1, 1, 1], float)
    expect = ((c - c.mean()) ** 3).mean() / c.std() ** 3
    assert abs(skewness(c) - expect) < 1e-12 and expect > 1  # a long right tail
    h = hubness(scores, k=2)
    assert h["max_share"] == 1.0 and abs(h["skew"] - round(expect, 3)) < 1e-9
    assert skewness(np.ones(5)) == 0.0  # every item found equally often: no hubs
