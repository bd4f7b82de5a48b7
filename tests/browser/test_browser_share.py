"""Real Chromium: compare mode, the shareable link, export (JSON and contact sheet) and the history."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import pageops as ui

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
GALLERY = ROOT / "assets" / "gallery"
DOC_IMAGES = os.environ.get("CIS_WRITE_DOC_IMAGES") == "1"


def _share_link(page) -> str:
    page.wait_for_function("() => { const b = document.querySelector('#share-link textarea, #share-link input');"
                           " return b && b.value.includes('?'); }")
    return page.locator("#share-link textarea, #share-link input").first.input_value()


def _download(page, button: str, tmp_path: Path) -> Path:
    """Click an export button, then the file link it produces; returns the downloaded file."""
    old = page.locator("#export-file a").first.get_attribute("href") if page.locator("#export-file a").count() else None
    page.click(f"#{button}")
    page.wait_for_function(
        "old => { const a = document.querySelector('#export-file a'); return a && a.getAttribute('href') !== old; }",
        arg=old)
    with page.expect_download() as dl:
        page.locator("#export-file a").first.click()
    target = tmp_path / dl.value.suggested_filename
    dl.value.save_as(str(target))
    return target


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_compare_mode_marks_what_few_methods_found(served_demo, open_page, shot, viewport, gallery_engine):
    _, url = served_demo
    page = open_page(url, viewport)
    ui.upload_reference(page, "", sorted((GALLERY / "buildings").glob("*.jpg"))[0])
    ui.type_text(page, "", "at night")
    ui.set_k(page, "", 6)
    page.click("#compare")
    page.wait_for_selector("#compare-results .cmp-col")
    ui.wait_idle(page, "compare-results")
    assert not ui.toast_errors(page)
    available = [m for m, why in gallery_engine.methods().items() if why is None]
    cols = page.locator("#compare-results .cmp-col")
    ids = cols.evaluate_all("els => els.map(e => e.id)")
    same = {}
    for m in available:  # one column per available method, each with k results (or "Same results as") and its timing
        assert f"compare-col-{m}" in ids, (m, ids)
        col = page.locator(f"#compare-col-{m}")
        if col.locator(".cmp-same").count():
            same[m] = col.locator(".cmp-same").get_attribute("data-same-as")
            assert col.locator(".cmp-item").count() == 0 and "Same results as" in col.inner_text()
        else:
            assert col.locator(".cmp-item").count() == 6
        assert re.search(r"\d+ ms", col.locator(".cmp-time").inner_text())
    # an image is marked exactly when fewer than half of the different answers found it
    answers = [m for m in available if m not in same]
    seen = {}
    for m in answers:
        for item_id in page.locator(f"#compare-col-{m} .cmp-item").evaluate_all("els => els.map(e => e.dataset.id)"):
            seen[item_id] = seen.get(item_id, 0) + 1
    marked = page.locator("#compare-results .cmp-item").evaluate_all(
        "els => els.map(e => [e.dataset.id, e.classList.contains('shared')])")
    for item_id, is_marked in marked:
        assert is_marked == (2 * seen.get(item_id, 0) < len(answers)), (item_id, seen.get(item_id), len(answers))
    assert "⧉" not in page.locator("#compare-results").inner_text()
    shot(page, "compare")
    if viewport == "desktop" and DOC_IMAGES:
        page.locator("#compare-results").screenshot(path=str(ROOT / "docs" / "img" / "compare.png"))
    assert "view=compare" in _share_link(page)
    assert not page.cis_errors, page.cis_errors


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_shared_link_reopens_the_query_and_export(served_demo, open_page, shot, viewport, tmp_path):
    _, url = served_demo
    page = open_page(url, viewport)
    ui.open_accordion(page, "Why these results")
    ui.upload_reference(page, "", sorted((GALLERY / "animals").glob("*.jpg"))[5])
    ui.type_text(page, "", "in the snow")
    ui.set_k(page, "", 5)
    ui.run_search(page)
    first = ui.results(page)
    ui.check_ranked(first, 5)
    link = _share_link(page)
    assert link.startswith(url.rstrip("/")) and "k=5" in link and "text=in+the+snow" in link
    assert page.url.split("?", 1)[1] in link  # the address bar carries the same state
    shot(page, "searched")

    # export: JSON with the CLI schema, listing what the page shows; a contact sheet PNG
    exported = json.loads(_download(page, "export-json", tmp_path).read_text())
    assert {"method", "expand", "results", "timings_ms"} <= set(exported)
    assert [(r["rank"], round(r["score"], 3)) for r in exported["results"]] == [(r, s) for r, s, _ in first]
    assert [r.get("caption", "") for r in exported["results"]] == [c for _, _, c in first]
    sheet = _download(page, "export-png", tmp_path)
    from PIL import Image

    with Image.open(sheet) as im:
        assert im.format == "PNG" and im.width >= 200 and im.height >= 200
        assert len(set(im.convert("L").resize((64, 64)).getdata())) > 20  # pictures and text, not blank
    shot(page, "exported")

    # the link opened in a fresh browser restores the inputs and runs the query by itself
    other = open_page(link, viewport)
    other.wait_for_function("() => document.querySelectorAll('#results .caption-label').length === 5")
    ui.wait_idle(other, "results")
    assert ui.results(other) == first
    assert other.locator("#text textarea").input_value() == "in the snow"
    assert other.locator("#reference img").count() == 1
    shot(other, "link-reopened")
    assert not page.cis_errors and not other.cis_errors, (page.cis_errors, other.cis_errors)


def test_history_reruns_an_earlier_query(served_demo, open_page, shot):
    _, url = served_demo
    page = open_page(url, "desktop")
    ui.open_accordion(page, "Why these results")
    ui.choose(page, "method", "Text only")
    ui.set_k(page, "", 3)
    ui.type_text(page, "", "a red apple")
    ui.run_search(page)
    apples = ui.results(page)
    ui.type_text(page, "", "a photo of a cat")
    ui.run_search(page)
    cats = ui.results(page)
    assert cats != apples
    rows = page.locator("#history tbody tr")
    page.wait_for_function("() => document.querySelectorAll('#history tbody tr').length === 2")
    assert "a photo of a cat" in rows.nth(0).inner_text() and "a red apple" in rows.nth(1).inner_text()
    shot(page, "history")
    ui.run_query(page, rows.nth(1))
    assert ui.results(page) == apples
    assert page.locator("#text textarea").input_value() == "a red apple"
    shot(page, "history-rerun")
