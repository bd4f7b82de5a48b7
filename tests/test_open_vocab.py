"""The open-vocabulary operation set (engine.data.open_vocab, its builder) and its training hooks: words and
templates split disjointly, every built target really the edit its text names, train never holding a val /
test word or template."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from engine.data import builders, formats, open_vocab as ov, recolour
from engine.data.builders import common
from engine.data.tone import LIGHT_EDITS, PHOTO_EDITS, photo_edit

FAMILY_EDITS = {"light": tuple(ov.LIGHT_CORES), "undo": tuple(ov.UNDO_CORES)}
# categories on each side of the category split (checked below), so every side has category rows
CATS = {"train": ("bird", "fish", "fruit"), "val": ("nut", "road sign"), "test": ("tool", "musical instrument")}
BODIES = [(230, 40, 40), (40, 80, 220), (240, 200, 30), (40, 200, 60)]


def _disc(body, size=64):
    arr = np.zeros((size, size, 4), np.uint8)
    yy, xx = np.mgrid[:size, :size]
    disc = (yy - size / 2) ** 2 + (xx - size / 2) ** 2 < (size * 0.38) ** 2
    arr[disc, :3] = body
    arr[disc, 3] = 255
    return Image.fromarray(arr, "RGBA")


@pytest.fixture()
def built(tmp_path, monkeypatch):
    """The open_vocab set built from synthetic cut-out photos (4 per category), plus one held-out photo."""
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    items = []
    for side, cats in CATS.items():
        for cat in cats:
            for j in range(4):
                key = f"{cat.replace(' ', '_')}_{j}"
                path = common.save_image(_disc(BODIES[j]), tmp_path / "photos" / key)
                items.append(common.PhotoItem(key=key, path=path, source="test", version="1", ref=key,
                                              licence="CC0", labels=(cat,), caption=f"a {cat}", category=cat,
                                              group=f"photo:{key}"))
    held = common.save_image(_disc(BODIES[0]), tmp_path / "photos" / "held")
    items.append(common.PhotoItem(key="held", path=held, source="gcompris-qt-data", version="1", ref="held",
                                  licence="CC0", labels=("bird",), caption="a bird", category="bird", group="g:held"))
    manifest = builders.build_into("open_vocab", formats.dataset_dir("open_vocab"), common.Inputs(photos=items), 0)
    return manifest


def test_vocabularies_and_templates_are_split_by_word_and_template_disjointly():
    cols = ov.colour_splits()
    assert len(cols) > 500 and set(cols) == set(ov.colours())
    shares = {s: list(cols.values()).count(s) / len(cols) for s in ov.SPLITS}
    assert 0.6 < shares["train"] < 0.8 and 0.1 < shares["val"] < 0.2 and 0.1 < shares["test"] < 0.2
    assert all(cols[n] == "train" for n in recolour.PALETTE if n in cols)   # the CIR set's words stay in train
    for name, rgb in list(ov.colours().items())[::50]:                      # visible chroma only
        assert max(rgb) - min(rgb) >= 255 * ov.MIN_CHROMA - 1
    # a word's side does not depend on which other words are split with it
    assert ov.split_members(["teal", "mauve", "rust"], "colour")["teal"] == cols["teal"]
    cats = ov.category_splits()
    assert len(cats) > 1000 and {cats[c] for c in ov.offline_categories()} == set(ov.SPLITS)
    assert all(cats[c] == s for s, cs in CATS.items() for c in cs)
    assert ov.core_splits("light", "night")["at night"] == "train"             # --tone-edits' own phrasings
    assert ov.core_splits("light", "bw")["in black and white"] == "train"
    total = sum(ov.template_count().values())
    assert total >= 1000, total
    for fam in ov.FAMILIES:
        for edit in FAMILY_EDITS.get(fam, ("",)):
            by_side = {s: ov.templates(fam, s, edit) for s in ov.SPLITS}
            assert all(by_side.values()), (fam, edit)
            cores = {s: {t["core"] for t in ts} for s, ts in by_side.items()}
            texts = {s: {t["template"].lower() for t in ts} for s, ts in by_side.items()}
            ids = {s: {t["id"] for t in ts} for s, ts in by_side.items()}
            for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
                assert not (cores[a] & cores[b]) and not (texts[a] & texts[b]) and not (ids[a] & ids[b])


def test_the_new_edits_are_in_photo_edits_and_do_what_they_say():
    assert set(LIGHT_EDITS) <= set(PHOTO_EDITS)
    x = torch.rand(3, 20, 30) * 0.8 + 0.1
    assert photo_edit(x, "bright").mean() > x.mean() + 0.1 and photo_edit(x, "dark").mean() < x.mean() - 0.1
    assert torch.equal(photo_edit(x, "flip"), x.flip(-1)) and torch.allclose(photo_edit(x, "negative"), 1 - x)
    assert torch.equal(photo_edit(photo_edit(x, "upside-down"), "upside-down"), x)
    sat = lambda t: (t.max(0).values - t.min(0).values).mean()  # noqa: E731
    assert sat(photo_edit(x, "faded")) < 0.5 * sat(x)
    assert photo_edit(x, "blur").std() < 0.5 * x.std() and photo_edit(x, "contrast").std() > x.std()


def test_recolour_to_an_xkcd_name_reaches_its_hue():
    img = _disc((230, 40, 40))
    analysis, _ = recolour.analyse(img)
    for name in ("teal", "ultramarine", "grass green", "purple"):
        h, s, v = ov.colour_hsv(name)
        out = recolour.recolour_to(img, analysis, h, (s, v))
        assert float(recolour.hue_distance(recolour.analyse(out)[0].hue, h)) < 8.0, name


def _object_hue(img):
    """Saturation-weighted mean hue of the object's pixels (alpha over one half)."""
    rgba = np.asarray(img.convert("RGBA"), np.float64) / 255
    h, s, _ = recolour.rgb_to_hsv(rgba[..., :3])
    obj = rgba[..., 3] > 0.5
    return recolour.circular_mean(h[obj], s[obj])


def _rows(split):
    return formats.load_split("open_vocab", split)


def test_a_built_set_holds_only_its_sides_words_and_templates_and_true_targets(built):
    counts = built["counts"]
    for split in ov.SPLITS:
        assert {"colour", "light", "undo", "category", "compose-look", "compose-object"} <= set(counts[split]["by_kind"])
    root = formats.image_root("open_vocab")
    seen_refs = set()
    for split in ov.SPLITS:
        for r in _rows(split):
            seen_refs.add(r["reference"])
            fam, *rest = r["template"].split(":")
            edit = rest[0] if len(rest) == 3 else ""
            core = ov.cores(fam, edit)[int(rest[-2])]
            assert ov.core_splits(fam, edit)[core] == split                      # template of the side
            if r["kind"] == "colour":
                assert ov.colour_splits()[r["attribute"]] == split             # colour word of the side
                got = _object_hue(Image.open(root / r["targets"][0]))
                assert float(recolour.hue_distance(got, ov.colour_hsv(r["attribute"])[0])) < 10.0, r["attribute"]
            if r["kind"] in ("category", "compose-object", "compose-look"):
                for key in ("attribute", "reference_category"):
                    if key in r and r[key] in ov.category_splits():
                        assert ov.category_splits()[r[key]] == split
            if r["kind"] == "light":
                ref = Image.open(root / r["reference"]).convert("RGBA")
                flat = Image.alpha_composite(Image.new("RGBA", ref.size, "white"), ref).convert("RGB")
                x = torch.from_numpy(np.asarray(flat, np.float32) / 255).permute(2, 0, 1)
                want = (photo_edit(x, r["edit"]).permute(1, 2, 0).numpy() * 255).round()
                got = np.asarray(Image.open(root / r["targets"][0]).convert("RGB"), np.float32)
                assert np.abs(got - want).max() <= 1
            assert Path(r["reference"]).stem == r["photo"]                      # the photo or an edit of it
            if r["kind"] == "undo":
                assert r["reference"] == f"edits/{r['edit']}/{r['targets'][0].split('/')[-1]}"
            if r["kind"] == "compose-object":
                assert all(t.startswith(f"edits/{r['edit']}/") for t in r["targets"])
                assert r["reference"].startswith(f"edits/{r['edit']}/")
    assert not any("held" in ref for ref in seen_refs)                         # held-out sources stay out


def test_the_training_hooks_add_the_train_side_and_validate_on_val(built, monkeypatch):
    from engine.train.context_i2w.data import load_pairs
    from engine.data.cir_triplets import index_triplets
    from engine.train.rtic.data import open_vocab_triplets

    monkeypatch.setattr(builders, "ensure_built", lambda *a, **k: None)
    train = open_vocab_triplets("train")
    assert len(train) == built["counts"]["train"]["queries"] and all(t.meta["gallery"] == "open" for t in train)
    assert len(open_vocab_triplets("train", limit=5)) == 5
    # each row's source photo: the undo rows (from an edited version) share it with the photo's own rows
    rows = index_triplets(train)[2]
    photo_of = dict(zip(rows["query"].tolist(), rows["photo"].tolist()))
    by_photo = {}
    for qi, t in enumerate(train):
        by_photo.setdefault(t.meta["photo"], set()).add(photo_of[qi])
    assert all(len(ids) == 1 for ids in by_photo.values())
    assert len({i for ids in by_photo.values() for i in ids}) == len(by_photo)
    assert any(t.meta["kind"] == "undo" for t in train) and len(by_photo) < len({t.reference for t in train})
    val_words = {t.meta["attribute"] for t in open_vocab_triplets("val") if t.meta["kind"] == "colour"}
    assert val_words and not val_words & {t.meta.get("attribute") for t in train}
    pairs = load_pairs("open-vocab", "train")
    assert pairs and all(p.path.is_file() for p in pairs)
    assert any(p.caption.startswith(tuple(ov.of_split(ov.colour_splits(), "train"))) for p in pairs)


def test_rtic_refuses_open_vocab_without_the_offline_set():
    from engine.errors import InputError
    from engine.train.rtic.cli import main

    with pytest.raises(InputError, match="--open-vocab needs --data cir"):
        main(["--data", "synthetic", "--open-vocab"])


def test_the_manifest_counts_the_vocabularies(built):
    voc = built["vocabulary"]
    assert voc["templates"]["colour"] >= 200 and sum(voc["colours"].values()) == len(ov.colours())
    assert json.dumps(voc)  # plain JSON


def test_the_suites_new_colours_are_its_sides_names_and_reach_their_hue(tmp_path, monkeypatch):
    from engine.eval import generalise_open as go

    monkeypatch.setattr("engine.eval.generalise_open.training_texts", lambda: frozenset())
    photos = []
    for j, body in enumerate(BODIES):
        path = tmp_path / f"p{j}.png"
        _disc(body).save(path)
        photos.append({"image": path, "name": None})
    items = {}

    def add(gallery, path):
        items[f"{gallery}:{path}"] = path
        return f"{gallery}:{path}"

    names = {}
    for side in ("val", "test"):
        qs = go._colour_queries(side, photos, add, np.random.default_rng(0), tmp_path / "edits")
        assert len(qs) == len(BODIES)
        names[side] = {q["edit"].split(":", 1)[1] for q in qs}
        assert all(ov.colour_splits()[n] == side for n in names[side])
        for q in qs:
            name = q["edit"].split(":", 1)[1]
            got = _object_hue(Image.open(items[q["targets"][0]]))
            assert float(recolour.hue_distance(got, ov.colour_hsv(name)[0])) < 10.0
    assert not names["val"] & names["test"]
