"""The LAttQE box says so when its checkpoint's own validation queries scored below no expansion (the fact
comes from the engine, engine.expand.lattqe.validation_shortfall; the page only shows it)."""
import json

from engine.config import ASSETS
from engine.expand.lattqe import validation_shortfall


def test_keep_query_note_only_at_floor_one():
    from engine.expand.lattqe import keeps_query_note

    assert "keeps the query unchanged" in keeps_query_note({"config": {"weight_floor": 1.0}})
    assert keeps_query_note({"config": {"weight_floor": 0.6}}) is None
    guarded = keeps_query_note({"config": {"weight_floor": 1.0}, "floor_selection": {"cir_guard": {"allowed": [1.0]}}})
    assert "keeps the query unchanged" in guarded and "composed results worse" in guarded
    assert keeps_query_note({"config": {}}) is None and keeps_query_note(None) is None


def test_shortfall_only_when_validation_was_below_no_expansion():
    assert validation_shortfall({"val_map": 0.25, "val_map_none": 0.30}) == (
        "on its validation queries it scored below no expansion (mAP 0.250 vs 0.300), so it may make results worse")
    assert validation_shortfall({"val_map": 0.31, "val_map_none": 0.30}) is None
    assert validation_shortfall({"val_map": 0.30, "val_map_none": 0.30}) is None
    assert validation_shortfall({"best_epoch": 3}) is None and validation_shortfall(None) is None


def test_the_live_lattqe_box_shows_the_bundled_checkpoints_figures(gallery_engine):
    from demo import handlers as h

    # the image-only LAttQE's sidecar (the text-conditioned one, lattqe-text, has its own "-text" file)
    sidecar = json.loads(next(p for p in sorted((ASSETS / "checkpoints").glob("lattqe-packaged-*.json"))
                              if not p.stem.endswith("-text")).read_text())
    info = h.lattqe_info(gallery_engine)
    assert "lattqe" in gallery_engine.expanders  # the bundled checkpoint is live
    if sidecar["val_map"] < sidecar["val_map_none"]:
        assert f"mAP {sidecar['val_map']:.3f} vs {sidecar['val_map_none']:.3f}" in info and "below" in info
    else:
        assert "below" not in info
    # the shipped checkpoint's floor, chosen on validation, is 1 (0.348 with and without): the box says so
    assert ("keeps the query unchanged" in info) == (sidecar["config"].get("weight_floor") == 1.0)
    assert info.startswith("re-forms the query")
