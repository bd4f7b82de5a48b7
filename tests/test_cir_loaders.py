"""Loaders on official-format fixtures, the evaluation glue, submission files and run records.

The annotation fixtures (tests/fixtures/cir/) use the datasets' exact file names, field names and
nesting; the 8x8 images are written into the test's tmp folder. Expected metrics are worked out
by hand in the comments.
"""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.data.cir_official import (
    circo_image_name,
    join_fashioniq_captions,
    load_circo,
    load_cirr,
    load_fashioniq,
)
from engine.errors import InputError
from engine.eval import official
from engine.eval.record import file_hash, git_commit, write_run_record

FIXTURES = Path(__file__).parent / "fixtures" / "cir"


def _img(path: Path, colour=(128, 128, 128)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), colour).save(path)


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


# ----------------------------------------------------------------------------- FashionIQ
@pytest.fixture
def fiq_root(tmp_path):
    root = _copy("fashioniq", tmp_path)
    for n in ("B00DRESS01", "B00DRESS02", "B00DRESS03", "B00DRESS04"):
        _img(root / "images" / f"{n}.png")
    _img(root / "images" / "B00DRESS05.jpg")  # the .jpg layout of the original release
    for n in ("B00SHIRT01", "B00SHIRT02"):  # B00SHIRT03 deliberately missing
        _img(root / "images" / f"{n}.png")
    return root


def test_fashioniq_loader_reads_official_layout(fiq_root):
    ds = load_fashioniq(fiq_root, "dress", "val")
    assert ds.gallery == ["B00DRESS01", "B00DRESS02", "B00DRESS03", "B00DRESS04", "B00DRESS05"]
    s = ds.samples[0]
    assert (s.query_id, s.reference, s.targets) == ("dress/0", "B00DRESS01", ["B00DRESS02"])
    assert s.texts == ["Is darker.", " has long sleeves?"]  # raw captions, unchanged
    assert s.subset is None
    assert ds.path("B00DRESS05").name == "B00DRESS05.jpg"
    assert ds.missing_images == [] and ds.skipped_samples == []
    test = load_fashioniq(fiq_root, "dress", "test")
    assert test.samples[0].targets == []  # test captions have no "target"


def test_fashioniq_missing_images_reported_and_optionally_skipped(fiq_root):
    ds = load_fashioniq(fiq_root, "shirt", "val")
    assert ds.missing_images == ["B00SHIRT03"]
    assert len(ds.samples) == 2 and ds.present_gallery == ["B00SHIRT01", "B00SHIRT02"]
    assert "1 referenced images missing" in ds.report()
    skipped = load_fashioniq(fiq_root, "shirt", "val", skip_missing=True)
    assert [s.query_id for s in skipped.samples] == ["shirt/0"]
    assert skipped.skipped_samples == ["shirt/1"]


def test_fashioniq_caption_joining_rules():
    caps = ["Is darker.", " has LONG sleeves?"]
    assert join_fashioniq_captions(caps, "clip4cir") == ["Is darker and has LONG sleeves"]
    assert join_fashioniq_captions(["is SHORTER, ", "is red"], "clip4cir") == ["Is shorter and is red"]
    assert join_fashioniq_captions(caps, "plain") == ["Is darker and has LONG sleeves"]
    assert join_fashioniq_captions(["is SHORTER, ", "is red"], "plain") == ["is SHORTER and is red"]
    assert join_fashioniq_captions(caps, "reversed") == ["has LONG sleeves and Is darker"]
    assert join_fashioniq_captions(caps, "both") == ["Is darker and has LONG sleeves", "has LONG sleeves and Is darker"]
    assert join_fashioniq_captions(caps, "pic2word") == [" has LONG sleeves? and Is darker."]
    with pytest.raises(InputError, match="caption rule"):
        join_fashioniq_captions(caps, "zip")


def test_fashioniq_errors_name_the_file(tmp_path):
    root = _copy("fashioniq", tmp_path)
    with pytest.raises(InputError, match="cap.toptee.val.json"):
        load_fashioniq(root, "toptee", "val")
    (root / "captions" / "cap.dress.val.json").write_text(json.dumps([{"target": "x", "captions": ["a", "b"]}]))
    with pytest.raises(InputError, match=r"cap\.dress\.val\.json: entry 0 lacks field\(s\) candidate"):
        load_fashioniq(root, "dress", "val")
    with pytest.raises(InputError, match="unknown FashionIQ category"):
        load_fashioniq(root, "shoes", "val")


# fake embeddings: one axis per gallery image, composed vectors picked per query
def _onehot(names):
    eye = np.eye(len(names), dtype=np.float32)
    return {n: eye[i] for i, n in enumerate(names)}


def _embed_fn(table, seen=None):
    def embed(paths):
        if seen is not None:
            seen.extend(Path(p).stem for p in paths)
        return np.stack([table[Path(p).stem] for p in paths])

    return embed


def test_evaluate_fashioniq_hand_computed(fiq_root):
    dress = _onehot(["B00DRESS01", "B00DRESS02", "B00DRESS03", "B00DRESS04", "B00DRESS05"])
    shirt = {k: np.pad(v, (0, 2)) for k, v in _onehot(["B00SHIRT01", "B00SHIRT02", "B00SHIRT03"]).items()}
    table = {**dress, **shirt}
    e = lambda *w: np.array(w, dtype=np.float32)  # noqa: E731
    wanted = {
        # dress/0 target D2: vector on D2 -> rank 0
        "dress/0": e(0, 1, 0, 0, 0),
        # dress/1 target D4: D5 .8, D3 .6, then D1, D2, D4 tie at 0 -> gallery order -> rank 4
        "dress/1": e(0, 0, 0.6, 0, 0.8),
        # dress/2 target D1: D1 and D5 tie -> D1 first -> rank 0
        "dress/2": e(1, 0, 0, 0, 1),
        # shirt/0 target S2 -> rank 0 ; shirt/1 target S3 has no image -> miss
        "shirt/0": e(0, 1, 0, 0, 0),
        "shirt/1": e(0, 0, 1, 0, 0),
    }
    texts = {}

    def compose(items):
        for it in items:
            texts.setdefault(it.sample.query_id, []).append(it.text)
            assert it.reference_embedding is not None  # references are gallery images here
        return np.stack([wanted[it.sample.query_id] for it in items])

    res = official.evaluate_fashioniq(fiq_root, compose, _embed_fn(table), ["dress", "shirt"], ks=(1, 5),
                                      template="a photo that {}")
    m = res["metrics"]
    # dress: R@1 = 2/3, R@5 = 3/3 ; shirt: R@1 = R@5 = 1/2
    assert m["dress/R@1"] == pytest.approx(200 / 3)
    assert m["dress/R@5"] == pytest.approx(100.0)
    assert m["shirt/R@1"] == pytest.approx(50.0) and m["shirt/R@5"] == pytest.approx(50.0)
    # averages: R@1 (66.67 + 50) / 2 = 58.33 ; R@5 (100 + 50) / 2 = 75 ; avg = 66.67
    assert m["average/R@1"] == pytest.approx(175 / 3)
    assert m["average/R@5"] == pytest.approx(75.0)
    assert m["average/avg"] == pytest.approx((175 / 3 + 75) / 2)
    assert texts["dress/0"] == ["a photo that Is darker and has long sleeves"]
    assert res["protocol"]["caption_join"] == "clip4cir"
    assert res["data"][1]["missing_images"] == 1


def test_fashioniq_both_orders_are_averaged(fiq_root):
    table = _onehot(["B00DRESS01", "B00DRESS02", "B00DRESS03", "B00DRESS04", "B00DRESS05"])
    e = lambda *w: np.array(w, dtype=np.float32)  # noqa: E731

    def compose(items):
        out = []
        for it in items:
            if it.sample.query_id == "dress/1":
                # order 1 points at D4, order 2 at D5: only their average makes D4 (tie, first) rank 0
                out.append(e(0, 0, 0, 1, 0) if it.text.startswith("is SHORTER") else e(0, 0, 0, 0, 1))
            else:
                out.append(table[it.sample.targets[0]])
        return np.stack(out)

    both = official.evaluate_fashioniq(fiq_root, compose, _embed_fn(table), ["dress"], join_rule="both", ks=(1,))
    assert both["metrics"]["dress/R@1"] == pytest.approx(100.0)
    rev = official.evaluate_fashioniq(fiq_root, compose, _embed_fn(table), ["dress"], join_rule="reversed", ks=(1,))
    # reversed alone ("is red and is SHORTER") points at D5 -> dress/1 misses -> 2/3
    assert rev["metrics"]["dress/R@1"] == pytest.approx(200 / 3)


# ----------------------------------------------------------------------------- CIRR
CIRR_NAMES = ["dev-0-0-img0", "dev-0-0-img1", "dev-1-0-img0", "dev-1-1-img1", "dev-2-0-img0", "dev-2-1-img0"]
TEST1_NAMES = ["test1-0-0-img0", "test1-0-1-img1", "test1-1-0-img0", "test1-1-1-img0"]


@pytest.fixture
def cirr_root(tmp_path):
    root = _copy("cirr", tmp_path)
    for n in CIRR_NAMES:
        _img(root / "cirr" / "img_raw" / "dev" / f"{n}.png")
    for n in TEST1_NAMES[:3]:  # test1-1-1-img0 missing
        _img(root / "cirr" / "img_raw" / "test1" / f"{n}.png")
    return root


def test_cirr_loader_reads_official_layout(cirr_root):
    ds = load_cirr(cirr_root, "val")
    assert ds.gallery == CIRR_NAMES
    s = ds.samples[0]
    assert (s.query_id, s.reference, s.targets, s.texts) == ("100", "dev-0-0-img0", ["dev-1-0-img0"], ["make it two dogs"])
    assert s.subset == ["dev-0-0-img0", "dev-0-0-img1", "dev-1-0-img0", "dev-1-1-img1"]
    assert s.extra["img_set_id"] == 1 and s.extra["target_soft"] == {"dev-1-0-img0": 1.0}
    assert ds.path("dev-2-1-img0") == cirr_root / "cirr" / "img_raw" / "dev" / "dev-2-1-img0.png"
    # root may also be the cirr/ folder itself
    assert load_cirr(cirr_root / "cirr", "val").gallery == CIRR_NAMES
    test = load_cirr(cirr_root, "test1")
    assert [s.targets for s in test.samples] == [[], []]
    assert test.missing_images == ["test1-1-1-img0"]


def test_cirr_clip4cir_image_layout(tmp_path):
    root = _copy("cirr", tmp_path)
    for n in CIRR_NAMES:  # split folders directly under cirr/ (no img_raw)
        _img(root / "cirr" / "dev" / f"{n}.png")
    ds = load_cirr(root, "val")
    assert ds.missing_images == []
    assert ds.path(CIRR_NAMES[0]) == root / "cirr" / "dev" / f"{CIRR_NAMES[0]}.png"


CIRR_WANTED = {
    # same matrix as tests/test_eval_metrics.py: ranks after removing the reference 2, 0, 3;
    # subset ranks 1, 0, 1
    "100": [0.9, 0.0, 0.5, 0.8, 0.6, 0.0],
    "101": [0.0, 0.0, 0.95, 0.0, 0.7, 0.7],
    "102": [0.3, 0.2, 0.25, 0.25, 0.9, 0.1],
}


def test_evaluate_cirr_val_and_submission(cirr_root, tmp_path):
    table = _onehot(CIRR_NAMES)

    def compose(items):
        return np.stack([np.array(CIRR_WANTED[it.sample.query_id], dtype=np.float32) for it in items])

    res = official.evaluate_cirr(cirr_root, compose, _embed_fn(table), "val", ks=(1, 3, 5, 50),
                                 submission_dir=tmp_path / "sub")
    m = res["metrics"]
    assert m["R@1"] == pytest.approx(100 / 3)
    assert m["R@3"] == pytest.approx(200 / 3)
    assert m["R@5"] == pytest.approx(100.0) and m["R@50"] == pytest.approx(100.0)
    assert m["Rsubset@1"] == pytest.approx(100 / 3)
    assert m["Rsubset@2"] == pytest.approx(100.0) and m["Rsubset@3"] == pytest.approx(100.0)
    assert m["avg(R@5,Rsubset@1)"] == pytest.approx((100 + 100 / 3) / 2)
    recall = json.loads((tmp_path / "sub" / "cirr_val_recall.json").read_text())
    subset = json.loads((tmp_path / "sub" / "cirr_val_recall_subset.json").read_text())
    assert recall["version"] == "rc2" and recall["metric"] == "recall"
    assert subset["version"] == "rc2" and subset["metric"] == "recall_subset"
    a, b, c, d, e, f = CIRR_NAMES
    assert recall["100"] == [d, e, c, b, f]  # reference a removed
    assert subset["100"] == [d, c, b]
    assert subset["101"] == [e, f, d]
    assert set(recall) == {"version", "metric", "100", "101", "102"}


def test_evaluate_cirr_test1_writes_server_files_with_missing_images(cirr_root, tmp_path):
    table = _onehot(TEST1_NAMES)

    def compose(items):
        return np.stack([it.reference_embedding for it in items])

    res = official.evaluate_cirr(cirr_root, compose, _embed_fn(table), "test1", submission_dir=tmp_path / "s")
    assert res["metrics"] == {}
    recall = json.loads((tmp_path / "s" / "cirr_test1_recall.json").read_text())
    subset = json.loads((tmp_path / "s" / "cirr_test1_recall_subset.json").read_text())
    t0, t1, t2, t3 = TEST1_NAMES
    # pair 200 (ref t0): t0 removed, t3 has no image so it is not in the gallery; scores all 0 -> gallery order
    assert recall["200"] == [t1, t2]
    assert len(subset["201"]) == 2 and t2 not in subset["201"]
    assert res["data"][0]["missing_images"] == 1


def test_gallery_embeddings_are_cached_per_key(cirr_root, tmp_path):
    table = _onehot(CIRR_NAMES)

    def compose(items):
        return np.stack([np.array(CIRR_WANTED[it.sample.query_id], dtype=np.float32) for it in items])

    def refuse(paths):
        raise AssertionError("the gallery should come from the cache")

    kw = dict(ks=(1,), cache_dir=tmp_path / "cache")
    first = official.evaluate_cirr(cirr_root, compose, _embed_fn(table), "val", cache_key="bb@1", **kw)
    again = official.evaluate_cirr(cirr_root, compose, refuse, "val", cache_key="bb@1", **kw)
    assert again["metrics"] == first["metrics"]
    assert len(list((tmp_path / "cache").glob("cirr-val-*.npy"))) == 1
    with pytest.raises(AssertionError, match="from the cache"):  # another backbone: embedded again
        official.evaluate_cirr(cirr_root, compose, refuse, "val", cache_key="bb@2", **kw)


# ----------------------------------------------------------------------------- CIRCO
CIRCO_IDS = [101, 102, 103, 104, 105, 106, 107, 108]


@pytest.fixture
def circo_root(tmp_path):
    root = _copy("circo", tmp_path)
    for i in CIRCO_IDS:
        _img(root / "COCO2017_unlabeled" / "unlabeled2017" / circo_image_name(i))
    return root


def test_circo_loader_reads_official_layout(circo_root):
    assert circo_image_name(9761) == "000000009761.jpg"
    ds = load_circo(circo_root, "val")
    assert ds.gallery == [str(i) for i in CIRCO_IDS]
    s = ds.samples[0]
    assert (s.query_id, s.reference, s.targets) == ("0", "101", ["103", "105", "107"])
    assert s.texts == ["is held by a little girl on a chair"]
    assert s.extra["shared_concept"] == "a teddy bear" and s.extra["target_img_id"] == 103
    assert ds.path("103").name == "000000000103.jpg"
    test = load_circo(circo_root, "test")
    assert [t.targets for t in test.samples] == [[], []]
    # without the COCO image list the gallery is the folder listing
    (circo_root / "COCO2017_unlabeled" / "annotations" / "image_info_unlabeled2017.json").unlink()
    assert load_circo(circo_root, "val").gallery == [str(i) for i in CIRCO_IDS]


def test_circo_target_must_lead_ground_truths(circo_root):
    f = circo_root / "annotations" / "val.json"
    data = json.loads(f.read_text())
    data[0]["target_img_id"] = 105
    f.write_text(json.dumps(data))
    with pytest.raises(InputError, match="val.json: entry 0"):
        load_circo(circo_root, "val")


CIRCO_WANTED = {
    # q0 ranking 101, 103, 102, 105, 104, 107, 106, 108 ; q1 ranking 104, 108, 102, ...
    "0": [0.95, 0.8, 0.9, 0.6, 0.7, 0.0, 0.5, 0.0],
    "1": [0.0, 0.5, 0.0, 0.9, 0.0, 0.0, 0.0, 0.85],
}


def _circo_compose(items):
    return np.stack([np.array(CIRCO_WANTED[it.sample.query_id], dtype=np.float32) for it in items])


def test_evaluate_circo_map_and_submission(circo_root, tmp_path):
    table = {f"{i:012d}": v for i, v in zip(CIRCO_IDS, np.eye(8, dtype=np.float32))}
    res = official.evaluate_circo(circo_root, _circo_compose, _embed_fn(table), "val", ks=(5, 10),
                                  submission_path=tmp_path / "circo_val.json")
    m = res["metrics"]
    # q0: AP@5 = (1/2 + 2/4) / 3 = 1/3, AP@10 = (1/2 + 2/4 + 3/6) / 3 = 1/2 ; q1: AP = 1
    assert m["mAP@5"] == pytest.approx((1 / 3 + 1) / 2 * 100)
    assert m["mAP@10"] == pytest.approx(75.0)
    # Recall of target_img_id: q0 target 103 at rank 1, q1 104 at rank 0
    assert m["R@5"] == pytest.approx(100.0)
    sub = json.loads((tmp_path / "circo_val.json").read_text())
    assert sub["0"] == [101, 103, 102, 105, 104, 107, 106, 108]  # integers, reference kept
    assert res["protocol"]["exclude_reference"] is False
    ex = official.evaluate_circo(circo_root, _circo_compose, _embed_fn(table), "val", ks=(5,), exclude_reference=True)
    # q0 without 101: rel 1,0,1,0,1 -> (1 + 2/3 + 3/5) / 3
    assert ex["metrics"]["mAP@5"] == pytest.approx((((1 + 2 / 3 + 3 / 5) / 3) + 1) / 2 * 100)


def test_evaluate_circo_missing_images(circo_root):
    (circo_root / "COCO2017_unlabeled" / "unlabeled2017" / circo_image_name(107)).unlink()
    (circo_root / "COCO2017_unlabeled" / "unlabeled2017" / circo_image_name(102)).unlink()
    table = {f"{i:012d}": v for i, v in zip(CIRCO_IDS, np.eye(8, dtype=np.float32))}
    seen = []
    res = official.evaluate_circo(circo_root, _circo_compose, _embed_fn(table, seen), "val", ks=(10,))
    assert "000000000107" not in seen and "000000000102" not in seen
    # q0: 102 and 107 leave the gallery, 107 still counts in |G| = 3:
    #     ranking 101, 103, 105, 104, 106, 108 -> rel 0,1,1,0,0,0 -> (1/2 + 2/3) / 3
    # q1: reference 102 missing -> not composed -> AP 0
    assert res["metrics"]["mAP@10"] == pytest.approx(((1 / 2 + 2 / 3) / 3 + 0) / 2 * 100)
    assert res["data"][0]["missing_images"] == 2
    assert res["data"][0]["queries_without_reference_image"] == 1
    # with skip_missing both queries go (q0 needs gt 107, q1 reference 102): a clear error
    with pytest.raises(InputError, match="2 skipped because an image is missing"):
        official.evaluate_circo(circo_root, _circo_compose, _embed_fn(table), "val", ks=(10,), skip_missing=True)


def test_evaluate_circo_skip_missing_drops_only_affected_queries(circo_root):
    (circo_root / "COCO2017_unlabeled" / "unlabeled2017" / circo_image_name(107)).unlink()
    table = {f"{i:012d}": v for i, v in zip(CIRCO_IDS, np.eye(8, dtype=np.float32))}
    kept = official.evaluate_circo(circo_root, _circo_compose, _embed_fn(table), "val", ks=(10,))
    # kept (default): q0 ranking 101,103,102,105,104,106,108 -> (1/2 + 2/4) / 3 ; q1 = 1
    assert kept["metrics"]["mAP@10"] == pytest.approx((1 / 3 + 1) / 2 * 100)
    skipped = official.evaluate_circo(circo_root, _circo_compose, _embed_fn(table), "val", ks=(10,), skip_missing=True)
    # q0 dropped (its ground truth 107 has no image) -> only q1: AP 1
    assert skipped["metrics"]["mAP@10"] == pytest.approx(100.0)
    assert skipped["data"][0]["skipped_samples"] == 1 and skipped["data"][0]["queries"] == 1


# ----------------------------------------------------------------------------- records
def test_write_run_record(tmp_path):
    path = tmp_path / "runs" / "rec.json"
    ckpt = tmp_path / "c.safetensors"
    ckpt.write_bytes(b"weights")
    rec = write_run_record(path, "sum", "fake@1234", file_hash(ckpt), "a photo that {}",
                           {"benchmark": "cirr", "exclude_reference": True}, {"R@1": np.float32(12.5)})
    on_disk = json.loads(path.read_text())
    assert on_disk == rec
    assert on_disk["metrics"] == {"R@1": 12.5}
    assert on_disk["backbone_fingerprint"] == "fake@1234"
    assert on_disk["checkpoint_hash"] == file_hash(ckpt) != file_hash(None) == "none"
    assert on_disk["template"] == "a photo that {}"
    assert on_disk["protocol_flags"]["exclude_reference"] is True
    assert on_disk["date"].startswith("20") and "T" in on_disk["date"]
    assert on_disk["git_commit"] == git_commit()
    assert [p.name for p in path.parent.iterdir()] == ["rec.json"]  # no temporary file left
    assert git_commit(tmp_path) == "unknown"
    with pytest.raises(InputError, match="missing.pt"):
        file_hash(tmp_path / "missing.pt")


# ----------------------------------------------------------------------------- CLI with engine interfaces
def test_main_runs_cirr_with_a_backbone_and_composer(cirr_root, tmp_path):
    import torch

    from engine.backbones.base import Backbone
    from engine.compose.base import Composer, Composition, normalise

    class ColourBackbone(Backbone):
        """Embedding = mean RGB colour (3-D): enough to test the plumbing."""

        name, embed_dim, vision_width, token_dim, context_length = "colour", 3, 3, 3, 77

        def preprocess(self, image):
            return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)

        def encode_images_with_tokens(self, pixels):
            emb = pixels.mean(dim=(2, 3))
            return torch.nn.functional.normalize(emb, dim=-1), emb[:, None, :]

        def encode_texts(self, texts):
            raise NotImplementedError

        def encode_texts_with_pseudo(self, texts, pseudo):
            raise NotImplementedError

        def word_token_embedding(self, word):
            raise NotImplementedError

        def count_tokens(self, text):
            return len(text.split())

        @property
        def fingerprint(self):
            return "colour@0000"

    class ImageOnly(Composer):
        name = label = "image"

        def compose(self, query):
            assert query.image_tokens is not None and query.text.startswith("photo: ")
            return Composition(vector=normalise(query.image_embedding))

    colours = [(255, 0, 0), (0, 255, 0), (230, 30, 0), (0, 0, 255), (0, 30, 230), (0, 230, 30)]
    for n, c in zip(CIRR_NAMES, colours):
        _img(cirr_root / "cirr" / "img_raw" / "dev" / f"{n}.png", c)
    rec_path = tmp_path / "rec.json"
    rc = official.main(
        ["cirr", "--root", str(cirr_root), "--composer", "image", "--template", "photo: {}", "--record", str(rec_path),
         "--cache-dir", str(tmp_path / "cache")],
        backbone=ColourBackbone(),
        composer_factory=lambda name, bb, ckpt: ImageOnly(bb),
    )
    assert rc == 0
    rec = json.loads(rec_path.read_text())
    assert rec["method"] == "image" and rec["backbone_fingerprint"] == "colour@0000"
    assert rec["template"] == "photo: {}" and rec["checkpoint_hash"] == "none"
    # independent expectation: the query is the reference colour; rank the other images by cosine
    emb = np.array(colours, dtype=float)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    hits = 0
    for ref, tgt in ((0, 2), (2, 4), (4, 1)):
        s = emb @ emb[ref]
        order = [j for j in np.argsort(-s, kind="stable") if j != ref]
        hits += order[0] == tgt
    assert rec["metrics"]["R@1"] == pytest.approx(100 * hits / 3)
    assert rec["metrics"]["R@5"] == pytest.approx(100.0)
    assert rec["protocol_flags"]["exclude_reference"] is True
    # a bad argument is a clear error, not a traceback
    assert official.main(["cirr", "--root", str(tmp_path / "nothing"), "--no-cache"], backbone=ColourBackbone(),
                         composer_factory=lambda *a: ImageOnly(a[1])) == 2
