"""End-to-end in a real Chromium: the searches a person runs in the demo, at desktop and phone widths,
with a screenshot of each step in test-artifacts/browser/."""
from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path

import pytest

import pageops as ui

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.browser
GALLERY = ROOT / "assets" / "gallery"
DOC_IMAGES = os.environ.get("CIS_WRITE_DOC_IMAGES") == "1"  # refresh docs/img/*.png from this run


def _basename_for_caption(caption: str, captions: dict) -> set:
    return {Path(p).name for p, c in captions.items() if c == caption}


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_search_click_result_switch_method_and_lattqe(served_demo, open_page, shot, viewport, gallery_engine):
    _, url = served_demo
    captions = ui.gallery_captions(GALLERY)
    page = open_page(url, viewport)
    shot(page, "opened")
    ui.open_accordion(page, "Why these results")

    reference = sorted((GALLERY / "animals").glob("*.jpg"))[0]
    ui.upload_reference(page, "", reference)
    ui.type_text(page, "", "the same but at night")
    ui.set_k(page, "", 6)
    shot(page, "reference-and-text")
    ui.run_search(page)
    res = ui.results(page)
    ui.check_ranked(res, 6)
    assert page.locator("#results .thumbnail-item img").count() == 6
    alts = page.locator("#results .thumbnail-item img").evaluate_all("els => els.map(e => e.alt)")
    assert all(a.startswith(f"#{i + 1} · ") for i, a in enumerate(alts)), alts  # captions double as alt text
    shot(page, "results")
    if viewport == "desktop" and DOC_IMAGES:
        (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        box = page.locator("#results").bounding_box()  # the page from its title down to the results
        page.screenshot(path=str(ROOT / "docs" / "img" / "demo.png"), full_page=True,
                        clip={"x": 0, "y": 0, "width": 1280, "height": box["y"] + box["height"] + 16})

    # a click on the third result makes it the reference
    old_src = page.locator("#reference img").first.get_attribute("src")
    clicked = res[2][2]
    page.locator("#results .thumbnail-item").nth(2).click()
    page.wait_for_function("old => { const i = document.querySelector('#reference img'); return i && i.src !== old; }",
                           arg=old_src)
    new_src = page.locator("#reference img").first.get_attribute("src")
    assert Path(new_src.split("?")[0]).name in _basename_for_caption(clicked, captions), (new_src, clicked)
    shot(page, "result-became-reference")

    # switch method: image only; the reference is left out of its own results (on by default) ...
    ui.choose(page, "method", "Image only")
    ui.type_text(page, "", "")
    ui.run_search(page)
    res = ui.results(page)
    ui.check_ranked(res, 6)
    assert clicked not in [c for _, _, c in res], res
    # ... and with the toggle off it finds itself first with a score of ~1
    page.locator("#exclude-reference input[type=checkbox]").uncheck()
    ui.run_search(page)
    res = ui.results(page)
    ui.check_ranked(res, 6)
    assert res[0][2] == clicked and res[0][1] > 0.99, res[0]
    assert "Image only" in ui.explanation(page, "")
    shot(page, "image-only")

    # text only: the text decides
    ui.choose(page, "method", "Text only")
    ui.type_text(page, "", "a photo of a cat")
    ui.run_search(page)
    res = ui.results(page)
    labels = json.loads((GALLERY / "labels.json").read_text())
    by_caption = {c: p for p, c in captions.items()}
    assert sum("cat" in labels.get(by_caption.get(c, ""), "") for _, _, c in res[:3]) >= 2, res
    shot(page, "text-only")

    # LAttQE: usable when its checkpoint exists, otherwise disabled with the reason shown
    box = page.locator("#lattqe input[type=checkbox]")
    if "lattqe" in gallery_engine.expanders_unavailable:
        assert box.is_disabled()
        info = page.locator("#lattqe").inner_text()
        assert "unavailable" in info and "LAttQE" in info
    else:
        box.check()
        ui.choose(page, "method", "Image + text")
        ui.run_search(page)
        assert "LAttQE" in ui.explanation(page, "")
        ui.check_ranked(ui.results(page), 6)
    shot(page, "lattqe")
    assert not page.cis_errors, page.cis_errors


def test_search_clicked_again_while_the_first_runs_shows_the_last_query(served_demo, open_page, shot):
    """A person changes the text and clicks Search again before the first search is back: the page must end
    with the second query's results. Gradio's default for a click drops one that comes while the same event
    runs (demo/ui.py, LATEST); the first search is held in the browser (its queue request paused) so the
    second click always comes while it runs."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    _, url = served_demo
    page = open_page(url, "desktop")
    ui.choose(page, "method", "Text only")
    ui.set_k(page, "", 3)
    ui.type_text(page, "", "a photo of a cat")
    ui.run_search(page)
    cats = ui.results(page)  # what the second query shows when run alone

    held = []

    def hold_first(route):  # the first search's queue request waits until released below
        if held:
            route.continue_()
        else:
            held.append(route)

    page.route("**/queue/join*", hold_first)
    before = ui.queries_shown(page)
    ui.type_text(page, "", "a red apple")
    page.click("#search")
    while not held:
        page.wait_for_timeout(50)
    ui.type_text(page, "", "a photo of a cat")
    page.click("#search")  # the first search is still running
    held[0].continue_()
    ui.wait_shown(page, before)  # the first query shown
    try:
        ui.wait_shown(page, before + 1)  # then the second
    except PlaywrightTimeout:
        pytest.fail("the second click on Search was dropped: the page shows the first query's results")
    page.unroute("**/queue/join*")
    assert ui.results(page) == cats
    assert page.locator("#text textarea").input_value() == "a photo of a cat"
    page.wait_for_function("() => document.querySelectorAll('#history tbody tr').length === 2")
    assert "a photo of a cat" in page.locator("#history tbody tr").nth(0).inner_text()
    link = page.locator("#share-link textarea, #share-link input").first.input_value()
    assert "cat" in link and "apple" not in link, link
    shot(page, "last-query-shown")
    assert not page.cis_errors, page.cis_errors


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_search_your_own_photos(served_demo, open_page, shot, viewport, tmp_path):
    demo, url = served_demo
    from engine.service import sessions_dir

    photos = sorted(GALLERY.rglob("*.jpg"))[::50][:6]
    archive = tmp_path / "my-photos.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for i, p in enumerate(photos):
            z.write(p, f"trip/{i:02d}-{p.name}")
    before = set(sessions_dir().iterdir())
    page = open_page(url, viewport)
    ui.open_tab(page, "own", "#own-upload input[type=file]")
    ui.upload_zip(page, archive)
    shot(page, "zip-chosen")
    page.click("#own-index")
    page.wait_for_function("() => document.querySelector('#own-status').innerText.includes('Indexed')")
    ui.wait_idle(page, "own-status")
    assert "Indexed 6 photos" in page.locator("#own-status").inner_text()
    shot(page, "indexed")
    new = set(sessions_dir().iterdir()) - before
    assert len(new) == 1 and (next(iter(new)) / "files" / "trip").is_dir()

    ui.open_accordion(page, "Why these results")
    ui.upload_reference(page, "own-", photos[3])
    ui.choose(page, "own-method", "Image only")
    ui.run_search(page, "own-")
    res = ui.results(page, "own-")
    ui.check_ranked(res, 5)  # k=12 but the session gallery has 6 photos, and the reference is left out
    own = f"03-{photos[3].name}"  # own photos have no captions: results show their file names
    assert own not in [c for _, _, c in res] and all(c.endswith(".jpg") for _, _, c in res), res
    page.locator("#own-exclude-reference input[type=checkbox]").uncheck()
    ui.run_search(page, "own-")
    res = ui.results(page, "own-")
    ui.check_ranked(res, 6)
    assert res[0][1] > 0.99 and res[0][2] == own, res
    shot(page, "searched-own-photos")
    # the top hit is photos[3] itself: its tile shows the same picture
    src = page.locator("#own-results .thumbnail-item img").first.get_attribute("src")
    assert src
    assert not page.cis_errors, page.cis_errors

    # closing the tab frees the session: Gradio deletes the state (and our callback its files) once the
    # closed session expires; the expiry is shortened here instead of waiting Gradio's default hour
    folder = next(iter(new))
    page.context.close()
    holder = demo.server_app.state_holder if hasattr(demo, "server_app") and demo.server_app else demo.app.state_holder
    deadline = time.time() + 30
    while time.time() < deadline and folder.exists():
        for sess in list(holder.session_data.values()):
            if sess.is_closed:
                sess.STATE_TTL_WHEN_CLOSED = 0
        time.sleep(0.5)
    assert not folder.exists(), "the session's photos were not deleted after the tab closed"
