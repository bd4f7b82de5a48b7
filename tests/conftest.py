"""Shared fixtures: backbones and an index of the bundled gallery, built once per test session."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GALLERY = ROOT / "assets" / "gallery"

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a model hub


@pytest.fixture(scope="session")
def packaged():
    from engine.backbones import create_backbone

    return create_backbone("packaged", "cpu")


@pytest.fixture(scope="session")
def tiny():
    from engine.backbones import create_backbone

    return create_backbone("tiny:tiny-vit-a", "cpu")


@pytest.fixture(scope="session")
def gallery_labels():
    return json.loads((GALLERY / "labels.json").read_text())


@pytest.fixture(scope="session")
def gallery_index_dir(packaged):
    """The bundled gallery indexed with the packaged backbone. Kept in the cache folder between runs:
    the incremental indexer only re-embeds files whose content changed."""
    from engine.config import cache_dir
    from engine.index.build import index_source
    from engine.config import Settings

    from engine.prebuilt import seed_index

    out = cache_dir() / "test-gallery-index"
    seed_index(GALLERY, out, packaged)  # the shipped prebuilt embeddings (checked in test_examples_prebuilt.py)
    index_source(GALLERY, out, packaged, settings=Settings())
    return out


@pytest.fixture(scope="session")
def gallery_engine(gallery_index_dir, packaged, tmp_path_factory):
    from engine.config import Settings
    from engine.search import open_engine

    s = Settings()
    s.checkpoints = str(ROOT / "assets" / "checkpoints")
    return open_engine(gallery_index_dir, backbone=packaged, settings=s)


@pytest.fixture()
def noise_index(tmp_path):
    """A function (backbone, n, size, seed) -> (source folder, index folder): n random-noise PNGs indexed
    with ``backbone`` under ``tmp_path`` (for tests about index files, not retrieval)."""
    import numpy as np
    from PIL import Image

    from engine.index.build import index_source
    from engine.config import Settings

    def make(backbone, n: int, size: int, seed: int):
        src = tmp_path / "imgs"
        src.mkdir()
        rng = np.random.default_rng(seed)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(src / f"{i:02d}.png")
        out = tmp_path / "idx"
        index_source(src, out, backbone, workers=0, settings=Settings())
        return src, out

    return make


@pytest.fixture()
def small_gallery(tmp_path):
    """Eight small real photos from the bundled gallery, copied so tests may change them."""
    import shutil

    files = sorted(p for p in GALLERY.rglob("*.jpg"))[::40][:8]
    out = tmp_path / "photos"
    out.mkdir()
    for i, f in enumerate(files):
        shutil.copy(f, out / f"{i:02d}-{f.name}")
    return out


@pytest.fixture(scope="session")
def launch_demo():
    """``launch(demo, engine) -> base URL`` (no trailing slash): the app on a free loopback port, launched with
    app.py's options (``demo.launch.launch_options``: JSON route, middleware, size limit, served folders).
    The caller closes the demo."""
    from demo.launch import serve_in_process

    def launch(demo, engine) -> str:
        return serve_in_process(demo, engine).rstrip("/")

    return launch


@pytest.fixture(scope="module")
def app_server(gallery_engine, launch_demo):
    """The full demo over the bundled gallery, launched once per test module; yields its base URL."""
    from demo.ui import build_demo

    demo = build_demo(gallery_engine.settings, engine=gallery_engine)
    yield launch_demo(demo, gallery_engine)
    demo.close()


@pytest.fixture()
def isolated(tmp_path):
    """A folder for the test's checkpoints; its Settings name ``isolated / "prepared"`` as the prepared folder
    (no environment patch), so no prepared checkpoint of this machine's cache takes part. Every checkpoint file
    is checked afresh."""
    import engine.checkpoints as ckpts

    ckpts._VERIFIED.clear()
    yield tmp_path
    ckpts._VERIFIED.clear()
