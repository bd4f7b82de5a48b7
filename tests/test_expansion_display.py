"""What the page says about expansion (#28 point 1): rank changes only for results that moved relative to the
search without expansion (the reference left out of both the same way); an expansion that keeps the query is
said once, in words, with no zero-weight neighbour list and no arrows."""
import html

from engine.search import search


def _plain(md: str) -> str:
    return html.unescape(md)


def test_rank_before_expansion_is_the_rank_in_the_search_without_expansion(gallery_engine):
    eng = gallery_engine
    for keep in (False, True):
        plain = search(eng, image=7, text="at night", method="sum", k=30, exclude_reference=not keep)
        before = {r.id: r.rank for r in plain.results}
        resp = search(eng, image=7, text="at night", method="sum", k=8, expand="aqe", nqe=8,
                      exclude_reference=not keep)
        for r in resp.results:
            shown = r.explain["rank_before_expansion"]
            if before.get(r.id, 99) <= 8:  # it was among the results shown without expansion: its rank there
                assert shown == before[r.id], (keep, r.id)
            else:                          # it was not: "new after expansion" (or its rank beyond the top k)
                assert shown in (None, before.get(r.id)), (keep, r.id)


def test_an_expansion_that_keeps_the_query_shows_no_arrows_and_says_so_once(gallery_engine, monkeypatch):
    from demo.formatting import explanation_markdown, expansion_note, result_caption
    from engine.expand.base import Expansion

    eng = gallery_engine
    assert "lattqe" in eng.expanders, eng.expanders_unavailable
    lattqe = eng.expanders["lattqe"]
    floor = lattqe.model.config.weight_floor
    if floor is None or floor < 1.0:   # the shipped checkpoint's floor is 1; a kept query is forced otherwise
        monkeypatch.setattr(lattqe.model.config, "weight_floor", 1.0)
    plain = search(eng, image=7, text="at night", method="sum", k=8, exclude_reference=True)
    resp = search(eng, image=7, text="at night", method="sum", k=8, expand="lattqe", nqe=16, explain=True,
                  exclude_reference=True)
    assert [r.id for r in resp.results] == [r.id for r in plain.results]
    ex = resp.explanation["expansion"]
    assert ex["kept_query"] and ex["neighbours"] == [] and ex["used_neighbours"] == 0
    captions = [result_caption(r) for r in resp.results]
    assert not any("▲" in c or "▼" in c or "new after" in c for c in captions), captions
    md = _plain(explanation_markdown(resp))
    assert md.count("kept the query") == 1 and "0.000" not in md and "▲" not in md and "(was #" not in md
    note = _plain(expansion_note(resp.to_json()))
    assert note.startswith("For this query: LAttQE kept the query: its weight floor") and "validation" in note

    # an expander that moves things: arrows only on results whose rank changed, the note names its neighbours
    monkeypatch.setattr(type(lattqe), "expand", lambda self, q, nb, s: Expansion(
        vector=nb[3] / (nb[3] ** 2).sum() ** 0.5, weights=[0.0] * 3 + [1.0] + [0.0] * (len(nb) - 4)))
    moved = search(eng, image=7, text="at night", method="sum", k=8, expand="lattqe", nqe=16, explain=True,
                   exclude_reference=True)
    ex = moved.explanation["expansion"]
    assert not ex["kept_query"] and [n["weight"] for n in ex["neighbours"]] == [1.0]
    for r in moved.results:
        cap, before = result_caption(r), r.explain["rank_before_expansion"]
        assert ("▲" in cap) == (before is not None and before > r.rank), cap
        assert ("▼" in cap) == (before is not None and before < r.rank), cap
    assert _plain(expansion_note(moved.to_json())).startswith("For this query: LAttQE expanded the query with ")
