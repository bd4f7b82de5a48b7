"""Issue #33: logs that say what happened. A first start from the bundled gallery's prebuilt index says so in
one line (it used to read as four, among them "made 381 thumbnails" and "381 images, 381 cached, 0 to embed");
a later start says nothing about indexing; a repair is logged only when something was damaged."""
import logging


def _engine_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name.startswith("engine") and r.levelno >= logging.INFO]


def test_first_start_from_the_prebuilt_index_is_one_line(tmp_path, monkeypatch, caplog):
    from engine.config import Settings
    from engine.service import _open_default_engine

    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    settings = Settings()
    settings.backbone, settings.device = "packaged", "cpu"
    with caplog.at_level(logging.INFO):
        engine = _open_default_engine(settings)
    lines = _engine_lines(caplog)
    assert lines == [f"first start: the gallery index of {len(engine.index)} photos was made from the prebuilt "
                     "embeddings (nothing to embed)"], lines
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _open_default_engine(settings)  # a later start: the index is there, nothing to say
    assert _engine_lines(caplog) == []
    # one thumbnail damaged: the next build repairs it and says so (a warning), and only then
    from engine.index.build import index_source

    thumbs = sorted((tmp_path / "cache").rglob("thumbs/*.jpg"))
    thumbs[0].write_bytes(b"broken")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        index_source(settings.gallery, settings.resolved_index_dir(), engine.backbone, settings=settings)
    assert [m for m in _engine_lines(caplog) if "thumbnail" in m] == ["repaired 1 damaged or missing thumbnails"]


def test_a_gallery_changed_under_its_cached_index_is_indexed_again(tmp_path, monkeypatch, caplog):
    """A new version of the gallery (photos removed and added) under a cached index: the next start updates the
    index, so no removed photo is served and the added one is found; an unchanged gallery is not indexed again."""
    from PIL import Image

    from engine.config import Settings
    from engine.service import _open_default_engine

    gallery = tmp_path / "gallery"
    gallery.mkdir()
    for i, colour in enumerate(("red", "green", "blue")):
        Image.new("RGB", (64, 48), colour).save(gallery / f"p{i}.png")
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    settings = Settings()
    settings.backbone, settings.device, settings.gallery = "tiny:tiny-vit-a", "cpu", str(gallery)
    first = _open_default_engine(settings)
    assert sorted(it["path"] for it in first.index.items) == ["p0.png", "p1.png", "p2.png"]
    (gallery / "p1.png").unlink()
    Image.new("RGB", (64, 48), "yellow").save(gallery / "p3.png")
    with caplog.at_level(logging.INFO):
        again = _open_default_engine(settings)
    assert sorted(it["path"] for it in again.index.items) == ["p0.png", "p2.png", "p3.png"]
    assert any("1 photos added, 1 removed" in m for m in _engine_lines(caplog))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _open_default_engine(settings)
    assert _engine_lines(caplog) == []


def test_captions_reworded_under_a_cached_index_are_served_after_the_next_start(tmp_path, monkeypatch, caplog):
    """A new version of the gallery whose photos are the same but whose captions.json is reworded (the derived
    photos' captions in #33): the next start serves the new captions, says why it updated the index, and embeds
    nothing; a start after that says nothing."""
    import json

    from PIL import Image

    from engine.config import Settings
    from engine.service import _open_default_engine

    gallery = tmp_path / "gallery"
    gallery.mkdir()
    for i, colour in enumerate(("red", "green")):
        Image.new("RGB", (64, 48), colour).save(gallery / f"p{i}.png")
    (gallery / "captions.json").write_text(json.dumps({"p0.png": "a red square (derived from p9 by f(rgb))",
                                                       "p1.png": "a green square"}), encoding="utf-8")
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    settings = Settings()
    settings.backbone, settings.device, settings.gallery = "tiny:tiny-vit-a", "cpu", str(gallery)
    _open_default_engine(settings)
    (gallery / "captions.json").write_text(json.dumps({"p0.png": "a red square (a darkened version)",
                                                       "p1.png": "a green square"}), encoding="utf-8")
    with caplog.at_level(logging.DEBUG):
        again = _open_default_engine(settings)
    assert {it["path"]: it.get("caption") for it in again.index.items} == {
        "p0.png": "a red square (a darkened version)", "p1.png": "a green square"}
    lines = _engine_lines(caplog)
    assert any("(1 captions changed)" in m for m in lines), lines
    assert any("2 cached, 0 to embed" in r.getMessage() for r in caplog.records), "a caption must not re-embed"
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _open_default_engine(settings)
    assert _engine_lines(caplog) == []
