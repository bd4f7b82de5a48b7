"""Compare mode (one column per available method) and the per-result score breakdown."""
import json

import numpy as np
import pytest
import torch

from engine.compare import CompareColumn, bench_compare, column_key, compare, compare_plan, main
from engine.compose import Composition
from engine.errors import InputError
from engine.search import search


def _direct_query(engine, ref_id, text, alpha):
    """Image/text embeddings and the weighted-sum query, computed here without the composer."""
    from engine.images import load_image

    pil = load_image(engine.index.image_path(ref_id))
    with torch.no_grad():
        img = engine.backbone.encode_images(engine.backbone.preprocess(pil).unsqueeze(0))[0].float().numpy()
    img = img / np.linalg.norm(img)
    txt = engine.backbone.encode_texts([text]).embeddings[0].float().numpy()
    q = (1 - alpha) * img + alpha * txt
    return img, txt, q / np.linalg.norm(q)


def test_score_breakdown_matches_direct_computation(gallery_engine):
    eng, ref, text, alpha = gallery_engine, 7, "the same but at night", 0.4
    resp = search(eng, image=ref, text=text, method="sum", alpha=alpha, k=6, explain=True)
    img, txt, q = _direct_query(eng, ref, text, alpha)
    g = eng.index.embeddings.astype(np.float32)
    # the cosine less the hub correction the defaults record chose for the sum (engine.index.hubs)
    w = eng.defaults.hub_weight_for("sum")
    expected_order = np.argsort(-(g @ q - w * eng.index.hub_density()), kind="stable")[:6]
    assert [r.id for r in resp.results] == [int(i) for i in expected_order]
    for r in resp.results:
        v = g[r.id]
        assert r.explain["image_similarity"] == pytest.approx(float(v @ img), abs=2e-3)
        assert r.explain["text_similarity"] == pytest.approx(float(v @ txt), abs=2e-3)
        assert r.explain["composed_score"] == pytest.approx(float(v @ q), abs=2e-3)
        # the index agrees: its score is the cosine less the hub correction
        assert r.explain["composed_score"] - w * eng.index.hub_density()[r.id] == pytest.approx(r.score, abs=2e-3)
    # text-only query: no image similarity, and the composed score is the text similarity
    resp = search(eng, text=text, method="text", k=3, explain=True)
    for r in resp.results:
        assert r.explain["image_similarity"] is None
        assert r.explain["composed_score"] == pytest.approx(r.explain["text_similarity"], abs=1e-5)


def test_expansion_breakdown_rank_before_matches_first_pass(gallery_engine):
    from engine.export import breakdown_rows

    eng = gallery_engine
    k = 5
    resp = search(eng, image=3, text="a red one", method="sum", k=k, expand="aqe", nqe=16, explain=True)
    first = search(eng, image=3, text="a red one", method="sum", k=16)
    first_rank = {r.id: r.rank for r in first.results}
    rows = breakdown_rows(resp.to_json())
    assert len(rows) == k
    for row in rows:
        before = first_rank.get(row["id"])
        assert row["rank_before_expansion"] == before
        assert row["from_expanded_query"] == (before is None or before > k)
        assert row["rank_change"] == (None if before is None else before - row["rank"])


def test_compare_has_one_column_per_available_method(gallery_engine):
    eng = gallery_engine
    res = compare(eng, image=7, text="the same but red", k=5, lattqe=False)
    assert [c.key for c in res.columns] == list(eng.composers)
    for c in res.columns:
        assert c.error is None and c.wall_ms > 0
        direct = search(eng, image=7, text="the same but red", method=c.method, k=5)
        assert c.ids == [r.id for r in direct.results]
    # shared = exactly the ids that appear in two or more columns
    counts = {}
    for c in res.columns:
        for i in c.ids:
            counts[i] = counts.get(i, 0) + 1
    assert set(res.shared) == {i for i, n in counts.items() if n > 1}
    assert res.shared  # the image and sum columns both find the reference itself
    assert 7 in res.shared and set(res.shared[7]) >= {"image", "sum"}
    data = json.loads(json.dumps(res.to_json()))
    assert [c["key"] for c in data["columns"]] == list(eng.composers)
    assert set(data["columns"][0]["response"]) == set(search(eng, text="x", method="text", k=1).to_json())


def test_compare_follows_whatever_methods_and_lattqe_are_available(gallery_engine, monkeypatch):
    eng = gallery_engine

    class Opposite:
        """A stand-in learned composer: the negated reference embedding (so its ranking is reversed)."""

        def compose(self, query):
            v = -query.image_embedding.float()
            return Composition((v / v.norm()).numpy(), {"formula": "q = -img", "gate_mean": 0.25})

    monkeypatch.setitem(eng.composers, "opposite", Opposite())
    assert "lattqe" in eng.expanders  # the shipped checkpoint fits the packaged backbone
    plan = compare_plan(eng, lattqe=True)
    assert plan == [(m, "none") for m in eng.composers] + [(m, "lattqe") for m in eng.composers]
    res = compare(eng, image=7, text="red", k=4, lattqe=None)
    assert [c.key for c in res.columns] == list(eng.composers) + [column_key(m, "lattqe") for m in eng.composers]
    opp = res.column("opposite")
    g = eng.index.embeddings.astype(np.float32)
    worst = np.argsort(g @ g[7])[:4]  # least similar to the reference
    assert opp.ids == [int(i) for i in worst]
    assert opp.response.explanation["composer"]["gate_mean"] == 0.25
    # the same engine without a LAttQE checkpoint: by default no LAttQE columns; forced, a clear per-column reason
    monkeypatch.delitem(eng.expanders, "lattqe")
    monkeypatch.setitem(eng.expanders_unavailable, "lattqe", "no LAttQE checkpoint for this backbone")
    res = compare(eng, image=7, text="red", k=4, lattqe=None)
    assert [c.key for c in res.columns] == list(eng.composers)
    res = compare(eng, image=7, text="red", k=4, lattqe=True, methods=["sum"])
    assert [c.key for c in res.columns] == ["sum", "sum+lattqe"]
    assert res.columns[0].error is None and res.columns[1].ids == []
    assert res.columns[1].error and "no lattqe checkpoint" in res.columns[1].error.lower()


def test_compare_column_errors_and_query_errors(gallery_engine):
    res = compare(gallery_engine, text="a red apple", k=3, lattqe=False)
    by = {c.key: c for c in res.columns}
    assert by["image"].error and "reference image" in by["image"].error and by["image"].ids == []
    assert by["text"].error is None and len(by["text"].ids) == 3
    with pytest.raises(InputError, match="give a reference image"):
        compare(gallery_engine, text="   ")
    with pytest.raises(InputError):
        compare(gallery_engine, image=10 ** 6, text="red")


def test_compare_cli_json_and_bench(gallery_index_dir, gallery_engine, capsys):
    assert main(["--index", str(gallery_index_dir), "--image", "gallery:7", "--text", "the same but red",
                 "--k", "3", "--json", "--backbone", "packaged", "--lattqe", "off"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["key"] for c in data["columns"]] == list(gallery_engine.composers)
    assert all(r["id"] != 7 for c in data["columns"] for r in c["response"]["results"])  # reference left out
    assert main(["--index", str(gallery_index_dir), "--image", "gallery:7", "--text", "the same but red",
                 "--k", "3", "--json", "--backbone", "packaged", "--lattqe", "off", "--keep-reference"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["columns"][0]["response"]["results"][0]["id"] == 7  # kept: image only finds the reference first
    assert main(["--index", str(gallery_index_dir), "--text", "a cat", "--k", "2", "--backbone", "packaged",
                 "--lattqe", "off"]) == 0
    out = capsys.readouterr().out
    assert "Text only" in out and "total" in out
    assert main(["--index", str(gallery_index_dir), "--image", "gallery:99999", "--backbone", "packaged"]) == 1
    seconds = bench_compare(gallery_engine, repeats=1, k=4)
    assert 0 < seconds < 60


def test_compare_html_columns_shared_marks_and_alt_text(gallery_engine):
    from demo.formatting import column_dom_id, compare_html, esc

    data = compare(gallery_engine, image=7, text="the same but red", k=4, lattqe=False).to_json()
    html = compare_html(gallery_engine.index.display_path, data)
    for c in data["columns"]:
        assert html.count(f'id="{column_dom_id(c["key"])}"') == 1
        if c["key"] not in data["same_as"]:
            for r in c["response"]["results"]:
                assert f'alt="{esc(r["caption"])}"' in html
    # marked only when fewer than half of the different answers found it (found by most of them is no news)
    ran = [c for c in data["columns"] if not c["error"] and c["key"] not in data["same_as"]]
    found = {}
    for c in ran:
        for r in c["response"]["results"]:
            found[r["id"]] = found.get(r["id"], 0) + 1
    n_marked = sum(1 for c in ran for r in c["response"]["results"] if 2 * found[r["id"]] < len(ran))
    assert len(ran) >= 3 and data["answers"] == len(ran)
    assert html.count('class="cmp-item shared"') == n_marked > 0
    assert "⧉" not in html and "gate mean" not in html  # words, not symbols or internals
    assert column_dom_id("sum+lattqe") == "compare-col-sum-lattqe"
    evil = json.loads(json.dumps(data))
    evil["columns"][0]["response"]["results"][0]["caption"] = '<script>alert(1)</script>"'
    assert "<script>" not in compare_html(gallery_engine.index.display_path, evil)


def test_after_query_takes_and_gives_everything_by_name(gallery_engine):
    """The step after a search: named inputs (Gradio's inputs_kwargs) and a handlers.Recorded, which
    demo/ui.py wires to the outputs of the same names (a missing or extra name fails when the page is built)."""
    import gradio as gr

    from demo import handlers as h
    from demo.ui import _named

    image = str(gallery_engine.index.image_path(7))
    _, _, raw, _, run = h.run_search(gallery_engine, image, "at night", "sum", 0.5, 3, False, "aqe", 16)
    out = h.after_query(gallery_engine, run=run, history=[])
    assert isinstance(out, h.Recorded) and "expand=aqe" in out.qs and out.history[0]["qs"] == out.qs
    assert out.last["asked"]["text"] == "at night" and out.last["results"] == json.loads(raw)["results"]
    with gr.Blocks():
        boxes = {name: gr.Textbox() for name in ("qs", "history", "history_table", "last")}
        handler, outputs = _named(lambda: out, h.Recorded, boxes)
        assert outputs == list(boxes.values()) and handler()[boxes["qs"]] == out.qs
        assert all(v == gr.skip() for v in _named(lambda: None, h.Recorded, boxes)[0]().values())
        with pytest.raises(ValueError, match="Recorded"):
            _named(lambda: out, h.Recorded, {**boxes, "extra": gr.Textbox()})


def test_restore_from_link_and_history_rerun(gallery_engine):
    from demo import handlers as h

    class Req:
        query_params = {"image": "gallery:7", "text": "the same but red", "method": "sum", "alpha": "0.3", "k": "5",
                        "expand": "aqe", "nqe": "16", "__theme": "dark"}

    out = h.restore_from_url(gallery_engine, [], Req())
    assert isinstance(out, h.Restored)  # every page output by name (demo/ui.py wires them by these names)
    assert out.image == str(gallery_engine.index.image_path(7)) and out.text == "the same but red"
    assert (out.method, out.alpha, out.k, out.lattqe_on, out.expander, out.nqe) == ("sum", 0.3, 5, False, "aqe", 16)
    direct = search(gallery_engine, image=7, text="the same but red", method="sum", alpha=0.3, k=5, expand="aqe",
                    nqe=16, exclude_reference=True)  # as the page does by default
    ids = [r.id for r in direct.results]
    assert out.ids == ids and json.loads(out.raw)["results"] == out.last["results"]
    assert "Why each result" in out.explanation and out.compare_out == ""
    assert len(out.history) == 1 and out.history[0]["qs"] == out.qs and "view" not in out.qs
    # the same state as a compare link, then a click on the first history entry reruns the search
    Req.query_params = dict(Req.query_params, view="compare")
    out = h.restore_from_url(gallery_engine, out.history, Req())
    assert 'id="compare-col-sum"' in out.compare_out and out.ids == [] and len(out.history) == 2
    again = h.rerun_history(gallery_engine, out.history, 1)
    assert again.ids == ids
    assert h.rerun_history(gallery_engine, out.history, 5) is None  # not an entry: nothing changes
    # a broken link leaves the page as it is
    Req.query_params = {"image": "gallery:99999", "text": "x"}
    assert h.restore_from_url(gallery_engine, [], Req()) is None


def test_an_identical_column_says_same_as_and_is_not_counted_twice(gallery_engine):
    """Two methods with the same answer: the second column says "Same results as ..." instead of repeating it,
    and the marks count different answers (a majority made of copies is not a majority)."""
    from demo.formatting import compare_html, compare_summary_markdown

    res = compare(gallery_engine, image=7, text="the same but red", k=4, lattqe=False)
    first = res.columns[0]
    copy = CompareColumn("copy", first.method, "none", "A copy", 1.0, first.response)
    res.columns.append(copy)
    data = json.loads(json.dumps(res.to_json()))
    assert data["same_as"]["copy"] == first.key
    html = compare_html(gallery_engine.index.display_path, data)
    assert f"Same results as {first.label}." in html
    assert html.split('id="compare-col-copy"')[1].split("</section>")[0].count("cmp-item") == 0
    assert f"same results as {first.label}" in compare_summary_markdown(data)
    answers = data["answers"]
    assert answers == len({tuple(c.ids) for c in res.columns if c.response is not None}) < len(res.columns)
    for i, n in data["minority"].items():
        assert 2 * n < answers
