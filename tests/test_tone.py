"""Tone-edit triplets for RTIC (--tone-edits) and the default-method rule that weighs the tone edits."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from engine.data.tone import TONE_TEXTS, edited_file, offline_cir_photos, tone_edit, tone_triplets
from engine.errors import InputError



def _png(path, rgb, size=(24, 16)):
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.zeros((size[1], size[0], 3), np.uint8)
    arr[:, : size[0] // 2] = rgb
    arr[:, size[0] // 2 :] = [255 - c for c in rgb]
    Image.fromarray(arr).save(path)
    return path


def _pixels(path):
    return torch.from_numpy(np.asarray(Image.open(path).convert("RGB"), np.float32) / 255).permute(2, 0, 1)


def test_targets_are_the_references_own_edits_and_the_gallery_holds_every_version(tmp_path):
    photos = [_png(tmp_path / f"p{i}.png", c) for i, c in enumerate([(200, 30, 30), (20, 180, 60), (40, 60, 220)])]
    triplets, gallery = tone_triplets(photos, root=tmp_path / "tone")
    assert len(triplets) == 2 * len(photos)  # one query per photo and edit
    versions = {}
    for t in triplets:
        kind = t.meta["kind"]
        assert t.text in TONE_TEXTS[kind] and t.meta["gallery"] == "tone" and len(t.targets) == 1
        target = t.targets[0]
        # the target is the reference's own edit: its pixels are the edit of the reference's pixels
        assert torch.allclose(_pixels(target), tone_edit(_pixels(t.reference), kind), atol=1 / 255 + 1e-6)
        versions.setdefault(t.reference, set()).add(target)
    assert set(versions) == {str(p) for p in photos}
    assert {t.text for t in triplets} == {x for texts in TONE_TEXTS.values() for x in texts}  # phrasings alternate
    # gallery: every photo in every version (original, black-and-white, night), each once
    paths = [p for p, g in gallery if g == "tone"]
    assert len(paths) == len(set(paths)) == 3 * len(photos)
    for ref, targets in versions.items():
        assert {ref, *targets} <= set(paths) and ref not in targets
    # the night version is darker than the photo, the black-and-white one has no colour
    night = next(t for t in triplets if t.meta["kind"] == "night")
    assert _pixels(night.targets[0]).mean() < 0.5 * _pixels(night.reference).mean()
    bw = _pixels(next(t for t in triplets if t.meta["kind"] == "bw").targets[0])
    assert torch.equal(bw[0], bw[1]) and torch.equal(bw[1], bw[2])


def test_edited_files_are_named_by_content_and_written_once(tmp_path):
    a = _png(tmp_path / "a.png", (10, 120, 240))
    b = _png(tmp_path / "copy" / "b.png", (10, 120, 240))  # the same picture under another name
    first = edited_file(a, "night", tmp_path / "tone")
    stamp = first.stat().st_mtime_ns
    assert edited_file(b, "night", tmp_path / "tone") == first and first.stat().st_mtime_ns == stamp
    assert edited_file(a, "bw", tmp_path / "tone") != first
    with pytest.raises(ValueError, match="unknown photo edit 'posterise'"):
        edited_file(a, "posterise", tmp_path / "tone")


def _fake_cir(root):
    """A tiny built offline CIR set: two train photos, two val photos and one Twemoji drawing per split."""
    cir = root / "datasets" / "cir"
    colours = {"photos/a.png": (200, 40, 40), "photos/b.png": (40, 40, 200), "photos/c.png": (40, 200, 40),
               "photos/d.png": (200, 200, 40), "twemoji/x.png": (250, 200, 150), "twemoji/y.png": (120, 80, 40)}
    for rel, c in colours.items():
        _png(cir / "images" / rel, c)
    (cir / "manifest.json").write_text("{}")

    def write(name, records):
        (cir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    for split, (p, q, emoji) in {"train": ("a", "b", "x"), "val": ("c", "d", "y"), "test": ("d", "c", "y")}.items():
        write(split, [{"id": f"{split}-r", "reference": f"photos/{p}.png", "targets": [f"photos/{q}.png"],
                       "text": "make it blue", "kind": "recolour", "gallery": "photos"},
                      {"id": f"{split}-e", "reference": f"twemoji/{emoji}.png", "targets": [f"photos/{q}.png"],
                       "text": "a photo of a thing", "kind": "category", "gallery": "photos"}])
        write(f"{split}_gallery", [{"image": f"photos/{p}.png", "gallery": "photos"},
                                   {"image": f"photos/{q}.png", "gallery": "photos"},
                                   {"image": f"twemoji/{emoji}.png", "gallery": "twemoji"}])
    return cir / "images"


def test_training_uses_only_the_training_splits_photos_and_records_the_tone_validation(tmp_path, monkeypatch):
    import engine.data.builders as builders
    import engine.train.rtic as rt
    import engine.train.rtic.cli as rt_cli

    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    images = _fake_cir(tmp_path / "cache")
    assert [p.name for p in offline_cir_photos("train")] == ["a.png", "b.png"]  # photos only, no drawing
    monkeypatch.setattr(builders, "ensure_built", lambda *a, **k: None)
    seen = {}
    real = rt.train_rtic

    def spy(data, *a, **k):
        seen["data"] = data
        return real(data, *a, **k)

    monkeypatch.setattr(rt_cli, "train_rtic", spy)  # the name the command calls
    out = tmp_path / "ck"
    rt.main(["--data", "cir", "--backbone", "tiny:tiny-vit-a", "--device", "cpu", "--tone-edits", "--epochs", "1",
             "--batch-size", "4", "--eval-split", "val", "--out", str(out), "--run-dir", str(tmp_path / "run"),
             "--report", str(tmp_path / "report.json"), "--quiet", "--no-anchor"])
    data = seen["data"]
    tone_texts = {x for texts in TONE_TEXTS.values() for x in texts}
    rows = [i for i in range(len(data)) if data.text_list[int(data.text[i])] in tone_texts]
    refs = {data.image_keys[int(data.ref[i])] for i in rows}
    train_photos = {str(images / "photos" / n) for n in ("a.png", "b.png")}
    assert len(rows) == 4 and refs == train_photos  # two photos x two edits, never a val photo or a drawing
    for i in rows:
        ref, tgt = data.image_keys[int(data.ref[i])], data.image_keys[int(data.tgt[i])]
        kind = next(k for k, texts in TONE_TEXTS.items() if data.text_list[int(data.text[i])] in texts)
        assert tgt == str(edited_file(ref, kind))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["tone_triplets"] == 4 and report["eval_split"] == "val"
    assert {"image", "text", "sum", "rtic"} <= set(report["held_out_tone"])
    assert {k: v["queries"] for k, v in report["held_out_tone_by_kind"].items()} == {"bw": 2, "night": 2}
    sidecar = json.loads(next(out.glob("rtic-*.json")).read_text())
    assert sidecar["held_out_tone"] == report["held_out_tone"] and sidecar["tone_edits"] is True


def test_tone_edits_need_the_offline_cir_set():
    from engine.train.rtic import main

    with pytest.raises(InputError, match="--tone-edits needs --data cir"):
        main(["--data", "synthetic", "--tone-edits", "--quiet"])


