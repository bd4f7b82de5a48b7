"""Shareable query state (state -> URL -> state) and the exports (JSON schema, contact sheet PNG)."""
import io
import json
import math
import shutil
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import pytest
from PIL import Image

from engine import export as ex
from engine.errors import InputError
from engine.query import SearchRequest
from engine.search import search
from engine.share import (QueryState, from_query_string, reference_file, resolve_reference, share_url, state_for,
                          to_query_string)

STATES = [
    QueryState(image_id=12, text="the same but red", method="sum", alpha=0.35, k=8, expand="none", nqe=64),
    QueryState(image_hash="ab" * 32, text="à la plage & at night?=#%", method="context-i2w", alpha=0.5, k=200,
               expand="lattqe", nqe=7, view="compare"),
    QueryState(text="a cat", method="text", alpha=1.0, k=1, expand="alpha-qe", nqe=512, keep_reference=True),
    QueryState(image_id=3, text="a dog", negative_text="grass", expand="lattqe"),
    QueryState(image_id=0, text="", method="image", alpha=0.0, k=12),
]


@pytest.mark.parametrize("state", STATES)
def test_url_state_round_trip(state):
    qs = to_query_string(state)
    assert from_query_string(qs) == state
    assert from_query_string("?" + qs) == state
    url = share_url("https://example.org/demo/?old=1#frag", state)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path, parts.fragment) == ("https", "example.org", "/demo/", "")
    assert from_query_string(dict(parse_qsl(parts.query))) == state  # as gr.Request.query_params gives it
    assert "old" not in dict(parse_qsl(parts.query))


def test_url_parsing_ignores_unknown_and_rejects_bad_values():
    assert from_query_string("") is None
    assert from_query_string("__theme=dark&utm_source=mail") is None
    st = from_query_string("text=red&__theme=dark")
    assert st == QueryState(text="red")
    for bad, msg in [("image=file:/etc/passwd", "bad image"), ("image=sha256:xyz", "bad image"),
                     ("text=a&k=ten", "k \\(the number of results\\) must be a whole number from 1 to 200"),
                     ("text=a&method=rm%20-rf", "method"), ("text=a&view=admin", "view")]:
        with pytest.raises(InputError, match=msg):
            from_query_string(bad)


def test_state_from_ui_values_and_restore(gallery_engine, tmp_path):
    eng = gallery_engine
    # a file with a gallery image's content is shared by id, and restored to that id
    copy = tmp_path / "copy.jpg"
    shutil.copy(eng.index.image_path(5), copy)
    st = state_for(eng, SearchRequest.build(image=str(copy), text=" red ", method="sum", k=6, nqe=64))
    assert st.image_id == 5 and st.image_hash is None and st.text == "red"
    assert resolve_reference(eng, from_query_string(to_query_string(st))) == 5
    # an upload not in the gallery is shared by hash; restorable only while its features are cached
    up = tmp_path / "upload.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(up)
    st = state_for(eng, SearchRequest.build(image=str(up), text="red", method="sum", k=6, nqe=64))
    assert st.image_id is None and len(st.image_hash) == 64
    restored = from_query_string(to_query_string(st))
    with pytest.raises(InputError, match="no longer held"):
        resolve_reference(eng, restored)  # never searched, so its features are not cached
    first = search(eng, image=str(up), text="red", k=4)
    ref = resolve_reference(eng, restored)
    assert ref == str(up) and reference_file(eng, restored) == str(up)
    again = search(eng, image=ref, text="red", k=4)
    assert again.timings_ms["image_cache_hit"] == 1.0
    assert [r.id for r in again.results] == [r.id for r in first.results]
    with pytest.raises(InputError, match="gallery has"):
        resolve_reference(eng, QueryState(image_id=len(eng.index) + 3, text="x"))


def test_export_json_is_the_cli_json_schema(gallery_engine, gallery_index_dir, tmp_path, capsys):
    from engine.cli import main as cli_main

    resp = search(gallery_engine, image=7, text="at night", method="sum", k=3, explain=True,
                  exclude_reference=True)  # as the CLI does by default
    path = ex.export_json(resp.to_json(), tmp_path / "out" / "r.json")
    exported = json.loads(path.read_text())
    assert exported == json.loads(json.dumps(resp.to_json()))
    assert cli_main(["search", "--index", str(gallery_index_dir), "--image", "gallery:7", "--text", "at night",
                     "--k", "3", "--json", "--explain", "--backbone", "packaged", "--method", "sum"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert set(cli) == set(exported)
    assert [set(r) for r in cli["results"]] == [set(r) for r in exported["results"]]
    assert [r["id"] for r in cli["results"]] == [r["id"] for r in exported["results"]]
    assert [r["score"] for r in cli["results"]] == pytest.approx([r["score"] for r in exported["results"]], abs=1e-5)
    assert list(tmp_path.joinpath("out").iterdir()) == [path]  # atomic: no temporary file left behind
    with pytest.raises(InputError, match="run a search first"):
        ex.export_json({}, tmp_path / "x.json")


def _ink(img, box):
    """Fraction of clearly non-white pixels in a box."""
    a = np.asarray(img.crop(box).convert("L"))
    return float((a < 160).mean())


def test_contact_sheet_size_and_labels(gallery_engine, tmp_path):
    eng = gallery_engine
    resp = search(eng, image=7, text="at night", method="sum", k=7, explain=True)
    data = resp.to_json()
    cols, thumb = 3, 96
    path = ex.export_contact_sheet(data, eng.index.display_path, tmp_path / "sheet.png", columns=cols, thumb=thumb)
    img = Image.open(path)
    rows = math.ceil(7 / cols)
    assert img.size == (2 * ex.MARGIN + cols * thumb + (cols - 1) * ex.GAP,
                        2 * ex.MARGIN + ex.TITLE_H + ex.SECTION_H + rows * (thumb + ex.LABEL_H) + (rows - 1) * ex.GAP)
    labels = json.loads(img.text["cis:labels"])
    assert [lab["rank"] for lab in labels] == [1, 2, 3, 4, 5, 6, 7]
    for lab, r in zip(labels, data["results"]):
        assert lab["lines"][0] == f"#{r['rank']} · {r['score']:.3f}"
        assert " ".join(lab["lines"][1:]).rstrip("…") in r["caption"] or r["caption"].startswith(lab["lines"][1])
        x0, y0, x1, y1 = lab["box"]
        assert _ink(img, (x0, y0 + thumb, x1, y1)) > 0.005  # text was drawn under the image
        # the thumbnail pasted in the cell looks like the result's image (mean colour)
        src = Image.open(eng.index.display_path(r["id"])).convert("RGB")
        src.thumbnail((thumb, thumb))
        cell = img.crop((x0 + (thumb - src.width) // 2, y0 + (thumb - src.height) // 2,
                         x0 + (thumb - src.width) // 2 + src.width, y0 + (thumb - src.height) // 2 + src.height))
        assert np.abs(np.asarray(cell, np.float32).mean((0, 1)) - np.asarray(src, np.float32).mean((0, 1))).max() < 3
    assert data["results"][0]["caption"].split()[0] in img.text["Description"]
    # an empty cell position (8th of 9) stays blank
    x = ex.MARGIN + 1 * (thumb + ex.GAP)
    y = ex.MARGIN + ex.TITLE_H + ex.SECTION_H + 2 * (thumb + ex.LABEL_H + ex.GAP)
    assert _ink(img, (x, y, x + thumb, y + thumb + ex.LABEL_H)) == 0.0


def test_contact_sheet_of_a_compare_run_and_missing_images(gallery_engine, tmp_path):
    from engine.compare import compare

    res = compare(gallery_engine, image=7, text="red", k=2, lattqe=False).to_json()
    sheet = ex.contact_sheet(res, gallery_engine.index.display_path, columns=2, thumb=64)
    n = len(res["columns"])
    assert sheet.size == ex.sheet_size([2] * n, 2, 64)
    assert [lab["section"].split(" · ")[0] for lab in sheet.cis_labels] == [c["label"] for c in res["columns"]
                                                                          for _ in range(2)]
    # an image that vanished from disk is drawn as a placeholder, not an error
    sheet = ex.contact_sheet(res, lambda i: tmp_path / "gone.jpg", columns=2, thumb=64)
    assert len(sheet.cis_labels) == 2 * n
    png = ex.contact_sheet_png(sheet)
    assert Image.open(io.BytesIO(png)).size == sheet.size


def test_cli_explain_table_matches_breakdown(gallery_engine):
    resp = search(gallery_engine, image=7, text="at night", k=4, expand="aqe", nqe=8, explain=True)
    text = ex.format_explain(resp.to_json())
    rows = ex.breakdown_rows(resp.to_json())
    lines = [ln for ln in text.splitlines() if ln[:4].strip().isdigit()]
    assert len(lines) == 4
    for ln, row in zip(lines, rows):
        parts = ln.split()
        assert int(parts[0]) == row["rank"]
        assert float(parts[2]) == pytest.approx(row["image_similarity"], abs=6e-4)
        assert float(parts[3]) == pytest.approx(row["text_similarity"], abs=6e-4)
        assert row["path"] in ln
        assert ("new" in ln) == (row["rank_before_expansion"] is None)
