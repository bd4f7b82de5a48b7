"""Issue #35, part 3: a start that survives any damaged file in the cache, the checkpoints folder or the
defaults records: each is checked, reported in one line and rebuilt or ignored (the bundled file used).

Small inputs: an index of eight bundled photos; checkpoint copies with one value changed."""
import errno
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

import engine.checkpoints as ckpts
from engine.errors import IndexLoadError

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "assets" / "checkpoints"
SLUG = "packaged-efficientnet-lite0-all-minilm-l6-v2"




def _settings(gallery, index_dir, checkpoints=None, prepared=None):
    """``prepared``: the prepared-checkpoint folder (the ``isolated`` fixture's, so this machine's cache takes no
    part)."""
    from engine.config import Settings

    s = Settings()
    s.gallery, s.index_dir, s.backbone, s.device = str(gallery), str(index_dir), "packaged", "cpu"
    s.checkpoints = str(checkpoints or BUNDLED)
    s.prepared_dir = str(prepared or "")
    return s


# -- the index and its cache ----------------------------------------------------------------------------
def test_a_current_naming_a_version_too_long_for_the_file_system_is_a_damaged_index(tmp_path):
    from engine.index.store import GalleryIndex

    (tmp_path / "CURRENT").write_text("v" * 300 + "\n")
    with pytest.raises(IndexLoadError, match="names no version"):
        GalleryIndex.load(tmp_path)


def test_damaged_cache_rows_and_reordered_vectors_are_found_and_rebuilt(small_gallery, tmp_path, isolated,
                                                                         caplog):
    from engine.index.shards import cache_folder, read_shards, write_shard_file
    from engine.service import load_default_engine, vectors_problem

    out = tmp_path / "index"
    s = _settings(small_gallery, out, prepared=isolated / "prepared")
    engine = load_default_engine(s)
    assert vectors_problem(engine) is None
    fingerprint = engine.backbone.fingerprint
    good = {it["sha256"]: engine.index.embeddings[i].copy() for i, it in enumerate(engine.index.items)}

    # the cache as a damaged prebuilt file would leave it: every row on another image's hash, one row NaN
    cache = cache_folder(out, fingerprint)
    known = read_shards(cache)
    hashes = sorted(known)
    embs = np.stack([known[h][0] for h in reversed(hashes)]).astype(np.float16)
    embs[1] = np.nan
    for old in cache.glob("shard-*.npz"):
        old.unlink()
    write_shard_file(cache / "shard-0-prebuilt.npz", hashes, embs, [known[h][1] for h in hashes])
    shutil.rmtree(out / (out / "CURRENT").read_text().strip())
    (out / "CURRENT").write_text("x" * 300 + "\n")  # and a CURRENT no file system can open

    with caplog.at_level(logging.INFO):
        engine = load_default_engine(s)
    logged = [r.getMessage() for r in caplog.records]
    assert any("rows hold NaN or infinity" in m for m in logged), logged
    assert any("do not match its images" in m for m in logged), logged
    assert not any(r.exc_info for r in caplog.records)
    assert vectors_problem(engine) is None
    for i, it in enumerate(engine.index.items):
        assert float(engine.index.embeddings[i].astype(np.float32) @ good[it["sha256"]].astype(np.float32)) > 0.99


def test_a_full_disk_while_repairing_thumbnails_is_one_line(small_gallery, tmp_path, monkeypatch, caplog):
    from engine.images import load_image  # noqa: F401 - the repair decodes with it
    from engine.index import pipeline

    items = [{"sha256": f"{i:064x}", "path": p.name} for i, p in enumerate(sorted(small_gallery.iterdir()))]
    thumbs = tmp_path / "thumbs"
    thumbs.mkdir()

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pipeline, "atomic_write_bytes", full)
    monkeypatch.setattr(pipeline, "atomic_write_text", full, raising=False)
    with caplog.at_level(logging.WARNING):
        assert pipeline.repair_thumbnails(small_gallery, thumbs, items) == 0
    assert any("No space left" in r.getMessage() for r in caplog.records)


def test_a_thumbnail_overwritten_on_disk_is_not_served(gallery_index_dir, tmp_path):
    from engine.index.store import GalleryIndex

    out = tmp_path / "index"
    shutil.copytree(gallery_index_dir, out)
    index = GalleryIndex.load(out, build_vectors=False)
    thumb = index.thumb_path(0)
    assert index.display_path(0) == thumb
    thumb.write_bytes(b"garbage, not the thumbnail that was recorded")
    again = GalleryIndex.load(out, build_vectors=False)  # as after a restart
    assert again.display_path(0) == again.image_path(0)


# -- checkpoints ------------------------------------------------------------------------------------------
def _copy_with(dst: Path, part: str, edit_record=None, edit_tensors=None) -> Path:
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = BUNDLED / f"{part}-{SLUG}.safetensors"
    with safe_open(str(src), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    key = ckpts.RECORD_KEY
    record = json.loads(meta[key])
    if edit_record:
        edit_record(record)
    if edit_tensors:
        edit_tensors(tensors)
    dst.mkdir(parents=True, exist_ok=True)
    out = dst / src.name
    save_file(tensors, str(out), metadata={**meta, key: json.dumps(record)})
    shutil.copy(src.with_suffix(".json"), out.with_suffix(".json"))
    return out


def _bad_config(r):
    r["config"]["n_blocks"] = "four"


def _nan_anchor(r):
    r["anchor"]["weight"] = float("nan")


def _wrong_shapes(t):
    name = next(k for k, v in t.items() if v.ndim == 2 and not k.startswith("anchor"))
    t[name] = t[name][:-1].clone()


@pytest.mark.parametrize("damage", ["bad config value", "NaN anchor weight", "wrong tensor shapes"])
def test_a_damaged_rtic_checkpoint_falls_back_to_the_bundled_file(damage, gallery_index_dir, packaged, isolated,
                                                                   caplog):
    from engine.search import open_engine

    edits = {"bad config value": {"edit_record": _bad_config}, "NaN anchor weight": {"edit_record": _nan_anchor},
             "wrong tensor shapes": {"edit_tensors": _wrong_shapes}}[damage]
    folder = isolated / "mine"
    _copy_with(folder, "rtic", **edits)
    with caplog.at_level(logging.WARNING):
        engine = open_engine(gallery_index_dir, backbone=packaged, settings=_settings(BUNDLED, gallery_index_dir,
                                                                                      folder, isolated / "prepared"))
    assert "rtic" in engine.composers, engine.unavailable
    assert engine.composers["rtic"].record["file"] == f"rtic-{SLUG}.safetensors"
    rtic = engine.composers["rtic"]
    assert rtic.anchor is None or np.isfinite(rtic.anchor.config.weight)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert f"rtic-{SLUG}.safetensors" in logged
    assert not any(r.exc_info for r in caplog.records)


# -- defaults records ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [{"nqe": {"lattqe": "four"}}, {"nqe": [4, 8]}, {"nqe": {"lattqe": 2.5}},
                                 {"nqe_fraction": 1e308}, {"floor": {"lattqe": "high"}}, {"method": ["sum"]}])
def test_a_damaged_defaults_record_is_ignored_in_one_line(bad, packaged, isolated, caplog):
    from engine.config import Settings
    from engine.defaults import FALLBACK_FRACTION, engine_defaults, gallery_nqe

    folder = isolated / "mine"
    folder.mkdir()
    record = {"kind": "defaults", "backbone_fingerprint": packaged.fingerprint, "method": "sum",
              "nqe": {"lattqe": 4}, "nqe_fraction": 0.02, **bad}
    (folder / f"defaults-{SLUG}.json").write_text(json.dumps(record))

    s = Settings(checkpoints=str(folder), prepared_dir=str(isolated / "prepared"))
    with caplog.at_level(logging.WARNING):
        d = engine_defaults(packaged, s)
    assert d.evidence != record  # the damaged record is not used (the bundled one, or the fallback, is)
    assert any("ignored" in r.getMessage() for r in caplog.records)
    assert d.nqe_fraction <= 1.0
    assert gallery_nqe(d.nqe_for("lattqe"), 384, d.nqe_fraction) >= 1  # a search can use it (was OverflowError)
    assert FALLBACK_FRACTION <= 1.0


def test_a_full_disk_while_indexing_a_zip_session_is_one_sentence(gallery_engine, small_gallery, tmp_path,
                                                                  monkeypatch, caplog):
    import zipfile

    from engine import service
    from engine.errors import InputError

    z = tmp_path / "photos.zip"
    with zipfile.ZipFile(z, "w") as f:
        for p in sorted(small_gallery.iterdir())[:2]:
            f.write(p, p.name)

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(service, "index_source", full)
    with caplog.at_level(logging.WARNING), pytest.raises(InputError, match="disk is full"):
        service.build_session_engine(z, gallery_engine)
    assert not any(r.exc_info for r in caplog.records)
