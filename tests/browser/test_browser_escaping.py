"""Real Chromium: HTML and script in captions, file names, queries and shared links are shown as text and
never run. The gallery here is hostile on purpose: its file names and captions are markup."""
from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from urllib.parse import urlencode

import pytest

import pageops as ui

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
GALLERY = ROOT / "assets" / "gallery"
PAYLOADS = ['<img src=x onerror=window.__xss=1>', '<svg onload=window.__xss=2>', '<b onmouseover=window.__xss=3>bold',
            '<script>window.__xss=4</script>']
NO_SCRIPT_RAN = "() => window.__xss === undefined && !document.querySelector('img[src=\"x\"], svg[onload], b[onmouseover]')"


@pytest.fixture(scope="module")
def hostile_app(packaged, tmp_path_factory):
    from demo.ui import build_demo
    from engine.config import Settings
    from engine.index.build import index_source
    from engine.search import open_engine

    from serving import launch

    base = tmp_path_factory.mktemp("hostile")
    src = base / "gallery"
    src.mkdir()
    photos = sorted(GALLERY.rglob("*.jpg"))[::60][:4]
    captions = {}
    for i, (p, bad) in enumerate(zip(photos, PAYLOADS)):
        name = f"{i}{bad.replace('/', '_')}.jpg"  # a file name cannot hold '/'
        shutil.copy(p, src / name)
        captions[name] = f"caption {i} {bad}"
    (src / "captions.json").write_text(json.dumps(captions))
    s = Settings()
    s.checkpoints = str(ROOT / "assets" / "checkpoints")
    index_source(src, base / "index", packaged, settings=s, workers=0)
    engine = open_engine(base / "index", backbone=packaged, settings=s)
    demo = build_demo(s, engine=engine)
    url = launch(demo, engine)
    yield url, photos
    demo.close()


def _assert_inert(page):
    assert page.evaluate(NO_SCRIPT_RAN), "markup from the data was rendered as HTML"
    assert not page.cis_errors, page.cis_errors


def test_hostile_captions_names_queries_and_links_stay_text(hostile_app, open_page, shot):
    url, photos = hostile_app
    query = PAYLOADS[0] + " " + PAYLOADS[3]
    link = url + "?" + urlencode({"text": query, "method": "text", "k": 4})
    page = open_page(link, "desktop")  # a shared link carrying markup in its text
    page.wait_for_function("() => document.querySelectorAll('#results .caption-label').length === 4")
    ui.wait_idle(page, "results")
    captions = page.locator("#results .caption-label").all_inner_texts()
    assert sum(any(p in c for p in PAYLOADS) for c in captions) == 4, captions  # literal markup, as text
    assert page.locator("#text textarea").input_value() == query
    assert PAYLOADS[0] in page.locator("#history").inner_text()  # the label may be shortened
    _assert_inert(page)
    shot(page, "link-with-markup")

    # expansion lists the neighbours' file names in the explanation (Markdown, so HTML-capable)
    ui.open_accordion(page, "Why these results")
    ui.open_accordion(page, "Expansion options")
    ui.choose(page, "expander", "AQE")
    ui.type_text(page, "", PAYLOADS[1])
    ui.run_search(page)
    text = ui.explanation(page, "")
    assert sum(p.replace("/", "_") in text for p in PAYLOADS) >= 3, text
    _assert_inert(page)
    shot(page, "explanation-with-markup")

    # compare mode is an HTML block: captions and alt texts must arrive escaped
    page.click("#compare")
    page.wait_for_selector("#compare-results .cmp-col")
    ui.wait_idle(page, "compare-results")
    assert any(p in page.locator("#compare-results").inner_text() for p in PAYLOADS)
    _assert_inert(page)
    page.hover("#compare-results .cmp-item")
    _assert_inert(page)
    shot(page, "compare-with-markup")


def test_hostile_zip_names_in_messages_stay_text(hostile_app, open_page, shot, tmp_path):
    url, photos = hostile_app
    page = open_page(url, "desktop")
    ui.open_tab(page, "own", "#own-upload input[type=file]")
    # a broken image with a markup name: listed as skipped in the status message
    archive = tmp_path / "names.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(photos[0], "good.jpg")
        z.writestr(PAYLOADS[0] + ".jpg", b"not really a jpeg")
    ui.upload_zip(page, archive)
    page.click("#own-index")
    page.wait_for_function("() => document.querySelector('#own-status').innerText.includes('Skipped')")
    assert PAYLOADS[0] in page.locator("#own-status").inner_text()
    _assert_inert(page)
    shot(page, "skipped-name")
    # a refused archive: its entry name comes back inside the error message
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("/" + PAYLOADS[1] + ".jpg", b"x")
    page = open_page(url, "desktop")  # a fresh page: the first archive's file box is not reused
    ui.open_tab(page, "own", "#own-upload input[type=file]")
    ui.upload_zip(page, evil)
    page.click("#own-index")
    page.wait_for_selector("[data-testid=toast-body]")
    shot(page, "refused-name")
    _assert_inert(page)
    toast = " ".join(ui.toast_errors(page))
    assert "absolute path" in toast and PAYLOADS[1] in toast, f"the error message was rendered as HTML: {toast!r}"


def test_hostile_link_parameters_in_warnings_stay_text(hostile_app, open_page, shot):
    url, _ = hostile_app
    page = open_page(url + "?" + urlencode({"text": "a cat", "method": PAYLOADS[0]}), "desktop")
    page.wait_for_selector("[data-testid=toast-body]")
    shot(page, "bad-link-warning")
    _assert_inert(page)
    toast = " ".join(page.locator("[data-testid=toast-body]").all_inner_texts())
    assert PAYLOADS[0] in toast, f"the warning was rendered as HTML: {toast!r}"
