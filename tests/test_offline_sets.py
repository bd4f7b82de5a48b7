"""Offline data sets: IDX reader, recolouring, Twemoji variants, split disjointness and determinism.

The assembly is tested on small synthetic inputs (a fake Twemoji package, generated photos, a tiny
Fashion-MNIST) through the same builders the CLI uses; the real packages are checked when installed.
"""
from __future__ import annotations

import colorsys
import gzip
import json
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.data import builders, fashion_mnist, formats, recolour, twemoji
from engine.data.builders import common as offline_sets
from engine.errors import InputError


# ----------------------------------------------------------------------------------------------
# IDX reader


def _idx_bytes(arr: np.ndarray, code: int, be_dtype: str) -> bytes:
    header = struct.pack(">HBB", 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(be_dtype).tobytes()


def test_idx_reader_roundtrip_plain_and_gzip(tmp_path):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, size=(4, 3, 5), dtype=np.uint8)
    labels = np.array([7, -2, 100000, 3], dtype=np.int32)
    floats = rng.standard_normal((2, 3)).astype(np.float32)
    (tmp_path / "img-idx3-ubyte").write_bytes(_idx_bytes(images, 0x08, "u1"))
    (tmp_path / "lab-idx1-int.gz").write_bytes(gzip.compress(_idx_bytes(labels, 0x0C, ">i4")))
    (tmp_path / "f-idx2-float").write_bytes(_idx_bytes(floats, 0x0D, ">f4"))

    got = fashion_mnist.read_idx(tmp_path / "img-idx3-ubyte")
    assert got.shape == (4, 3, 5) and got.dtype == np.uint8
    assert np.array_equal(got, images)
    got = fashion_mnist.read_idx(tmp_path / "lab-idx1-int.gz")
    assert got.tolist() == [7, -2, 100000, 3]
    got = fashion_mnist.read_idx(tmp_path / "f-idx2-float")
    assert np.array_equal(got, floats) and got.dtype.byteorder in ("=", "<", "|")


def test_idx_reader_rejects_bad_files(tmp_path):
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
    good = _idx_bytes(arr, 0x08, "u1")
    (tmp_path / "short").write_bytes(good[:-1])
    (tmp_path / "magic").write_bytes(b"\x01\x02" + good[2:])
    with pytest.raises(InputError, match="short"):
        fashion_mnist.read_idx(tmp_path / "short")
    with pytest.raises(InputError, match="not an IDX file"):
        fashion_mnist.read_idx(tmp_path / "magic")
    with pytest.raises(InputError, match="not found"):
        fashion_mnist.read_idx(tmp_path / "missing")


@pytest.mark.skipif(not fashion_mnist.available(), reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_real_test_file():
    x, y = fashion_mnist.load("test")
    assert x.shape == (10000, 28, 28) and x.dtype == np.uint8
    assert np.bincount(y, minlength=10).tolist() == [1000] * 10
    assert 0 < x.mean() < 255


# ----------------------------------------------------------------------------------------------
# recolouring


def _hue_deg(rgb) -> float:
    r, g, b = (c / 255.0 for c in rgb[:3])
    return colorsys.rgb_to_hsv(r, g, b)[0] * 360.0


def _circ_dist(a: float, b: float) -> float:
    d = abs(a - b) % 360.0
    return min(d, 360.0 - d)


def _cutout(size=64, body=(220, 30, 40), leaf=(40, 170, 60)) -> Image.Image:
    """RGBA: a coloured disc (object) with a small differently coloured patch, on transparent noise."""
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, size=(size, size, 4), dtype=np.uint8)
    arr[..., 3] = 0                      # background: random colours but fully transparent
    yy, xx = np.mgrid[:size, :size]
    disc = (yy - size / 2) ** 2 + (xx - size / 2) ** 2 < (size * 0.4) ** 2
    shade = (0.75 + 0.25 * xx / size)[..., None]
    arr[disc, :3] = np.clip(np.array(body) * shade[disc], 0, 255).astype(np.uint8)
    arr[disc, 3] = 255
    patch = disc & (yy < size * 0.35) & (xx > size * 0.45) & (xx < size * 0.6)
    arr[patch, :3] = leaf
    return Image.fromarray(arr, "RGBA"), disc, patch


@pytest.mark.parametrize("colour", ["blue", "green", "cyan", "purple"])
def test_recolour_hits_the_colour_word_and_leaves_the_rest(colour):
    img, disc, patch = _cutout()
    analysis, reason = recolour.analyse(img)
    assert analysis is not None, reason
    assert analysis.name == "red" and analysis.mask_kind == "alpha"
    assert colour in recolour.target_colours(analysis)
    assert not {"red", "orange", "pink"} & set(recolour.target_colours(analysis))   # too close to red
    out = recolour.recolour(img, colour, analysis)
    src, dst = np.asarray(img), np.asarray(out)
    assert out.mode == "RGBA" and dst.shape == src.shape
    # outside the object (alpha 0), every byte is unchanged, even the hidden random colours
    assert np.array_equal(src[~disc], dst[~disc])
    # the differently coloured patch is outside the dominant hue cluster: unchanged
    assert np.array_equal(src[patch], dst[patch])
    # the body's hue, computed here with colorsys, is at the colour word's centre
    body = disc & ~patch
    hues = [_hue_deg(p) for p in dst[body][::7]]
    centre = recolour.PALETTE[colour]
    assert max(_circ_dist(h, centre) for h in hues) < 6.0
    # value (brightness) is kept: max channel per pixel within rounding
    assert np.abs(src[body][:, :3].max(1).astype(int) - dst[body][:, :3].max(1).astype(int)).max() <= 1
    assert recolour.colour_name(hues[len(hues) // 2]) == colour


def test_recolour_white_background_mask_and_skips():
    arr = np.full((60, 60, 3), 255, np.uint8)
    arr[15:45, 15:45] = (30, 60, 200)                      # a blue square on white
    img = Image.fromarray(arr, "RGB")
    analysis, reason = recolour.analyse(img)
    assert analysis is not None and analysis.mask_kind == "white-background" and analysis.name == "blue", reason
    out = np.asarray(recolour.recolour(img, "orange", analysis))
    white = np.ones((60, 60), bool)
    white[15:45, 15:45] = False
    assert np.array_equal(out[white], arr[white])
    assert _circ_dist(_hue_deg(out[30, 30]), recolour.PALETTE["orange"]) < 3

    grey = arr.copy()
    grey[15:45, 15:45] = (120, 120, 120)
    assert recolour.analyse(Image.fromarray(grey))[0] is None          # greyscale object
    busy = np.random.default_rng(1).integers(0, 256, (60, 60, 3), dtype=np.uint8)
    assert recolour.analyse(Image.fromarray(busy))[0] is None          # no cut-out, no white background
    multi = arr.copy()
    multi[15:45, 15:30] = (200, 30, 30)
    multi[15:45, 30:45] = (30, 200, 30)
    assert recolour.analyse(Image.fromarray(multi))[1] == "object has several colours"


def test_colour_names_match_hues():
    for name, centre in recolour.PALETTE.items():
        assert recolour.colour_name(centre) == name
        assert recolour.colour_name((centre + 8) % 360) == name
    assert recolour.colour_name(355) == "red" and recolour.colour_name(215) == "blue"


# ----------------------------------------------------------------------------------------------
# a small fake Twemoji package


TONES = ["1F3FB", "1F3FC", "1F3FD", "1F3FE", "1F3FF"]


def _entry(unified, name, category, subcategory, tones=False, order=0):
    e = {"name": name, "unified": unified, "image": unified.lower() + ".png", "short_name": name.lower(),
         "category": category, "subcategory": subcategory, "sort_order": order, "has_img_twitter": True}
    if tones:
        e["skin_variations"] = {t: {"unified": f"{unified.split('-')[0]}-{t}" + (
            "-" + "-".join(unified.split("-")[1:]) if "-" in unified else ""),
            "image": "", "has_img_twitter": True} for t in TONES}
        e["skin_variations"]["1F3FB-1F3FC"] = {"unified": "X", "image": "mixed.png", "has_img_twitter": True}
        for v in e["skin_variations"].values():
            if not v["image"]:
                v["image"] = v["unified"].lower() + ".png"
    return e


def make_fake_twemoji(root: Path) -> Path:
    people = [
        ("1F9D1", "ADULT"), ("1F468", "MAN"), ("1F469", "WOMAN"),
        ("1F9D1-200D-1F9B0", "PERSON: RED HAIR"), ("1F469-200D-1F9B0", "WOMAN: RED HAIR"),
        ("1F468-200D-1F9B0", "MAN: RED HAIR"), ("1F469-200D-1F9B1", "WOMAN: CURLY HAIR"),
        ("1F3C3", "RUNNER"), ("1F3C3-200D-2640-FE0F", "WOMAN RUNNING"), ("1F3C3-200D-2642-FE0F", "MAN RUNNING"),
        ("1F9D1-200D-1F692", "FIREFIGHTER"), ("1F469-200D-1F692", "WOMAN FIREFIGHTER"),
        ("1F468-200D-1F692", "MAN FIREFIGHTER"),
        ("1F6B6", "PEDESTRIAN"), ("1F6B6-200D-2640-FE0F", "WOMAN WALKING"),
        ("1F6B6-200D-27A1-FE0F", "PERSON WALKING FACING RIGHT"),
    ]
    entries = [_entry(u, n, "People & Body", "person", tones=True, order=i) for i, (u, n) in enumerate(people)]
    for i in range(40):
        cat = ["Food & Drink", "Animals & Nature", "Objects", "Travel & Places"][i % 4]
        entries.append(_entry(f"1F{400 + i:03X}", f"THING {i}", cat, f"sub-{i % 8}", order=100 + i))
    entries.append(_entry("1F3FB", "LIGHT SKIN TONE", "Component", "skin-tone"))
    img_dir = root / twemoji.IMAGE_SUBDIR
    img_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for e in entries:
        files = [e["image"]] + [v["image"] for v in e.get("skin_variations", {}).values() if v["unified"] != "X"]
        for f in files:
            arr = np.zeros((16, 16, 4), np.uint8)
            arr[3:13, 3:13, :3] = rng.integers(0, 256, 3)
            arr[3:13, 3:13, 3] = 255
            Image.fromarray(arr, "RGBA").save(img_dir / f)
    (root / "emoji.json").write_text(json.dumps(entries))
    (root / "package.json").write_text(json.dumps({"version": "0.0-test"}))
    return root


def test_twemoji_variants_from_sequences(tmp_path):
    pkg = make_fake_twemoji(tmp_path / "pkg")
    emojis = twemoji.load_emoji(pkg)
    keys = {e.key for e in emojis}
    assert "1F3FB" not in keys                     # Component category skipped
    assert "X" not in keys                         # mixed-tone variation skipped
    assert "1F469-1F3FF-200D-1F9B0" in keys        # tone inserted after the first code point
    rels = set(twemoji.attribute_relations(emojis))
    assert ("1F3C3", "gender", "woman", "1F3C3-200D-2640-FE0F") in rels
    assert ("1F9D1-200D-1F692", "gender", "man", "1F468-200D-1F692") in rels
    assert ("1F469", "hair", "red hair", "1F469-200D-1F9B0") in rels
    assert ("1F469", "hair", "curly hair", "1F469-200D-1F9B1") in rels
    assert ("1F9D1", "gender", "woman", "1F469") in rels
    assert ("1F9D1-200D-1F9B0", "gender", "woman", "1F469-200D-1F9B0") in rels
    assert ("1F6B6", "direction", "facing right", "1F6B6-200D-27A1-FE0F") in rels
    edges = twemoji.variant_edges(emojis, random.Random(0))
    by = {(e.src, e.dst): e for e in edges}
    assert by[("1F3C3", "1F3C3-1F3FF")].text == "with dark skin tone"
    assert by[("1F3C3-200D-2640-FE0F", "1F3C3-200D-2642-FE0F")].text == "as a man"          # sibling
    assert by[("1F469-200D-1F9B0", "1F469-200D-1F9B1")].text == "with curly hair"          # sibling
    assert by[("1F6B6", "1F6B6-200D-27A1-FE0F")].text == "facing right"
    assert all(e.src != e.dst for e in edges)
    groups = twemoji.variant_groups(emojis)
    assert groups["1F3C3-1F3FD-200D-2640-FE0F"] == groups["1F3C3"]       # tones + gender in one group
    assert groups["1F469-200D-1F9B0"] == groups["1F469"]                 # hair variant with its base
    assert groups["1F469"] != groups["1F468"]                             # loose standalone gender link
    assert twemoji.variant_edges(emojis, random.Random(0)) == edges      # deterministic


# ----------------------------------------------------------------------------------------------
# assembly on synthetic inputs


CATS = {"bird": (230, 40, 40), "fruit": (40, 80, 220), "tool": (240, 200, 30)}


def make_photos(root: Path) -> list:
    """24 synthetic photos: cut-outs (recolourable) and opaque textures, in three categories."""
    rng = np.random.default_rng(5)
    items = []
    for ci, (cat, colour) in enumerate(CATS.items()):
        for j in range(8):
            key = f"{cat}_{j}"
            if j % 2 == 0:
                img, _, _ = _cutout(48, body=colour, leaf=(90, 90, 90))
                path = offline_sets.save_image(img, root / key)
            else:
                arr = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
                path = offline_sets.save_image(Image.fromarray(arr, "RGB"), root / key)
            group = f"photo:test:{cat}_{j // 4}_{j % 2}" if j >= 6 else f"photo:test:{key}"  # 6 and 7 differ
            items.append(offline_sets.PhotoItem(
                key=key, path=path, source="test", version="1", ref=f"{key}.png", licence="CC0",
                labels=("things", cat), caption=f"a {cat} number {j}", category=cat, group=group))
    items[-1].group = items[-2].group = "photo:test:shared"       # a mirrored pair: one group
    return items


@pytest.fixture()
def synthetic_inputs(tmp_path):
    pkg = make_fake_twemoji(tmp_path / "pkg")
    emojis = twemoji.load_emoji(pkg)
    rng = np.random.default_rng(2)
    fm = (rng.integers(0, 256, (200, 28, 28), dtype=np.uint8), np.repeat(np.arange(10), 20),
          rng.integers(0, 256, (50, 28, 28), dtype=np.uint8), np.repeat(np.arange(10), 5))
    return offline_sets.Inputs(emojis=emojis, emoji_img_dir=pkg / twemoji.IMAGE_SUBDIR, emoji_version="test",
                               photos=make_photos(tmp_path / "photos"), fmnist=fm, fmnist_version="test")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _build(name, inp, seed=0):
    return builders.build_into(name, formats.dataset_dir(name), inp, seed)


def _file_bytes(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*.jsonl")) + sorted(folder.rglob("labels.json"))}


def test_cir_splits_are_disjoint_and_answers_resolve(cache, synthetic_inputs):
    manifest = _build("cir", synthetic_inputs)
    assert manifest["seed"] == 0 and manifest["format_version"] == formats.FORMAT_VERSION
    images_by_split, groups_by_split = {}, {}
    kinds = set()
    for split in offline_sets.SPLITS:
        queries = formats.load_split("cir", split)
        gallery = formats.load_split("cir", f"{split}_gallery")
        gal = {g["image"]: g for g in gallery}
        assert len(gal) == len(gallery)
        used = set()
        for q in queries:
            kinds.add(q["kind"])
            assert q["reference"] in gal and all(t in gal for t in q["targets"]) and q["targets"]
            assert q["reference"] not in q["targets"]
            assert all(gal[t]["gallery"] == q["gallery"] == gal[q["reference"]]["gallery"] for t in q["targets"])
            used.update([q["reference"], *q["targets"]])
            if q["kind"] == "category":
                want = sorted(g["image"] for g in gallery if g.get("category") == q["attribute"])
                assert q["targets"] == want and q["text"] == offline_sets.category_text(q["attribute"])
                assert gal[q["reference"]]["category"] != q["attribute"]
            if q["kind"] == "recolour":
                colour = q["attribute"]
                assert q["text"] == f"make it {colour}"
                tgt = np.asarray(Image.open(formats.image_path("cir", q["targets"][0])).convert("RGBA"))
                a, _ = recolour.analyse(Image.fromarray(tgt, "RGBA"))
                assert a is not None and a.name == colour
        for rel in gal:
            assert formats.image_path("cir", rel).is_file()
        images_by_split[split] = set(gal)
        groups_by_split[split] = {g["group"] for g in gallery}
    assert {"skin_tone", "gender", "hair", "recolour", "category"} <= kinds
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not images_by_split[a] & images_by_split[b]
        assert not groups_by_split[a] & groups_by_split[b]
    # the mirrored pair shares a group, so it is in one split
    shared = [s for s in offline_sets.SPLITS if "photo:test:shared" in groups_by_split[s]]
    assert len(shared) == 1
    # hair families are spread so that every split has hair queries
    for split in offline_sets.SPLITS:
        assert any(q["kind"] == "hair" for q in formats.load_split("cir", split))


def test_captions_labelled_multilabel(cache, synthetic_inputs):
    _build("captions", synthetic_inputs)
    seen = {}
    for split in offline_sets.SPLITS:
        recs = formats.load_split("captions", split)
        assert all(r["caption"] and formats.image_path("captions", r["image"]).is_file() for r in recs)
        seen[split] = {r["image"] for r in recs}
    assert not (seen["train"] & seen["val"]) and not (seen["train"] & seen["test"]) and not (seen["val"] & seen["test"])
    assert sum(len(v) for v in seen.values()) == len(synthetic_inputs.emojis) + len(synthetic_inputs.photos)

    _build("labelled", synthetic_inputs)
    for part in ("fmnist", "fmnist_small", "emoji", "photos"):
        split = {s: formats.load_split("labelled", s, part=part)
                 for s in ("train", "val", "val_query", "val_db", "query", "db")}
        train_cls = {r["label"] for r in split["train"]}
        assert train_cls and not train_cls & {r["label"] for r in split["val"]}
        assert not {r["id"] for r in split["query"]} & {r["id"] for r in split["db"]}
        assert not {r["id"] for r in split["val_query"]} & {r["id"] for r in split["val_db"]}
        assert {r["id"] for r in split["val_query"]} | {r["id"] for r in split["val_db"]} == {r["id"] for r in split["val"]}
        for r in split["query"][:5]:
            assert formats.image_path("labelled", r["image"]).is_file()
    fm = formats.load_split("labelled", "db", part="fmnist")
    assert len(fm) == 200 and fm[3]["label"] == 0 and fm[3]["label_name"] == "T-shirt/top"
    img = np.asarray(Image.open(formats.image_path("labelled", fm[3]["image"])))
    assert np.array_equal(img, synthetic_inputs.fmnist[0][3])
    assert len(formats.load_split("labelled", "query", part="fmnist")) == 50

    _build("multilabel", synthetic_inputs)
    parts = {s: formats.load_split("multilabel", s) for s in ("train", "val", "query", "db")}
    ids = [r["id"] for recs in parts.values() for r in recs]
    assert len(ids) == len(set(ids))
    vocab = json.loads((formats.dataset_dir("multilabel") / "labels.json").read_text())
    assert all(set(r["labels"]) <= set(vocab) for recs in parts.values() for r in recs)
    dark = [r for recs in parts.values() for r in recs if "skin_tone:dark" in r["labels"]]
    assert dark and all("category:People & Body" in r["labels"] for r in dark)
    assert any("gender:woman" in r["labels"] for recs in parts.values() for r in recs)


def test_assembly_is_deterministic(tmp_path, monkeypatch, synthetic_inputs):
    out = {}
    for run, seed in (("a", 0), ("b", 0), ("c", 1)):
        monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / run))
        for name in ("cir", "multilabel"):
            _build(name, synthetic_inputs, seed)
        out[run] = {n: _file_bytes(formats.dataset_dir(n)) for n in ("cir", "multilabel")}
    assert out["a"] == out["b"]
    assert out["a"]["cir"] != out["c"]["cir"]          # another seed gives other splits


def test_split_helpers():
    assert offline_sets.assign_split("g1", 0) == offline_sets.assign_split("g1", 0)
    counts = {s: 0 for s in offline_sets.SPLITS}
    for i in range(3000):
        counts[offline_sets.assign_split(f"g{i}", 7)] += 1
    assert abs(counts["train"] / 3000 - 0.70) < 0.04 and abs(counts["test"] / 3000 - 0.15) < 0.03
    cls = offline_sets.class_disjoint_split(range(10), seed=1)
    assert sorted(Counter_values(cls)) == [2, 2, 6]
    recs = [{"id": f"{c}-{i}", "label": c} for c in range(4) for i in range(c + 1)]
    q, db = offline_sets.query_db_split(recs, seed=0)
    assert {r["label"] for r in q} == {1, 2, 3}            # a class with one item has no query
    assert len(q) + len(db) == len(recs) and not {r["id"] for r in q} & {r["id"] for r in db}


def Counter_values(mapping):
    from collections import Counter

    return list(Counter(mapping.values()).values())


def test_loader_errors(cache):
    with pytest.raises(InputError, match="unknown data set"):
        formats.load_split("nope", "train")
    with pytest.raises(InputError, match="outside"):
        formats.image_path("cir", "../../etc/passwd")
    bad = formats.dataset_dir("captions")
    bad.mkdir(parents=True)
    (bad / "train.jsonl").write_text('{"a": 1}\nnot json\n')
    with pytest.raises(InputError, match="train.jsonl, line 2"):
        formats.read_jsonl(bad / "train.jsonl")
    # loading never builds: a set without a manifest is refused with the command that builds it
    with pytest.raises(InputError, match=r"not built; build it with: python -m engine\.data\.builders build --only captions"):
        formats.load_split("captions", "train")
    assert not (bad / formats.MANIFEST).exists()


# ----------------------------------------------------------------------------------------------
# the real Twemoji package, when it is already installed (never installed by a test)


def _real_twemoji_dir():
    from engine.config import Settings

    given = Settings().twemoji_dir  # what an entry point would configure (CIS_TWEMOJI_DIR)
    path = Path(given) if given else twemoji.default_package_dir()
    return path if (path / "emoji.json").is_file() else None


@pytest.mark.skipif(_real_twemoji_dir() is None, reason="npm package emoji-datasource-twitter not installed in .cache/npm "
                    "(the README test command installs it)")
def test_real_twemoji_package():
    emojis = twemoji.load_emoji(_real_twemoji_dir())
    assert len(emojis) > 3000
    edges = twemoji.variant_edges(emojis, random.Random(0))
    kinds = {e.kind for e in edges}
    assert {"skin_tone", "gender", "hair"} <= kinds
    names = {e.key: e.name for e in emojis}
    assert names["1F469-200D-1F9B0"] == "woman: red hair"
    assert any(e.src == "1F469" and e.dst == "1F469-200D-1F9B0" and e.text == "with red hair" for e in edges)
    splits = offline_sets.emoji_group_splits(emojis, 0)
    groups = twemoji.variant_groups(emojis)
    hair_splits = {splits[groups[e.src]] for e in edges if e.kind == "hair"}
    assert hair_splits == {"train", "val", "test"}


# ----------------------------------------------------------------------------------------------
# where the sources are: the entry point's Settings, never the environment read below it


def test_the_sources_come_from_the_entry_points_settings_not_the_environment(tmp_path, monkeypatch):
    from engine.config import Settings
    from engine.data import locations, sources

    monkeypatch.setattr(locations, "_configured", locations.DataSources())
    for var in ("CIS_TWEMOJI_DIR", "CIS_FASHION_MNIST_DIR", "CIS_TUXPAINT_STAMPS", "CIS_GCOMPRIS_RCC"):
        monkeypatch.setenv(var, str(tmp_path / "env"))
    monkeypatch.setenv("CIS_PROGRESS", "1")
    # the variables alone change nothing: library code reads what the entry point configured
    assert sources.tuxpaint_dir() == Path(locations.TUXPAINT_STAMPS)
    assert sources.gcompris_rcc_dir() == Path(locations.GCOMPRIS_RCC)
    assert fashion_mnist.data_dir() == Path(fashion_mnist.DEFAULT_DIR)
    assert not locations.configured().progress
    locations.configure(Settings())  # what an entry point does with the Settings it built
    assert sources.tuxpaint_dir() == tmp_path / "env" and sources.gcompris_rcc_dir() == tmp_path / "env"
    assert fashion_mnist.data_dir() == tmp_path / "env" and locations.configured().progress
    with pytest.raises(InputError, match="without emoji.json"):
        twemoji.package_dir(install=False)  # the configured Twemoji folder, checked
    assert fashion_mnist.data_dir(tmp_path / "given") == tmp_path / "given"  # an explicit folder wins



def test_an_empty_fashion_mnist_variable_keeps_the_debian_folder(monkeypatch):
    # fashion_mnist.data_dir reads the configured folder with no fallback of its own: the sources always name one
    from engine.config import Settings
    from engine.data import locations

    monkeypatch.setattr(locations, "_configured", locations.DataSources())
    locations.configure(Settings(fashion_mnist_dir="  "))
    assert locations.configured().fashion_mnist_dir == locations.FASHION_MNIST_DIR
    assert fashion_mnist.data_dir() == Path(fashion_mnist.DEFAULT_DIR)

def test_ensure_built_builds_only_what_is_missing_from_the_given_sources_with_progress_bars(monkeypatch):
    from dataclasses import replace

    from engine.data import locations

    built = []
    monkeypatch.setattr(builders, "is_built", lambda name: name == "cir")
    monkeypatch.setattr(builders, "build", lambda name, seed, sources: built.append((name, sources)))
    given = locations.DataSources(tuxpaint_stamps="/elsewhere/stamps")
    builders.ensure_built("cir", "captions", sources=given)
    assert built == [("captions", replace(given, progress=True))]
    built.clear()
    monkeypatch.setattr(locations, "_configured", given)
    builders.ensure_built("captions")  # none given: what the entry point configured
    assert built == [("captions", replace(given, progress=True))]


def test_prepare_builds_the_sets_from_its_callers_settings(monkeypatch, tmp_path):
    # a running app's background prepare passes the app's Settings: the sets are built from its folders, not
    # from whatever this process configured last
    from engine import prepare
    from engine.config import Settings
    from engine.data import locations

    seen = []
    monkeypatch.setattr(builders, "ensure_built", lambda name, sources=None: seen.append((name, sources)))
    monkeypatch.setattr(locations, "_configured", locations.DataSources())
    given = locations.DataSources.from_settings(Settings(twemoji_dir=str(tmp_path / "tw"), progress=False))
    assert prepare.build_data(["rtic"], {}, quiet=True, data_sources=given) == {}
    assert seen and all(sources.twemoji_dir == str(tmp_path / "tw") for _, sources in seen)
