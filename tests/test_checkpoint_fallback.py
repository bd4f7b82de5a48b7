"""Issue #27, checkpoints: a damaged checkpoint in CIS_CHECKPOINTS falls back to the valid bundled one for
every part (RTIC, Context-I2W, LAttQE, ICS), with one log line each; weights holding NaN or infinity are
refused with a sentence that says so; ``CIS_PREPARE_PARTS=rtic,bogus`` names 'bogus' as unknown and
prepares RTIC."""
import logging
import shutil
from pathlib import Path


import engine.checkpoints as ckpts

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "assets" / "checkpoints"
SLUG = "packaged-efficientnet-lite0-all-minilm-l6-v2"
PARTS = ["rtic", "context_i2w", "lattqe", "ics-64"]




def _engine(gallery_index_dir, packaged, checkpoints):
    """The engine whose Settings search ``checkpoints`` first, then an empty prepared folder beside it."""
    from engine.config import Settings
    from engine.search import open_engine

    s = Settings(checkpoints=str(checkpoints), prepared_dir=str(Path(checkpoints).parent / "prepared"))
    return open_engine(gallery_index_dir, backbone=packaged, settings=s)


def test_damaged_checkpoints_fall_back_to_the_bundled_ones(gallery_index_dir, packaged, isolated, caplog):
    damaged = isolated / "damaged"
    damaged.mkdir()
    for part in PARTS:
        src = BUNDLED / f"{part}-{SLUG}.safetensors"
        data = src.read_bytes()
        (damaged / src.name).write_bytes(data[: len(data) // 3])  # cut short, as by a full disk or a copy
        shutil.copy(src.with_suffix(".json"), damaged / src.with_suffix(".json").name)
    with caplog.at_level(logging.WARNING, logger="engine.checkpoints"):
        eng = _engine(gallery_index_dir, packaged, damaged)
    assert {"rtic", "context-i2w"} <= set(eng.composers), eng.unavailable
    assert "lattqe" in eng.expanders, eng.expanders_unavailable  # it was unavailable before
    assert eng.composers["rtic"].record["file"] == f"rtic-{SLUG}.safetensors"
    from engine.index.ics_index import find_ics_checkpoints

    hits = find_ics_checkpoints(64, str(damaged), packaged.fingerprint, packaged.embed_dim)
    assert hits and hits[0][0].parent == BUNDLED
    logged = " ".join(r.getMessage() for r in caplog.records)
    for part in PARTS:
        assert f"{part}-{SLUG}.safetensors" in logged, (part, logged[:2000])
    assert not any(r.exc_info for r in caplog.records)


def _nan_copy(src: Path, dst: Path) -> None:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(src), framework="pt") as f:
        meta = f.metadata()
    state = load_file(str(src))
    name = next(k for k, v in state.items() if v.is_floating_point() and v.numel() > 1)
    state[name] = state[name].clone()
    state[name].view(-1)[0] = float("nan")
    save_file(state, str(dst), metadata=meta)
    shutil.copy(src.with_suffix(".json"), dst.with_suffix(".json"))
    assert torch.isnan(load_file(str(dst))[name]).any()


def test_nan_weights_are_refused_with_a_sentence(gallery_index_dir, packaged, isolated, monkeypatch, caplog):
    bad = isolated / "nan"
    bad.mkdir()
    for part in ("rtic", "lattqe"):
        _nan_copy(BUNDLED / f"{part}-{SLUG}.safetensors", bad / f"{part}-{SLUG}.safetensors")
    # with the bundled ones present, the NaN files are passed over and the bundled ones load
    eng = _engine(gallery_index_dir, packaged, bad)
    assert "rtic" in eng.composers and "lattqe" in eng.expanders
    # without them, the methods are unavailable and say why
    empty = isolated / "no-bundled"
    empty.mkdir()
    monkeypatch.setattr(ckpts, "bundled_dir", lambda: empty)
    with caplog.at_level(logging.WARNING, logger="engine.checkpoints"):
        eng = _engine(gallery_index_dir, packaged, bad)
    assert "rtic" not in eng.composers and "lattqe" not in eng.expanders
    for reason in (eng.unavailable["rtic"], eng.expanders_unavailable["lattqe"]):
        assert "NaN or infinite weights" in reason and "\n" not in reason, reason
    assert "image" in eng.composers  # the training-free methods still work


def test_prepare_parts_names_an_unknown_part_and_prepares_the_known_one(gallery_engine, isolated):
    from engine.background import BackgroundPrepare

    bp = BackgroundPrepare(gallery_engine, budget=1.0, parts=["rtic", "bogus"], spec="packaged")
    assert bp.status.state["bogus"] == "unknown"
    bp._run()  # the bundled RTIC checkpoint is found: nothing is trained
    assert bp.status.state["rtic"] == "available", (bp.status.state, bp.status.error, bp.error)
    assert bp.status.state["bogus"] == "unknown"
    text = bp.markdown()
    assert "bogus" in text and "not a learned part" in text
    assert "failed" not in text
