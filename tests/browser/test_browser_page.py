"""Real Chromium: the page as a newcomer meets it. "Try one" examples run a search, the gallery picker sets
the reference (which is then left out of its own results), the phone layout keeps the method and every
caption readable without covering pictures, technical details wait in "About this engine", and the
Download box appears only with a file."""
from __future__ import annotations

import os
import re

from pathlib import Path
from urllib.parse import unquote

import pytest

import pageops as ui

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
GALLERY = ROOT / "assets" / "gallery"
DOC_IMAGES = os.environ.get("CIS_WRITE_DOC_IMAGES") == "1"  # write docs/img/example.png from this run


def _doc_image(page, path: Path, top: str, bottom: str) -> None:
    """The page from element ``top`` down to element ``bottom`` as a small palette PNG (docs/demo.md)."""
    import io

    from PIL import Image

    scrolled = page.evaluate("() => window.scrollY")  # boxes are read in the viewport, the clip in the page
    y0 = scrolled + page.locator(top).bounding_box()["y"] - 8
    end = page.locator(bottom).bounding_box()
    width = page.evaluate("() => document.documentElement.clientWidth")
    png = page.screenshot(full_page=True, clip={"x": 0, "y": y0, "width": width,
                                                "height": scrolled + end["y"] + end["height"] + 16 - y0})
    img = Image.open(io.BytesIO(png)).convert("RGB")
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)

# For each result picture: the share of its height, from the top, in which any point must show the picture
# itself (elementsFromPoint): something drawn over it may take at most its bottom 25 %.
COVERED = """
(sel) => {
  const out = [];
  for (const img of document.querySelectorAll(sel)) {
    img.scrollIntoView({block: 'center'});
    const r = img.getBoundingClientRect();
    if (r.width < 2 || r.height < 2) { out.push({alt: img.alt, problem: 'not shown'}); continue; }
    if (r.left < -1 || r.right > window.innerWidth + 1) { out.push({alt: img.alt, problem: 'outside the page width'}); }
    for (const fy of [0.05, 0.25, 0.5, 0.74]) {
      for (const fx of [0.1, 0.5, 0.9]) {
        const top = document.elementFromPoint(r.left + fx * r.width, r.top + fy * r.height);
        if (top !== img) {
          out.push({alt: img.alt, problem: `covered at ${fx},${fy} by ${top ? top.tagName + '.' + top.className : 'nothing'}`});
        }
      }
    }
  }
  return out;
}
"""

# Every caption shows all its text (no ellipsis, no clipping) and sits inside the page's width.
CUT_CAPTIONS = """
(sel) => [...document.querySelectorAll(sel)].filter(c => {
  const r = c.getBoundingClientRect();
  return c.scrollWidth > c.clientWidth + 1 || c.scrollHeight > c.clientHeight + 1 || r.right > window.innerWidth + 1
    || getComputedStyle(c).textOverflow === 'ellipsis' && c.scrollWidth > c.clientWidth;
}).map(c => c.innerText)
"""

# No box inside the results scrolls on its own (hiding results below its fold).
INNER_SCROLL = """
(sel) => [...document.querySelectorAll(sel + ' *')].filter(e => {
  const s = getComputedStyle(e);
  return ['auto', 'scroll'].includes(s.overflowY) && e.scrollHeight > e.clientHeight + 2;
}).map(e => e.className)
"""


def _caption_of(path: Path) -> str:
    return ui.gallery_captions(GALLERY)[path.relative_to(GALLERY).as_posix()]


def test_example_click_runs_a_search_and_download_appears_with_a_file(served_demo, open_page, shot, gallery_engine,
                                                                      tmp_path):
    from demo.handlers import example_queries

    _, url = served_demo
    page = open_page(url, "desktop")
    # plain words on the page; the backbone's fingerprint and the index type only in "About this engine"
    summary = page.locator("#plain-summary").inner_text()
    assert f"{len(gallery_engine.index)} photos" in summary and "@" not in summary and "packaged" not in summary, summary
    assert not page.locator("#backbone-info").is_visible()
    ui.open_accordion(page, "About this engine")
    about = page.locator("#backbone-info").inner_text()
    assert gallery_engine.backbone.fingerprint in about and "bytes per image" in about and "index" in about
    # the default method says why in one line; the LAttQE box shows the engine's note on its checkpoint
    from demo.formatting import LABELS
    from demo.handlers import lattqe_info

    default = gallery_engine.default_method  # read from the engine (engine.defaults), never hard-coded here
    assert page.locator("#method input[role=combobox]").input_value() == LABELS[default]
    why = page.locator("#method-why").inner_text()
    assert why.startswith(f"Method in use: {LABELS[default]}. Why: ") and not re.search(r"\d", why), why
    assert gallery_engine.defaults.why() in about  # the figures behind it, on demand
    assert lattqe_info(gallery_engine) in page.locator("#lattqe").inner_text()
    # nothing exported yet: no Download box taking space
    assert page.locator("#export-file").count() == 0 or not page.locator("#export-file").is_visible()
    shot(page, "opened")

    ui.open_accordion(page, "Why these results")
    examples = example_queries(gallery_engine)
    ref_id, text = examples[1]
    ui.run_query(page, page.locator("#examples .thumbnail-item").nth(1))
    assert page.locator("#text textarea").input_value() == text
    assert page.locator("#reference img").count() == 1
    res = ui.results(page)
    ui.check_ranked(res, 12)
    ref_caption = gallery_engine.index.items[ref_id]["caption"]
    assert ref_caption not in [c for _, _, c in res], (ref_caption, res)  # left out of its own results
    # the first search after the server started: every thumbnail is served from the index's thumbnails
    # folder itself (static path, no copy into Gradio's cache that could be missing) and answers 200
    thumbs = str((Path(gallery_engine.index.folder) / "thumbs").resolve())
    srcs = page.locator("#results .thumbnail-item img").evaluate_all("els => els.map(e => e.src)")
    assert len(srcs) == 12 and all(unquote(s).split("file=", 1)[1].startswith(thumbs) for s in srcs), srcs[:2]
    assert [page.request.get(s).status for s in srcs] == [200] * 12
    page.wait_for_selector("#history tbody tr")  # the rest of the search's chain: history, share link
    assert text in page.locator("#history").inner_text()
    shot(page, "example-ran")
    if DOC_IMAGES:  # an example's results, as a newcomer sees them after one click (docs/demo.md)
        _doc_image(page, ROOT / "docs" / "img" / "example.png", "#examples", "#results")

    # the Download box appears with the exported file
    page.click("#export-json")
    page.wait_for_selector("#export-file a")
    assert page.locator("#export-file").is_visible()
    assert ".json" in page.locator("#export-file").inner_text() and "KB" in page.locator("#export-file").inner_text()
    shot(page, "exported")
    assert not page.cis_errors, page.cis_errors


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_gallery_picker_sets_the_reference_left_out_of_its_results(served_demo, open_page, shot, viewport):
    _, url = served_demo
    page = open_page(url, viewport)
    ui.open_accordion(page, "Why these results")
    ui.open_accordion(page, "Pick the reference from the gallery")
    page.locator("#picker .thumbnail-item").nth(23).wait_for()  # the grid renders after the accordion opens
    assert page.locator("#picker .thumbnail-item").count() == 24  # browsable: the first page ...
    # ... whose every column fits its box (Gradio's fixed 100 px tracks cut the 4th column off at 1280 px)
    fit = page.evaluate("""() => {
      const grid = document.querySelector('#picker .grid-container');
      const edge = grid.getBoundingClientRect().right;
      const over = [...grid.querySelectorAll('.thumbnail-item')].filter(e => e.getBoundingClientRect().right > edge + 1);
      return {over: over.length, scroll: grid.scrollWidth - grid.clientWidth};
    }""")
    assert fit == {"over": 0, "scroll": 0}, fit
    assert "page 1 of " in page.locator("#picker-note").inner_text()
    page.click("#picker-next")
    page.wait_for_function("() => document.querySelector('#picker-note').innerText.includes('page 2 of ')")
    # ... and searchable: a word narrows the grid to the images whose caption or path has it
    page.fill("#picker-filter textarea, #picker-filter input", "jaguar")
    page.wait_for_function("() => document.querySelector('#picker-note').innerText.includes('jaguar')")
    ui.wait_idle(page, "picker")
    captions = page.locator("#picker .caption-label").all_inner_texts()
    assert captions and all("jaguar" in c.lower() for c in captions), captions
    shot(page, "picker-filtered")

    page.locator("#picker .thumbnail-item").first.click()
    page.wait_for_selector("#reference img")
    src = page.locator("#reference img").first.get_attribute("src")
    picked = [p for p in GALLERY.rglob("*.jpg") if p.name == Path(src.split("?")[0]).name]
    assert picked and _caption_of(picked[0]) == captions[0], (src, captions[0])
    ui.choose(page, "method", "Image only")
    ui.set_k(page, "", 12)
    ui.run_search(page)
    res = ui.results(page)
    ui.check_ranked(res, 12)
    assert captions[0] not in [c for _, _, c in res], res  # the CIRR convention: not its own result
    shot(page, "picked-and-searched")
    assert not page.cis_errors, page.cis_errors


def test_phone_width_keeps_method_and_captions_readable(served_demo, open_page, shot):
    _, url = served_demo
    page = open_page(url, "phone")
    ui.open_accordion(page, "Why these results")
    ui.upload_reference(page, "", sorted((GALLERY / "animals").glob("*.jpg"))[0])
    ui.type_text(page, "", "the same but at night")
    ui.choose(page, "method", "Image + text (weighted sum)")  # the longest method name, whatever the default
    ui.run_search(page)
    ui.check_ranked(ui.results(page), 12)
    # the method's name is shown whole in its dropdown, and its label is on the page
    box = page.locator("#method input[role=combobox]")
    assert box.input_value() == "Image + text (weighted sum)"
    assert box.evaluate("e => e.scrollWidth <= e.clientWidth"), "the method name is cut in its dropdown"
    label = page.locator("#method").get_by_text("Method", exact=True).bounding_box()
    assert label and label["x"] >= 0 and label["x"] + label["width"] <= 390
    # every result picture is visible in the page (no inner scroll box), no caption covers more than its
    # bottom quarter, and every caption is readable in full
    assert page.evaluate(INNER_SCROLL, "#results") == []
    assert page.evaluate(COVERED, "#results .thumbnail-item img") == []
    assert page.evaluate(CUT_CAPTIONS, "#results .caption-label") == []
    # the recent-queries table shows the method whole
    page.wait_for_selector("#history tbody tr")
    method_cell = page.locator("#history tbody tr").first.locator("td").last.inner_text()
    assert method_cell.strip() == "Image + text (weighted sum) · k=12", method_cell
    shot(page, "phone-results")
    # the same for the examples and the gallery picker
    assert page.evaluate(COVERED, "#examples .thumbnail-item img") == []
    ui.open_accordion(page, "Pick the reference from the gallery")
    page.wait_for_selector("#picker .thumbnail-item img")
    assert page.evaluate(COVERED, "#picker .thumbnail-item img") == []
    shot(page, "phone-picker")
    assert not page.cis_errors, page.cis_errors


def test_a_typed_k_out_of_range_is_said_not_silently_clamped(served_demo, open_page, shot):
    """Issue #33: k=-5 typed on the page silently became 1 (the slider's frontend clamped it); now the one
    validation (engine.query) clamps it and the page says so in the sentence every route uses."""
    from engine.query import K_MAX, limit_sentence

    _, url = served_demo
    page = open_page(url, "desktop")
    ui.type_text(page, "", "a red car")
    for typed, used in (("-5", 1), ("100000", K_MAX)):
        ui.set_k(page, "", typed)
        assert page.locator("#k input[type=number]").input_value() == typed  # not changed behind the user's back
        page.click("#search")
        said = ui.take_toast(page)
        assert f"{limit_sentence('k')}; {typed} was changed to {used}." in said, said
        page.wait_for_function("n => document.querySelector('#k input[type=number]').value === String(n)", arg=used)
        ui.wait_idle(page, "results")
    assert not page.cis_errors, page.cis_errors
