"""Issue #33: the first start with an empty cache stays under 30 s on 2 cores (measured by tools/first_start.py,
figure in docs/deploy.md). What a start used to spend for nothing, each kept away by a test here: importing
open_clip only to learn that its weights are not cached, re-embedding the index check's sample one photo at a
time, and loading the automatic method's members (RTIC, Context-I2W) a second time."""
import logging
import subprocess
import sys
from pathlib import Path

from engine.registry import Registry

ROOT = Path(__file__).resolve().parent.parent


def test_the_default_weights_are_looked_up_without_importing_open_clip():
    from open_clip.pretrained import get_pretrained_cfg

    from engine.backbones.openclip import DEFAULT_ARCH, DEFAULT_HUB_ID, DEFAULT_TAG, pretrained_hub_id

    assert DEFAULT_HUB_ID == get_pretrained_cfg(DEFAULT_ARCH, DEFAULT_TAG)["hf_hub"]  # open_clip's own table
    assert pretrained_hub_id("ViT-B-16", "laion2b_s34b_b88k") == get_pretrained_cfg("ViT-B-16", "laion2b_s34b_b88k")[
        "hf_hub"]
    code = ("import sys; from engine.backbones.openclip import DEFAULT_ARCH, DEFAULT_TAG, pretrained_cached; "
            "pretrained_cached(DEFAULT_ARCH, DEFAULT_TAG); print('open_clip' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_registry_hands_loaded_parts_only_to_a_factory_made_of_them():
    reg: Registry[object] = Registry("part")
    reg.register("plain")(lambda x: ("plain", x))
    reg.register("whole", reuses_loaded=True)(lambda x, loaded=None: ("whole", x, loaded))
    made = {"plain": reg.create("plain", 1, loaded={"a": 1})}  # a factory that takes no parts is not handed any
    made["whole"] = reg.create("whole", 2, loaded=made)
    assert made["plain"] == ("plain", 1)
    assert made["whole"] == ("whole", 2, {"plain": ("plain", 1)})
    assert reg.create("whole", 3)[2] == {}


def test_the_automatic_method_shares_the_composers_the_engine_loaded(gallery_engine):
    auto = gallery_engine.composers.get("auto")
    assert auto is not None, gallery_engine.unavailable.get("auto")
    shared = [n for n in auto.members if n in gallery_engine.composers]
    assert shared and {"rtic", "context-i2w"} & set(shared)
    for name in shared:
        assert auto.members[name] is gallery_engine.composers[name], name


def test_the_index_check_embeds_its_sample_in_one_pass_and_still_finds_swapped_rows(gallery_engine, monkeypatch):
    from engine import service

    backbone, calls = gallery_engine.backbone, []
    real = backbone.encode_images
    monkeypatch.setattr(backbone, "encode_images", lambda px: calls.append(len(px)) or real(px))
    assert service.vectors_problem(gallery_engine) is None
    assert calls == [service.VECTOR_SAMPLE]
    index = gallery_engine.index
    n = len(index)
    swapped = index.embeddings.copy()
    swapped[[0, n - 1]] = swapped[[n - 1, 0]]
    monkeypatch.setattr(index, "embeddings", swapped)
    assert "item 0" in service.vectors_problem(gallery_engine)


def test_the_app_shows_what_the_engine_says_at_start_and_not_every_library_line(capsys):
    """app.py logs the engine's INFO lines (the one "first start" line) and warnings; other libraries' INFO
    lines (each HTTP request, faiss's loader) stay quiet."""
    from demo.launch import show_engine_log

    show_engine_log()
    show_engine_log()  # twice: still one line per message
    try:
        logging.getLogger("engine.service").info("first start: made from the prebuilt embeddings")
        logging.getLogger("httpx").info("HTTP Request: GET /")
        logging.getLogger("faiss.loader").info("Loading faiss.")
        err = capsys.readouterr().err
    finally:
        for name in ("engine", "demo"):
            lg = logging.getLogger(name)
            for h in [h for h in lg.handlers if getattr(h, "_cis_console", False)]:
                lg.removeHandler(h)
            lg.setLevel(logging.NOTSET)
    assert err.count("first start: made from the prebuilt embeddings") == 1, err
    assert "HTTP Request" not in err and "faiss" not in err


def test_thumbnails_are_not_flushed_one_by_one_and_one_a_crash_emptied_is_made_again(small_gallery, tmp_path,
                                                                                       monkeypatch):
    """A first start writes ~400 thumbnails; flushing each to disk cost ~3.5 ms apiece. Only the checksums file
    is flushed; a thumbnail a crash left empty fails its checksum at the next start and is made again."""
    import os

    from engine.index import pipeline

    items = [{"sha256": f"{i:02d}" + "0" * 62, "path": p.name} for i, p in enumerate(sorted(small_gallery.iterdir()))]
    thumbs = tmp_path / "thumbs"
    thumbs.mkdir()
    synced, real = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    assert pipeline.repair_thumbnails(small_gallery, thumbs, items) == len(items) == 8
    assert len(synced) == 1  # the checksums, not each thumbnail
    first = sorted(thumbs.glob("*.jpg"))[0]
    good = first.read_bytes()
    first.write_bytes(b"")
    assert pipeline.repair_thumbnails(small_gallery, thumbs, items) == 1
    assert first.read_bytes() == good
