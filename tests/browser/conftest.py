"""Real-browser fixtures: Debian's Chromium driven by Playwright for Python, against the demo served
in-process on a free loopback port. Screenshots go to ``test-artifacts/browser/`` (git-ignored).

The browser is the system package (``apt-get install chromium``, done by ``.ci/run``); Playwright's own
browser download is never used. ``CIS_CHROMIUM`` overrides the executable path."""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from serving import launch

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
TIMEOUT_MS = 90_000  # one search on a busy 2-core machine can take seconds


def chromium_path() -> str:
    found = os.environ.get("CIS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return found or ""


@pytest.fixture(scope="session")
def playwright_driver():
    exe = chromium_path()
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip("no Chromium executable (install the Debian package `chromium`, as .ci/run does, "
                    "or set CIS_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright for Python is not installed (pip install -r requirements-dev.txt)")
    pw = sync_playwright().start()
    yield pw, exe
    pw.stop()


@pytest.fixture()
def open_page(playwright_driver, tmp_path_factory):
    """Factory: ``open_page(url, "desktop"|"phone")`` -> a page in a fresh profile; all closed afterwards."""
    pw, exe = playwright_driver
    contexts = []

    def _open(url: str, viewport: str = "desktop"):
        profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path_factory.getbasetemp())
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=exe, headless=True, args=CHROMIUM_ARGS, viewport=VIEWPORTS[viewport],
            accept_downloads=True, permissions=["clipboard-read", "clipboard-write"])
        ctx.set_default_timeout(TIMEOUT_MS)
        contexts.append(ctx)
        page = ctx.pages[0] if ctx.pages else ctx.new_page()
        page.cis_errors = []
        page.on("pageerror", lambda exc: page.cis_errors.append(str(exc)))
        page.goto(url)
        page.wait_for_selector("#search")
        return page

    yield _open
    for ctx in contexts:
        ctx.close()


@pytest.fixture()
def shot(request):
    """``shot(page, "step")`` saves test-artifacts/browser/<test>-<step>.png (full page)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    test = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name).strip("-")
    counter = {"n": 0}

    def _shot(page, step: str, full_page: bool = True) -> Path:
        counter["n"] += 1
        path = ARTIFACTS / f"{test}-{counter['n']:02d}-{step}.png"
        page.screenshot(path=str(path), full_page=full_page)
        return path

    return _shot


@pytest.fixture(scope="session")
def served_demo(gallery_engine):
    """The demo over the bundled gallery (packaged backbone); yields (demo, url)."""
    from demo.ui import build_demo

    demo = build_demo(gallery_engine.settings, engine=gallery_engine)
    url = launch(demo, gallery_engine)
    yield demo, url
    demo.close()
