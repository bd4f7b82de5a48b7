"""One query object (engine.query.SearchRequest) and one contract for every route: the page's handlers, the
Gradio API, ``POST /api/search``, the CLI, share links, history and compare mode take the same limits and say
the same sentence; a clamped value is said (a notice), never silent; the reference rule travels with the query."""
from __future__ import annotations

import json

import pytest

from engine.errors import InputError
from engine.query import K_MAX, NQE_MAX, SearchRequest, limit_sentence

K_CLAMPED = f"{limit_sentence('k')}; 100000 was changed to {K_MAX}."
K_RAISED = f"{limit_sentence('k')}; -5 was changed to 1."


def test_build_clamps_and_says_so_and_refuses_what_is_not_a_number():
    req = SearchRequest.build(text="red", k=100000, alpha=1.5, nqe=100000)
    assert (req.k, req.alpha, req.nqe) == (K_MAX, 1.0, NQE_MAX)
    assert req.notices[1] == K_CLAMPED and len(req.notices) == 3
    low = SearchRequest.build(text="red", k=-5, nqe=-1, alpha=-0.5)
    assert (low.k, low.nqe, low.alpha) == (1, 0, 0.0) and K_RAISED in low.notices
    ok = SearchRequest.build(text="red", k=12.0, alpha=0.5)
    assert ok.k == 12 and ok.notices == []  # a slider's 12.0 is 12, nothing to say
    for bad in ("ten", float("nan"), float("inf"), True, None and 1):
        if bad is None:
            continue
        with pytest.raises(InputError, match="must be a whole number from 1 to"):
            SearchRequest.build(text="red", k=bad)
    with pytest.raises(InputError, match="the limit is 10"):
        SearchRequest.build(10, text="x" * 11)
    with pytest.raises(InputError, match="keep_reference must be true or false"):
        SearchRequest.build(text="red", keep_reference="yes")
    with pytest.raises(InputError, match="give a reference image"):
        SearchRequest.build(text="   ")


def test_page_handler_clamps_k_with_a_notice(gallery_engine):
    """The page and the Gradio API's /search: k=100000 is 200 results and says so (it was 48 silently on the
    page, refused in Gradio's words through the API); -5 says it became 1."""
    from demo import handlers as h

    _, expl, raw, ids, run = h.run_search(gallery_engine, None, "a cat", "text", 0.5, 100000, False, "none", 0)
    data = json.loads(raw)
    assert len(ids) == min(K_MAX, len(gallery_engine.index)) and data["notices"][0] == K_CLAMPED
    assert K_CLAMPED in expl.replace("&#x27;", "'") and run["request"].k == K_MAX
    _, _, raw, ids, _ = h.run_search(gallery_engine, None, "a cat", "text", 0.5, -5, False, "none", 0)
    assert len(ids) == 1 and json.loads(raw)["notices"][0] == K_RAISED


def test_the_number_boxes_hand_out_of_range_values_to_the_one_validation():
    import gradio as gr

    from demo.upload import QueryNumber

    assert QueryNumber(12).preprocess(100000) == 100000 and QueryNumber(12).preprocess(-5) == -5
    with pytest.raises(gr.Error, match="greater than maximum"):  # what a bounded Gradio input says instead
        gr.Slider(1, K_MAX).preprocess(100000)


def _client(engine):
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from demo.api import search_route

    return TestClient(Starlette(routes=[search_route(engine)]))


def test_json_route_has_the_same_limits_and_sentence(gallery_engine):
    client = _client(gallery_engine)
    r = client.post("/api/search", json={"text": "a cat", "method": "text", "k": 100000})
    assert r.status_code == 200 and r.json()["notices"][0] == K_CLAMPED
    assert len(r.json()["results"]) == min(K_MAX, len(gallery_engine.index))
    r = client.post("/api/search", json={"text": "a cat", "method": "text", "k": -5})
    assert r.status_code == 200 and r.json()["notices"][0] == K_RAISED and len(r.json()["results"]) == 1
    r = client.post("/api/search", json={"text": "a cat", "k": "ten"})
    assert r.status_code == 400 and r.json()["error"] == limit_sentence("k") + "."


def test_cli_has_the_same_limits_and_sentence(gallery_index_dir, capsys):
    from engine.cli import main as cli_main

    assert cli_main(["search", "--index", str(gallery_index_dir), "--text", "a cat", "--method", "text",
                     "--k", "-5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["notices"][0] == K_RAISED and len(out["results"]) == 1


def test_compare_mode_has_the_same_limits_and_sentence(gallery_engine):
    from demo import handlers as h

    _, raw, run = h.run_compare(gallery_engine, None, "a cat", 0.5, -5, False, 0)
    data = json.loads(raw)
    assert data["notices"] == [K_RAISED] and run["view"] == "compare"
    assert all(len(c["response"]["results"]) == 1 for c in data["columns"] if not c["error"])


def test_leave_the_reference_out_is_in_the_link_and_the_history(gallery_engine):
    """Unticking "Leave the reference out" is recorded (share link, history), and rerunning the link or the
    history entry searches exactly that: the reference kept, so image-only finds it first."""
    from demo import handlers as h

    image = str(gallery_engine.index.image_path(7))
    *_, run = h.run_search(gallery_engine, image, "", "image", 0.5, 3, False, "none", 0, False)
    assert run["data"]["results"][0]["id"] == 7
    rec = h.after_query(gallery_engine, run=run, history=[])
    assert "keep_reference=1" in rec.qs and "reference kept" in rec.history[0]["method"]

    class Req:
        query_params = dict(__import__("urllib.parse").parse.parse_qsl(rec.qs))

    out = h.restore_from_url(gallery_engine, [], Req())
    assert out.keep_out is False and out.ids[0] == 7 and out.run["request"].keep_reference
    again = h.rerun_history(gallery_engine, rec.history, 0)
    assert again.keep_out is False and again.ids[0] == 7
    # the default (left out) stays out of the link, and the restored search leaves it out
    *_, run = h.run_search(gallery_engine, image, "", "image", 0.5, 3, False, "none", 0, True)
    rec = h.after_query(gallery_engine, run=run, history=[])
    assert "keep_reference" not in rec.qs and 7 not in h.rerun_history(gallery_engine, rec.history, 0).ids


def test_a_restored_link_with_out_of_range_values_says_what_changed(gallery_engine):
    from demo import handlers as h

    class Req:
        query_params = {"text": "a cat", "method": "text", "k": "100000"}

    out = h.restore_from_url(gallery_engine, [], Req())
    assert out.k == K_MAX and json.loads(out.raw)["notices"][0] == K_CLAMPED


def test_a_file_that_is_not_an_image_is_said_on_upload(gallery_engine, tmp_path):
    from demo import handlers as h
    from engine.search import search

    fake = tmp_path / "notes.jpg"
    fake.write_text("this is a text file, not a photo\n" * 20)
    said = h.reference_problem(gallery_engine, str(fake))
    with pytest.raises(InputError) as exc:
        search(gallery_engine, image=str(fake), text="red")
    assert said and said == h.plain_message(exc.value)  # the same sentence as Search would give
    assert h.reference_problem(gallery_engine, str(gallery_engine.index.image_path(3))) is None
