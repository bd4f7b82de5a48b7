"""Retrieval metrics for composed image retrieval (numpy only).

Every function starts from a score matrix ``scores`` of shape (Q, G) (higher = more similar)
and the list of gallery ids (length G), so the ranking used by every metric is the same one.

Tie-breaking (all functions): items with equal scores are ranked in **gallery order** (a stable
sort on ``-score``). The rank of a gallery item g for a query q is therefore

    rank(g) = #{h : s[h] > s[g]} + #{h < g : s[h] == s[g]}      (0-based, excluded items removed)

Conventions:
  * CIR metrics (FashionIQ, CIRR, CIRCO) are returned in **percent** (0..100), as the papers print them.
  * :func:`mean_average_precision` (labelled retrieval: query expansion, hashing) returns a
    fraction (0..1), as that literature prints it.
  * ``valid`` (optional, bool (Q,)): queries marked False (e.g. their reference image is missing)
    count as misses (recall 0, AP 0) and stay in the denominator.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from ..errors import InputError

FASHIONIQ_KS = (10, 50)
CIRR_KS = (1, 5, 10, 50)
CIRR_SUBSET_KS = (1, 2, 3)
CIRCO_KS = (5, 10, 25, 50)


# ----------------------------------------------------------------------------- helpers
def _check_scores(scores: np.ndarray, n_gallery: Optional[int] = None) -> np.ndarray:
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise InputError(f"scores must be a (queries x gallery) matrix, got shape {scores.shape}")
    if n_gallery is not None and scores.shape[1] != n_gallery:
        raise InputError(f"scores has {scores.shape[1]} gallery columns but {n_gallery} gallery ids were given")
    if np.isnan(scores).any():
        raise InputError("scores contain NaN; the ranking would be undefined")
    return scores


def _check_rows(name: str, values: Sequence, n_queries: int) -> None:
    if len(values) != n_queries:
        raise InputError(f"{name} has {len(values)} entries but scores has {n_queries} query rows")


def _valid_mask(valid: Optional[Sequence[bool]], n_queries: int) -> np.ndarray:
    if valid is None:
        return np.ones(n_queries, dtype=bool)
    mask = np.asarray(valid, dtype=bool)
    _check_rows("valid", mask, n_queries)
    return mask


def _index_of(gallery_ids: Sequence) -> Dict:
    index: Dict = {}
    for i, gid in enumerate(gallery_ids):
        if gid in index:
            raise InputError(f"gallery id {gid!r} appears twice in the gallery")
        index[gid] = i
    return index


def _as_list(x) -> List:
    if x is None:
        return []
    if isinstance(x, (str, bytes)) or not isinstance(x, Iterable):
        return [x]
    return list(x)


def rank_of(row: np.ndarray, target: int, excluded: Optional[np.ndarray] = None) -> int:
    """0-based rank of gallery index ``target`` in one score row, ties in gallery order.

    ``excluded`` (bool (G,)) removes items from the ranking (they neither count before the target
    nor can be the target; an excluded target returns -1).
    """
    if excluded is not None and excluded[target]:
        return -1
    s_t = row[target]
    idx = np.arange(row.shape[0])
    before = (row > s_t) | ((row == s_t) & (idx < target))
    if excluded is not None:
        before &= ~excluded
    return int(before.sum())


def ranked_indices(row: np.ndarray, k: Optional[int] = None, exclude: Iterable[int] = ()) -> np.ndarray:
    """Gallery indices of one score row, best first, ties in gallery order, ``exclude`` removed.

    With ``k`` only the first k are returned (computed without a full sort on big galleries;
    every item whose score reaches the k-th best is kept before the stable sort, so ties stay exact).
    """
    row = np.asarray(row)
    g = row.shape[0]
    excl = np.fromiter((int(e) for e in exclude), dtype=np.int64)
    need = g if k is None else min(g, int(k) + len(excl))
    if k is not None and g > 4 * need + 64:
        part = np.argpartition(-row, need - 1)[:need]
        threshold = row[part].min()
        cand = np.nonzero(row >= threshold)[0]  # ascending gallery order
    else:
        cand = np.arange(g)
    order = cand[np.argsort(-row[cand], kind="stable")]
    if len(excl):
        order = order[~np.isin(order, excl)]
    if k is not None:
        order = order[: int(k)]
    return order


# ----------------------------------------------------------------------------- target ranks / recall
def target_ranks(
    scores: np.ndarray,
    gallery_ids: Sequence,
    targets: Sequence,
    exclude: Optional[Sequence] = None,
    valid: Optional[Sequence[bool]] = None,
) -> np.ndarray:
    """Best (smallest) 0-based rank of any target per query; ``inf`` when no target can be found.

    targets[q]: one id or a list of ids. exclude[q]: ids removed from the ranking of query q
    (e.g. the reference image). Targets absent from the gallery, or excluded, are never found.
    """
    scores = _check_scores(scores, len(gallery_ids))
    q, g = scores.shape
    _check_rows("targets", targets, q)
    if exclude is not None:
        _check_rows("exclude", exclude, q)
    ok = _valid_mask(valid, q)
    index = _index_of(gallery_ids)
    ranks = np.full(q, np.inf)
    for i in range(q):
        if not ok[i]:
            continue
        excluded = None
        if exclude is not None:
            ex_idx = [index[e] for e in _as_list(exclude[i]) if e in index]
            if ex_idx:
                excluded = np.zeros(g, dtype=bool)
                excluded[ex_idx] = True
        best = np.inf
        for t in _as_list(targets[i]):
            if t not in index:
                continue
            r = rank_of(scores[i], index[t], excluded)
            if r >= 0:
                best = min(best, r)
        ranks[i] = best
    return ranks


def first_hit_ranks(scores: np.ndarray, positive: np.ndarray, exclude: Optional[np.ndarray] = None,
                    chunk: int = 1024) -> np.ndarray:
    """Vectorised :func:`target_ranks` for index-based data: (Q,) 0-based rank of the best-ranked positive
    per query (``inf`` when it has none), ties in gallery order, ``exclude`` (Q, G) bool removed from the
    ranking (reference removal; an excluded positive is not a positive)."""
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    if scores.shape != positive.shape or scores.ndim != 2:
        raise InputError(f"scores {scores.shape} and positives {positive.shape} must be the same (Q, G) shape")
    out = np.full(scores.shape[0], np.inf)
    idx = np.arange(scores.shape[1])[None]
    for s0 in range(0, scores.shape[0], chunk):
        sc, pos = scores[s0:s0 + chunk], positive[s0:s0 + chunk]
        excl = None if exclude is None else np.asarray(exclude[s0:s0 + chunk], dtype=bool)
        if excl is not None:
            pos = pos & ~excl
        has = pos.any(1)
        t = np.argmax(np.where(pos, sc, -np.inf), axis=1)  # first best positive = its best rank
        s_t = sc[np.arange(len(sc)), t][:, None]
        before = (sc > s_t) | ((sc == s_t) & (idx < t[:, None]))
        if excl is not None:
            before &= ~excl
        r = before.sum(1).astype(np.float64)
        r[~has] = np.inf
        out[s0:s0 + chunk] = r
    return out


def first_hit_rank(scores: np.ndarray, positive: np.ndarray) -> float:
    """:func:`first_hit_ranks` of one query without exclusions ((G,) scores and positives), without building
    (1, G) arrays: the 0-based rank of its best-ranked positive, ties in gallery order, ``inf`` without one."""
    if not positive.any():
        return np.inf
    t = int(np.argmax(np.where(positive, scores, -np.inf)))
    s_t = scores[t]
    return float(np.count_nonzero(scores > s_t) + np.count_nonzero(scores[:t] == s_t))


def recall_from_ranks(ranks: np.ndarray, ks: Sequence[int], prefix: str = "R@") -> Dict[str, float]:
    """Recall@K in percent: share of queries whose target rank is < K."""
    ranks = np.asarray(ranks, dtype=float)
    if ranks.size == 0:
        raise InputError("no queries to evaluate")
    return {f"{prefix}{k}": float((ranks < k).mean() * 100.0) for k in ks}


def recall_at_k(
    scores: np.ndarray,
    gallery_ids: Sequence,
    targets: Sequence,
    ks: Sequence[int] = FASHIONIQ_KS,
    exclude: Optional[Sequence] = None,
    valid: Optional[Sequence[bool]] = None,
) -> Dict[str, float]:
    """Recall@K (percent) with optional per-query exclusions."""
    return recall_from_ranks(target_ranks(scores, gallery_ids, targets, exclude, valid), ks)


def fashioniq_recall(
    scores: np.ndarray,
    gallery_ids: Sequence,
    targets: Sequence,
    ks: Sequence[int] = FASHIONIQ_KS,
    valid: Optional[Sequence[bool]] = None,
) -> Dict[str, float]:
    """FashionIQ protocol: R@10/R@50 over the category's image split, nothing excluded."""
    return recall_at_k(scores, gallery_ids, targets, ks, exclude=None, valid=valid)


def fashioniq_average(per_category: Dict[str, Dict[str, float]], ks: Sequence[int] = FASHIONIQ_KS) -> Dict[str, float]:
    """Mean of each R@K over the categories, plus ``avg`` = mean of those means (the papers' 'Avg.')."""
    if not per_category:
        raise InputError("no FashionIQ category was evaluated")
    out = {f"R@{k}": float(np.mean([m[f"R@{k}"] for m in per_category.values()])) for k in ks}
    out["avg"] = float(np.mean([out[f"R@{k}"] for k in ks]))
    return out


def cirr_recall(
    scores: np.ndarray,
    gallery_ids: Sequence,
    references: Sequence,
    targets: Sequence,
    ks: Sequence[int] = CIRR_KS,
    valid: Optional[Sequence[bool]] = None,
) -> Dict[str, float]:
    """CIRR Recall@K (percent) over the whole split gallery with the reference image removed."""
    exclude = [[r] for r in references]
    return recall_at_k(scores, gallery_ids, targets, ks, exclude=exclude, valid=valid)


def subset_ranks(
    scores: np.ndarray,
    gallery_ids: Sequence,
    references: Sequence,
    targets: Sequence,
    subsets: Sequence[Sequence],
    valid: Optional[Sequence[bool]] = None,
) -> np.ndarray:
    """Rank of the target among the img_set members (reference removed), ties in gallery order."""
    scores = _check_scores(scores, len(gallery_ids))
    q = scores.shape[0]
    for name, values in (("references", references), ("targets", targets), ("subsets", subsets)):
        _check_rows(name, values, q)
    ok = _valid_mask(valid, q)
    index = _index_of(gallery_ids)
    ranks = np.full(q, np.inf)
    for i in range(q):
        if not ok[i]:
            continue
        ref = references[i]
        members = sorted({index[m] for m in _as_list(subsets[i]) if m in index and m != ref})
        tgts = {index[t] for t in _as_list(targets[i]) if t in index and t != ref}
        if not members or not tgts:
            continue
        members = np.asarray(members)  # ascending gallery order -> stable ties
        order = members[np.argsort(-scores[i, members], kind="stable")]
        pos = [p for p, m in enumerate(order) if m in tgts]
        if pos:
            ranks[i] = pos[0]
    return ranks


def cirr_subset_recall(
    scores: np.ndarray,
    gallery_ids: Sequence,
    references: Sequence,
    targets: Sequence,
    subsets: Sequence[Sequence],
    ks: Sequence[int] = CIRR_SUBSET_KS,
    valid: Optional[Sequence[bool]] = None,
) -> Dict[str, float]:
    """CIRR Recall_subset@K (percent): ranking restricted to img_set members, reference removed."""
    ranks = subset_ranks(scores, gallery_ids, references, targets, subsets, valid)
    return recall_from_ranks(ranks, ks, prefix="Rsubset@")


# ----------------------------------------------------------------------------- average precision
def ap_at_k(relevant_flags: np.ndarray, k: int, n_relevant: int) -> float:
    """CIRCO AP@k = (1 / min(k, |G|)) * sum_{i<=k} P@i * rel(i); 0 when |G| = 0."""
    if n_relevant <= 0:
        return 0.0
    rel = np.asarray(relevant_flags[:k], dtype=float)
    if rel.size == 0:
        return 0.0
    precision = np.cumsum(rel) / np.arange(1, rel.size + 1)
    return float((precision * rel).sum() / min(k, n_relevant))


def circo_map(
    scores: np.ndarray,
    gallery_ids: Sequence,
    ground_truths: Sequence[Sequence],
    ks: Sequence[int] = CIRCO_KS,
    exclude: Optional[Sequence] = None,
    valid: Optional[Sequence[bool]] = None,
) -> Dict[str, float]:
    """CIRCO mAP@K (percent) with multiple ground truths per query.

    |G| is the number of ground truths in the annotation (as the official evaluation does), so a
    ground truth missing from the gallery lowers the score. ``exclude`` is off in the official
    protocol (the reference stays a candidate); pass references to remove them.
    """
    scores = _check_scores(scores, len(gallery_ids))
    q = scores.shape[0]
    _check_rows("ground_truths", ground_truths, q)
    if exclude is not None:
        _check_rows("exclude", exclude, q)
    if q == 0:
        raise InputError("no queries to evaluate")
    ok = _valid_mask(valid, q)
    index = _index_of(gallery_ids)
    gids = np.asarray(list(gallery_ids), dtype=object)
    kmax = max(ks)
    aps = {k: np.zeros(q) for k in ks}
    for i in range(q):
        if not ok[i]:
            continue
        gts = list(dict.fromkeys(_as_list(ground_truths[i])))
        ex = [index[e] for e in _as_list(exclude[i]) if e in index] if exclude is not None else []
        top = ranked_indices(scores[i], kmax, ex)
        gt_set = set(gts)
        flags = np.fromiter((gid in gt_set for gid in gids[top]), dtype=bool, count=len(top))
        for k in ks:
            aps[k][i] = ap_at_k(flags, k, len(gts))
    return {f"mAP@{k}": float(aps[k].mean() * 100.0) for k in ks}


def _ap_from_flags(flags: np.ndarray, n_relevant: np.ndarray, top_n: Optional[int], denominator: str) -> np.ndarray:
    """(Q,) AP from ranked relevance flags (Q, L) and the number of relevant items per query; NaN where
    the denominator is 0. The one AP formula of the project (see :func:`average_precisions`)."""
    flags = np.asarray(flags, dtype=bool)
    q, length = flags.shape
    f = flags.astype(np.float64)
    precision_sum = (np.cumsum(f, axis=1) / np.arange(1, length + 1)[None] * f).sum(1) if length else np.zeros(q)
    if denominator == "relevant":
        d = np.asarray(n_relevant, dtype=np.float64)
    elif denominator == "retrieved":
        d = f.sum(1)
    else:
        d = np.minimum(top_n if top_n is not None else length, np.asarray(n_relevant, dtype=np.float64))
    out = np.full(q, np.nan)
    ok = d > 0
    out[ok] = precision_sum[ok] / d[ok]
    return out


def average_precisions(
    scores_or_ranking: np.ndarray,
    relevance: np.ndarray,
    *,
    is_ranking: bool = False,
    top_n: Optional[int] = None,
    denominator: Optional[str] = None,
    exclude: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Per-query average precision for labelled retrieval; NaN where undefined.

    scores_or_ranking: (Q, G) scores, or with ``is_ranking`` a (Q, L) array of gallery indices
    best first (a ranking computed elsewhere, e.g. by an index). relevance: (Q, G) bool in gallery
    order. AP = (1/D) * sum_{i<=N} P@i * rel(i) where N = top_n (or the whole list) and D is:
      * "relevant": all relevant items of the query (default without top_n: classic AP),
      * "retrieved": relevant items found in the top N (default with top_n: the hashing mAP@N),
      * "min": min(N, relevant items) (the CIRCO normalisation).
    ``exclude`` (Q, G) bool (scores only): items removed from the query's ranking and relevance (the
    query's own item in leave-one-out retrieval). AP is NaN when D = 0 (query without relevant items);
    :func:`mean_average_precision` skips them.
    """
    rel = np.asarray(relevance).astype(bool)
    arr = np.asarray(scores_or_ranking)
    if rel.ndim != 2:
        raise InputError(f"relevance must be (queries x gallery), got shape {rel.shape}")
    if arr.ndim != 2 or arr.shape[0] != rel.shape[0]:
        raise InputError(f"scores/ranking shape {arr.shape} does not match relevance shape {rel.shape}")
    if denominator is None:
        denominator = "relevant" if top_n is None else "retrieved"
    if denominator not in ("relevant", "retrieved", "min"):
        raise InputError(f"unknown AP denominator {denominator!r}; use relevant, retrieved or min")
    if is_ranking:
        if exclude is not None:
            raise InputError("exclude applies to scores, not to a precomputed ranking")
        if arr.size and (arr.min() < 0 or arr.max() >= rel.shape[1]):
            raise InputError("ranking holds gallery indices outside the relevance matrix")
        order = arr.astype(np.int64)
    else:
        arr = _check_scores(arr, rel.shape[1]).astype(np.float64, copy=True)
        if exclude is not None:
            excl = np.asarray(exclude, dtype=bool)
            rel = rel & ~excl
            arr[excl] = -np.inf  # last in the ranking and never relevant: removed
        order = np.argsort(-arr, axis=1, kind="stable")  # ties in gallery order
    if top_n is not None:
        order = order[:, :top_n]
    flags = np.take_along_axis(rel, order, axis=1)
    return _ap_from_flags(flags, rel.sum(1), top_n, denominator)


def mean_average_precision(
    scores_or_ranking: np.ndarray,
    relevance: np.ndarray,
    *,
    is_ranking: bool = False,
    top_n: Optional[int] = None,
    denominator: Optional[str] = None,
    empty: str = "skip",
) -> float:
    """mAP (fraction 0..1) over queries; ``top_n`` gives mAP@N. See :func:`average_precisions`.

    empty="skip" leaves out queries whose AP is undefined (no relevant item; with the hashing
    denominator also: none retrieved in the top N), empty="zero" counts them as 0.
    """
    aps = average_precisions(scores_or_ranking, relevance, is_ranking=is_ranking, top_n=top_n, denominator=denominator)
    if empty == "zero":
        aps = np.nan_to_num(aps, nan=0.0)
    elif empty != "skip":
        raise InputError(f"unknown empty={empty!r}; use skip or zero")
    if np.all(np.isnan(aps)):
        return 0.0
    return float(np.nanmean(aps))


def top_k_ids(
    scores: np.ndarray,
    gallery_ids: Sequence,
    k: int,
    exclude: Optional[Sequence] = None,
    restrict: Optional[Sequence[Sequence]] = None,
) -> List[List]:
    """Top-k gallery ids per query (ties in gallery order), for submission files.

    exclude[q]: ids removed; restrict[q]: only these ids are candidates (CIRR subset ranking).
    """
    scores = _check_scores(scores, len(gallery_ids))
    index = _index_of(gallery_ids)
    gids = list(gallery_ids)
    out: List[List] = []
    for i in range(scores.shape[0]):
        ex = [index[e] for e in _as_list(exclude[i]) if e in index] if exclude is not None else []
        if restrict is not None:
            members = np.asarray(sorted({index[m] for m in _as_list(restrict[i]) if m in index} - set(ex)), dtype=np.int64)
            if members.size == 0:
                out.append([])
                continue
            order = members[np.argsort(-scores[i, members], kind="stable")][:k]
        else:
            order = ranked_indices(scores[i], k, ex)
        out.append([gids[j] for j in order])
    return out


# -- hashing: ranking by Hamming distance of packed codes (ICS, LSH, ITQ) -----------------------
def hamming_distances(query_codes: np.ndarray, db_codes: np.ndarray, bits: int) -> np.ndarray:
    """(Q, N) Hamming distances via the +-1 identity ``ham = (K - <s_q, s_d>) / 2``."""
    from ..index.ics import unpack_signs

    sq, sd = unpack_signs(query_codes, bits), unpack_signs(db_codes, bits)
    return np.rint((bits - sq @ sd.T) / 2).astype(np.int32)


def map_at_n(query_labels: np.ndarray, db_labels: np.ndarray, top: int, *, query_codes=None, db_codes=None,
             bits: int = 0, query_vectors=None, db_vectors=None, chunk: int = 256) -> float:
    """mAP@top (hashing convention, :func:`average_precisions` with ``denominator="retrieved"``): relevant =
    shares at least one label; queries with nothing relevant in the top are skipped (docs/evaluation.md).
    Ranking by Hamming distance of the codes (ties by db order, stable) or, with
    ``query_vectors``/``db_vectors``, by inner product."""
    ql, dl = np.asarray(query_labels, bool), np.asarray(db_labels, bool)
    aps = []
    for s in range(0, len(ql), chunk):
        if query_vectors is not None:
            sim = np.asarray(query_vectors[s:s + chunk], np.float32) @ np.asarray(db_vectors, np.float32).T
            order = np.argsort(-sim, axis=1, kind="stable")
        else:
            dist = hamming_distances(query_codes[s:s + chunk], db_codes, bits)
            order = np.argsort(dist, axis=1, kind="stable")
        relevant = (ql[s:s + chunk].astype(np.float32) @ dl.T.astype(np.float32)) > 0
        aps.append(average_precisions(order[:, :top], relevant, is_ranking=True, top_n=top))
    aps = np.concatenate(aps) if aps else np.zeros(0)
    return float(np.nanmean(aps)) if np.isfinite(aps).any() else 0.0


# -- approximate nearest-neighbour search: recall against exact search ---------------------------
def exact_top_ids(vectors: np.ndarray, queries: np.ndarray, k: int = 10) -> np.ndarray:
    """(Q, k) ids of exact inner-product search over ``vectors`` (ties in gallery order), the reference of
    :func:`approximate_recall`."""
    sim = np.asarray(queries, np.float32) @ np.asarray(vectors, np.float32).T
    return np.argsort(-sim, axis=1, kind="stable")[:, :k]


def approximate_recall(found_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """recall@k of an approximate index: per query, the share of the exact top-k (row of ``exact_ids``, k its
    length) among the ids it returned (row of ``found_ids``; -1 = no result, FAISS's filler), averaged over
    queries, as a fraction (0..1). No queries -> 0.0."""
    found, exact = np.asarray(found_ids), np.asarray(exact_ids)
    if len(found) != len(exact):
        raise InputError(f"found_ids has {len(found)} rows, exact_ids {len(exact)}")
    if len(exact) == 0 or exact.shape[1] == 0:
        return 0.0
    return float(np.mean([len(set(a[a >= 0].tolist()) & set(b.tolist())) / len(b) for a, b in zip(found, exact)]))
