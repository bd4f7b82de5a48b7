"""`eval offline --only gallery-queries`: natural queries on the bundled gallery, hits in the top 5 per method."""
import json

import pytest


def _queries(labels, n=4):
    """Category changes built from the gallery's own labels: a photo of one kind, "a <other kind> instead", every
    photo of the other kind an answer."""
    by = {}
    for path, labs in labels.items():
        by.setdefault(labs[-1], []).append(path)
    kinds = sorted(k for k, v in by.items() if len(v) >= 3)[:2 * n]
    return [{"reference": by[a][0], "text": f"a {b} instead", "answers": by[b], "kind": "category"}
            for a, b in zip(kinds[::2], kinds[1::2])]


def test_counts_hits_in_the_top_5_per_method_and_learned_use(gallery_engine, gallery_labels, tmp_path):
    from engine.eval.gallery_queries import evaluate, load_queries, markdown
    from engine.search import search

    qs = _queries(gallery_labels)
    path = tmp_path / "q.json"
    path.write_text(json.dumps(qs))
    assert load_queries(path) == qs
    res = evaluate(gallery_engine, qs, methods=["text", "sum", "image"])
    # the count is the formula over the same search() the page uses
    id_of = {str(it["path"]): i for i, it in enumerate(gallery_engine.index.items)}
    want = 0
    for q in qs:
        ids = [r.id for r in search(gallery_engine, image=id_of[q["reference"]], text=q["text"], method="text", k=5,
                                    exclude_reference=True).results]
        want += len({id_of[a] for a in q["answers"]} & set(ids))
    assert res["text"]["hits"] == want and res["text"]["possible"] == sum(min(5, len(q["answers"])) for q in qs)
    assert res["sum"]["same_as_sum"] == len(qs) and not res["sum"]["learned"]
    assert res["image"]["by_kind"]["category"][1] == res["image"]["possible"]
    assert "| text |" in markdown(res, len(qs), "x")


def test_a_list_naming_a_photo_outside_the_gallery_is_refused(gallery_engine, tmp_path):
    from engine.eval.gallery_queries import evaluate, load_queries

    with pytest.raises(ValueError, match="not in the gallery"):
        evaluate(gallery_engine, [{"reference": "nope.jpg", "text": "x", "answers": ["a.jpg"]}], methods=["sum"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"reference": "a.jpg", "text": "x", "answers": []}]))
    with pytest.raises(ValueError, match="entry 0"):
        load_queries(bad)
