"""`eval offline --only edits-seen`: which picture edits the packaged backbone can see, measured on real photos."""
from pathlib import Path

from PIL import Image

GALLERY = Path(__file__).resolve().parent.parent / "assets" / "gallery"


def test_the_backbone_sees_black_and_white_but_not_a_mirror(packaged):
    from engine.eval.edits import EDITS, measure, seen

    import json

    labels = json.loads((GALLERY / "labels.json").read_text())
    # colour photos as they were taken: the gallery's derived black-and-white and night versions are edits already
    originals = [p for p in sorted(GALLERY.rglob("*.jpg"))
                 if not {"black and white", "night"} & set(labels.get(p.relative_to(GALLERY).as_posix(), []))]
    photos = []
    for p in originals[::12][:24]:
        with Image.open(p) as im:
            photos.append(im.convert("RGB"))
    res = measure(packaged, photos)
    assert set(res) == set(EDITS)
    assert res["mirror"]["cosine"] > 0.97                     # a mirror image embeds almost like the original
    assert not seen(res["mirror"], len(res))                  # and words do not find it
    assert seen(res["black and white"], len(res))
    for r in res.values():
        assert 0.0 <= r["text_picks"] <= 1.0 and 0.0 <= r["image_picks"] <= 1.0
