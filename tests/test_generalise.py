"""The held-out-domain suite (engine eval generalise) and the defaults chosen on it (engine.defaults)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from engine.data.heldout import words
from engine.data.vocabulary import training_texts, training_vocabulary
from engine.data.tone import edited_file
from engine.eval.generalise import (ATTRIBUTE_TEMPLATES, CATEGORY_TEMPLATES, EDITS, OLD_KINDS, bootstrap_interval,
                                    build_suite, held_out_photos, overall_score, summarise)

NOVEL = ["cheetah", "macaque", "windmill", "alpaca", "narwhal", "igloo", "petra", "gibbon", "lemur", "jaguar",
         "pika", "manta"]


def _png(path, seed):
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).save(path)


@pytest.fixture()
def fake_sets(tmp_path, monkeypatch):
    """Built captions + cir sets: held-out GCompris photos (novel names, one seen word 'fish', a colour word),
    training sources whose texts use 'fish', 'bird' and 'blue'."""
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("engine.data.builders.ensure_built", lambda *names, **kw: None)  # these stand-ins are the sets
    root = tmp_path / "cache" / "datasets"
    caps = []
    names = NOVEL + ["windmill", "fish", "mauve"]
    for i, name in enumerate(names):
        rel = f"photos/g{i}.png"
        _png(root / "captions" / "images" / rel, i)
        caps.append({"id": f"g{i}", "image": rel, "caption": f"{name}, a thing", "source": "gcompris-qt-data",
                     "group": f"photo:g{i}"})
    _png(root / "captions" / "images" / "photos/t0.png", 99)
    caps.append({"id": "t0", "image": "photos/t0.png", "caption": "A fish.", "source": "tuxpaint-stamps-default",
                 "group": "photo:t0"})
    for d in ("captions", "cir"):
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d / "manifest.json").write_text("{}")
    for split in ("train", "val", "test"):
        rows = caps if split == "train" else []
        (root / "captions" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        q = [{"id": f"{split}-q", "reference": "photos/t0.png", "targets": ["photos/t0.png"], "text": "make it blue",
              "kind": "recolour", "gallery": "photos"},
             {"id": f"{split}-c", "reference": "photos/t0.png", "targets": ["photos/t0.png"],
              "text": "a photo of a bird", "kind": "category", "gallery": "photos"}]
        (root / "cir" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in q))
        (root / "cir" / f"{split}_gallery.jsonl").write_text(
            json.dumps({"image": "photos/t0.png", "gallery": "photos", "source": "tuxpaint-stamps-default"}) + "\n")
    return tmp_path


def test_the_suite_holds_only_what_no_trainer_sees_and_its_sides_share_nothing(fake_sets):
    photos = held_out_photos()
    assert len(photos) == len(NOVEL) + 3 and all(p["source"] == "gcompris-qt-data" for p in photos)
    named = {p["name"] for p in photos if p["name"]}
    assert "fish" not in named and "mauve" not in named and set(NOVEL) == named  # seen word / colour left out
    vocab = training_vocabulary()
    assert {"fish", "blue", "bird"} <= vocab and not (vocab & set(NOVEL))
    sides = {s: build_suite(s) for s in ("val", "test")}
    seen = training_texts()
    files, cat_words, texts = {}, {}, {}
    for side, suite in sides.items():
        assert suite.queries, f"{side} side is empty"
        files[side] = {str(p) for k, p in suite.items.items() if k.startswith("category:")}
        cat_words[side] = set()
        texts[side] = {q["text"] for q in suite.queries}
        for q in suite.queries:
            assert q["text"].lower() not in seen
            assert q["reference"] not in q["targets"]
            if q["kind"] == "category":
                target_files = {str(suite.items[t]) for t in q["targets"]}
                names = {p["name"] for p in photos if str(p["image"]) in target_files}
                assert len(names) == 1 and not (words(next(iter(names))) & vocab)
                cat_words[side] |= names
                assert any(t.format("").strip() in q["text"] or t.split("{}")[0] in q["text"]
                           for t in CATEGORY_TEMPLATES[side])
            elif q["kind"] in OLD_KINDS:
                ref = suite.items[q["reference"]]
                assert [str(suite.items[t]) for t in q["targets"]] == [str(edited_file(ref, q["edit"]))]
        # every photo in every version is in the attribute gallery
        originals = [p for k, p in suite.items.items() if k.startswith("attribute:") and "tone" not in str(p)]
        assert len(suite.galleries["attribute"]) == len(originals) * (1 + len(EDITS))
    assert not (files["val"] & files["test"])           # disjoint by photo
    assert not (cat_words["val"] & cat_words["test"])   # and by the things named
    assert not (texts["val"] & texts["test"])           # and by phrasing
    assert sides["val"].summary()["by_kind"]["tint"] == 3 * len([p for p in photos if p["side"] == "val"])
    assert set(ATTRIBUTE_TEMPLATES["val"]) == set(ATTRIBUTE_TEMPLATES["test"]) == {"tint", "bw", "night", "sepia"}


def test_the_open_kinds_exist_on_both_sides_in_their_sides_words_only(fake_sets):
    from engine.data import open_vocab as ov
    from engine.data.tone import LIGHT_EDITS
    from engine.eval.generalise_open import OPEN_KINDS

    sides = {s: build_suite(s) for s in ("val", "test")}
    train_texts = {t["template"].lower() for fam in ov.FAMILIES
                   for e in ({"light": tuple(ov.LIGHT_CORES), "undo": tuple(ov.UNDO_CORES)}.get(fam, ("",)))
                   for t in ov.templates(fam, "train", e)}
    texts = {}
    for side, suite in sides.items():
        kinds = suite.summary()["by_kind"]
        assert all(kinds.get(k, 0) > 0 for k in OPEN_KINDS if k != "colour-new"), kinds  # noise: no object
        qs = [q for q in suite.queries if q["kind"] in OPEN_KINDS]
        texts[side] = {q["text"].lower() for q in qs}
        assert not texts[side] & train_texts
        for q in qs:
            assert q["gallery"] == "open" and q["reference"] not in q["targets"]
            files = [str(suite.items[t]) for t in q["targets"]]
            ref = suite.items[q["reference"]]
            if q["kind"] in ("light", "rephrased"):
                assert files == [str(edited_file(ref, q["edit"]))]
            if q["kind"] == "light":
                assert q["edit"] in LIGHT_EDITS
            if q["kind"] == "undo":
                assert str(ref) == str(edited_file(suite.items[q["targets"][0]], q["edit"]))
        comp = [q for q in qs if q["kind"] == "compositional"]
        assert any(len(q["targets"]) >= 1 and "object" in q["id"] for q in comp) and any("look" in q["id"] for q in comp)
    assert not texts["val"] & texts["test"]


def test_bootstrap_interval_and_scores_follow_their_definitions():
    hits = np.array([1] * 30 + [0] * 70)
    lo, hi = bootstrap_interval(hits)
    assert lo < 30 < hi and hi - lo == pytest.approx(2 * 1.96 * np.sqrt(0.3 * 0.7 / 100) * 100, rel=0.25)
    assert bootstrap_interval(np.ones(50)) == (100.0, 100.0)
    ranks = np.array([1, 5, 20, 1, 1, 30])
    kinds = np.array(["category", "category", "category", "bw", "bw", "bw"])
    s = summarise(ranks, kinds)
    assert s["category"]["R@1"] == pytest.approx(100 / 3) and s["category"]["R@10"] == pytest.approx(200 / 3)
    assert s["bw"]["R@10"] == pytest.approx(200 / 3) and s["all"]["n"] == 6
    assert s["overall"] == pytest.approx(overall_score(s)) == pytest.approx(
        ((100 / 3 + 200 / 3) / 2 + (200 / 3 + 200 / 3) / 2) / 2)


def test_search_uses_the_recorded_default_method_and_caps_nqe_by_the_gallery(tmp_path, tiny, noise_index):
    from engine.config import Settings
    from engine.defaults import engine_defaults, gallery_nqe, write_defaults
    from engine.search import open_engine, search

    _, idx = noise_index(tiny, 60, 32, 0)
    ck = tmp_path / "ck"
    s = Settings()
    s.checkpoints = str(ck)
    assert engine_defaults(tiny, s).source == ""                      # no record: the weighted sum
    write_defaults(tiny, {"method": "text", "nqe": {"aqe": 8}, "overall_val": {"text": 40.0}}, ck)
    other = write_defaults(type("B", (), {"name": "other", "fingerprint": "other@x"})(), {"method": "image"}, ck)
    assert other.is_file()                                           # another backbone's record is not read
    d = engine_defaults(tiny, s)
    assert d.method == "text" and d.nqe_for("aqe") == 8 and "held-out-domain" in d.why()
    assert gallery_nqe(8, 60, 0.02) == 1 and gallery_nqe(8, 1000, 0.02) == 8 and gallery_nqe(8, 10, 0.02) == 1
    eng = open_engine(idx, backbone=tiny, settings=s)
    assert eng.default_method == "text"
    r = search(eng, text="noise", k=3)                                # no method named: the default
    assert r.method == "text"
    r = search(eng, text="noise", method="sum", expand="aqe", k=3)    # nQE automatic: 8 capped at 2 % of 60
    assert r.explanation["expansion"]["nqe"] == 1
    r = search(eng, text="noise", method="sum", expand="aqe", k=3, nqe=5)   # an explicit value is kept
    assert r.explanation["expansion"]["nqe"] == 5


def test_the_default_method_is_the_best_text_capable_one_on_validation_with_ties_to_the_sum(monkeypatch):
    import engine.eval.generalise as g

    monkeypatch.setattr(g, "_expanders", lambda backbone, settings: {})

    def ev(scores):
        res = {(n, "none"): {"overall": v, "all": {"R@10": v}} for n, v in scores.items()}
        return {"side": "val", "results": res, "suite_obj": None, "tensors": (None, None, None), "kinds": None,
                "vectors": {}}

    assert g.choose(None, None, ev({"sum": 50.0, "rtic": 60.0, "image": 90.0}))["method"] == "rtic"  # image: no text alone
    assert g.choose(None, None, ev({"sum": 50.0, "rtic": 50.4, "text": 20.0}))["method"] == "sum"    # within 0.5
    assert g.choose(None, None, ev({"sum": 50.0, "context-i2w": 49.0, "text": 55.0}))["method"] == "text"
    with pytest.raises(ValueError):
        g.choose(None, None, {**ev({"sum": 1.0}), "side": "test"})                                 # never on test


def test_an_expanders_floor_keeps_the_query_when_no_neighbour_is_that_close(tmp_path, tiny, noise_index):
    from engine.config import Settings
    from engine.defaults import write_defaults
    from engine.search import open_engine, search

    _, idx = noise_index(tiny, 60, 32, 0)
    s = Settings()
    s.checkpoints = str(tmp_path / "ck")
    write_defaults(tiny, {"method": "sum", "nqe": {"aqe": 1}, "floor": {"aqe": 0.9999}}, tmp_path / "ck")
    eng = open_engine(idx, backbone=tiny, settings=s)
    plain = search(eng, text="noise", method="sum", k=5)
    kept = search(eng, text="noise", method="sum", expand="aqe", k=5, explain=True)
    ex = kept.explanation["expansion"]
    assert ex["kept_query"] and "0.9999" in ex["kept_because"] and ex["floor"] == 0.9999
    assert [r.id for r in kept.results] == [r.id for r in plain.results]
    write_defaults(tiny, {"method": "sum", "nqe": {"aqe": 1}, "floor": {"aqe": -1}}, tmp_path / "ck")
    eng = open_engine(idx, backbone=tiny, settings=s)
    moved = search(eng, text="noise", method="sum", expand="aqe", k=5, explain=True)
    assert not moved.explanation["expansion"]["kept_query"] and moved.explanation["expansion"]["used_neighbours"] == 1


def test_an_expander_that_moves_no_validation_answer_is_not_offered(tmp_path, tiny, monkeypatch):
    """choose() counts, per expander at its chosen defaults, the validation queries whose answer it moves; an
    expander that moves none is not offered (EngineDefaults.offers), one that does is."""
    import numpy as np

    import engine.eval.generalise as g
    from engine.defaults import EngineDefaults, engine_defaults, write_defaults

    calls = []

    def fake_rank(v, suite, gallery, gemb, pos, expander=None, nqe=0, fraction=1.0, floor=-1.0, hub=0.0, density=None):
        calls.append(expander)
        base = np.arange(1, len(v) + 1)
        return base + 1 if expander == "moves" else base

    monkeypatch.setattr(g, "rank_suite", fake_rank)
    ev = {"suite_obj": None, "tensors": (None, None, None), "vectors": {"sum": np.zeros((5, 2)), "rtic": np.zeros((5, 2))}}
    assert g._queries_changed(ev, "moves", 2, 0.9) == 10 and g._queries_changed(ev, "keeps", 2, 0.9) == 0
    write_defaults(tiny, {"method": "sum", "queries_changed": {"aqe": 0, "lattqe": 7}}, tmp_path)
    from engine.config import Settings

    s = Settings()
    s.checkpoints = str(tmp_path)
    d = engine_defaults(tiny, s)
    assert not d.offers("aqe") and d.offers("lattqe") and d.offers("none") and d.offers("alpha-qe")
    assert EngineDefaults().offers("aqe")  # no record: every expander is offered
