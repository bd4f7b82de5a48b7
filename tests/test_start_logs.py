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
