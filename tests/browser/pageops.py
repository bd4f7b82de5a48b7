"""Small helpers that drive the demo page the way a person does (click, type, upload) and read it back."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List, Tuple

CAPTION = re.compile(r"^#(\d+) · (-?\d+\.\d{3})(?: · (.*))?$", re.S)


def upload(page, elem_id: str, path) -> None:
    page.set_input_files(f"#{elem_id} input[type=file]", str(path))


def upload_zip(page, path) -> None:
    """Choose a zip in the own-photos tab's file box and wait until its upload has finished: the box then lists
    the file with its Clear button. While uploading, the box shows "Uploading 1 file..." and the whole name;
    once done, the name's stem and extension are separate elements (innerText "my-photos\\n.zip"), so a wait
    for the whole name in innerText passed only if it caught the short uploading state, and timed out when
    the upload was quicker than its first look (and a second upload found no file input: the box had a file)."""
    upload(page, "own-upload", path)
    page.wait_for_function(
        "name => { const box = document.querySelector('#own-upload');"
        " return !!box && !!box.querySelector('button[aria-label=Clear]')"
        " && box.innerText.replace(/\\s+/g, '').includes(name); }", arg=path.name)


def upload_reference(page, prefix: str, path) -> str:
    """Upload a reference image; returns the src of the image the page then shows."""
    upload(page, f"{prefix}reference", path)
    page.wait_for_selector(f"#{prefix}reference img")
    return page.locator(f"#{prefix}reference img").first.get_attribute("src")


def type_text(page, prefix: str, text: str) -> None:
    page.fill(f"#{prefix}text textarea", text)


def set_k(page, prefix: str, k: int) -> None:
    box = page.locator(f"#{prefix}k input[type=number]")
    box.fill(str(k))
    box.press("Enter")
    box.blur()


def choose(page, elem_id: str, label: str) -> None:
    """Pick an option of a Gradio dropdown by its visible label."""
    page.click(f"#{elem_id} input[role=combobox]")
    page.locator(f"#{elem_id} li[role=option]", has_text=label).first.click()
    page.wait_for_function(
        "([id, label]) => document.querySelector(`#${id} input[role=combobox]`).value.startsWith(label)",
        arg=[elem_id, label])


def open_tab(page, tab_id: str, ready: str) -> None:
    """Select a tab and wait until ``ready`` (a selector inside it) is in the page. A click that lands
    before the page's scripts are wired is lost without a trace, so the click is repeated until the tab
    says it is selected (``aria-selected``): the wait is on that state, not on a longer timeout."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    tab = page.locator(f"button[role=tab][data-tab-id={tab_id}]")
    for _ in range(30):
        tab.click()
        try:
            page.wait_for_selector(f"button[role=tab][data-tab-id={tab_id}][aria-selected=true]", timeout=2_000)
            break
        except PlaywrightTimeout:
            continue
    page.wait_for_selector(ready, state="attached")


def open_accordion(page, title: str) -> None:
    page.locator("button.label-wrap:visible", has_text=title).first.click()


def explanation(page, prefix: str) -> str:
    loc = page.locator(f"#{prefix}explanation")
    return loc.inner_text() if loc.count() else ""


def toast_errors(page) -> List[str]:
    return page.locator("[data-testid=toast-body]").all_inner_texts()


def take_toast(page) -> str:
    """Wait for the page's error toast, close every toast and return their text."""
    page.wait_for_selector("[data-testid=toast-body]")
    text = " ".join(toast_errors(page))
    for close in page.locator("[data-testid=toast-close]").all():
        close.click()
    page.wait_for_function("() => !document.querySelector('[data-testid=toast-body]')")
    return text


def wait_idle(page, elem_id: str, timeout: float = 90_000) -> None:
    """Wait until the component's progress tracker is hidden (its event finished)."""
    page.wait_for_function(
        "id => { const t = document.querySelector(`#${id} [data-testid=status-tracker]`);"
        " return !t || t.classList.contains('hide'); }", arg=elem_id, timeout=timeout)


def queries_shown(page, prefix: str = "") -> int:
    """How many queries the tab has finished showing: the count its last step after a query keeps on <body>
    (demo/ui.py, SET_URL_JS and OWN_SHOWN_JS)."""
    return int(page.evaluate("name => document.body.getAttribute(name) || '0'", f"data-{prefix}queries-shown"))


def wait_shown(page, before: int, prefix: str = "") -> None:
    """Wait until the tab has finished showing a query after the ``before``-th (:func:`queries_shown`): its
    results and every step after them (history, share link), or an error toast; then assert there is none.
    A changed explanation is no such signal: its progress text, or a previous query's later step, can change
    the page while the new query has not run yet."""
    page.wait_for_function(
        "([name, before]) => document.querySelector('[data-testid=toast-body]')"
        " || Number(document.body.getAttribute(name) || 0) > before",
        arg=[f"data-{prefix}queries-shown", before])
    errors = toast_errors(page)
    assert not errors, f"the page showed an error: {errors}"
    wait_idle(page, f"{prefix}results")


def run_query(page, target, prefix: str = "") -> None:
    """Click what runs a query (Search, an example, a recent query: a selector or a locator) and wait until it
    is shown (:func:`wait_shown`)."""
    before = queries_shown(page, prefix)
    (page.locator(target) if isinstance(target, str) else target).click()
    wait_shown(page, before, prefix)


def run_search(page, prefix: str = "", button: str = None) -> None:
    """Click Search and wait until its query is shown (:func:`wait_shown`)."""
    run_query(page, f"#{button or prefix + 'search'}", prefix)


def results(page, prefix: str = "") -> List[Tuple[int, float, str]]:
    """(rank, score, caption) of each result tile, parsed from its visible caption."""
    out = []
    for text in page.locator(f"#{prefix}results .caption-label").all_inner_texts():
        m = CAPTION.match(text.strip())
        assert m, f"result caption without rank and score: {text!r}"
        out.append((int(m.group(1)), float(m.group(2)), (m.group(3) or "").split(" · ")[0]))
    return out


def check_ranked(res, k: int) -> None:
    assert len(res) == k, f"expected {k} results, the page shows {len(res)}"
    assert [r for r, _, _ in res] == list(range(1, k + 1))
    scores = [s for _, s, _ in res]
    assert all(a >= b - 1e-3 for a, b in zip(scores, scores[1:])), scores


def gallery_captions(gallery: Path) -> dict:
    return json.loads((gallery / "captions.json").read_text())
