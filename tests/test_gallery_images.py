"""The bundled gallery answers the page's promises (#33): every photo is large enough to show as a tile, the edits
the page advertises (another colour, at night, in black and white) have several right answers, derived photos
say what they were made from, and the natural-query list covers every kind of edit."""
import json
from collections import Counter
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
GALLERY = ROOT / "assets" / "gallery"


def _labels():
    return json.loads((GALLERY / "labels.json").read_text(encoding="utf-8"))


def _attribution():
    rows = {}
    for line in (ROOT / "assets" / "ATTRIBUTION").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            cols = line.split("\t")
            rows[cols[0]] = cols
    return rows


def test_every_gallery_image_is_at_least_256_px_on_its_long_side():
    from tools.gallery_additions import MIN_SIDE

    assert MIN_SIDE == 256
    files = sorted(GALLERY.rglob("*.jpg"))
    assert files
    small = []
    for f in files:
        with Image.open(f) as img:
            if max(img.size) < MIN_SIDE:
                small.append((f.relative_to(GALLERY).as_posix(), img.size))
    assert not small, small


def test_the_advertised_edits_have_several_right_answers():
    labels = _labels()
    with_label = lambda name: [f for f, ls in labels.items() if name in ls]  # noqa: E731
    night, bw = with_label("night"), with_label("black and white")
    assert len(night) >= 12 and all(f.startswith("buildings/") for f in night)
    assert len([f for f in bw if f.startswith("buildings/")]) >= 8
    assert len({f.split("/")[0] for f in bw}) >= 4   # black and white is not only buildings
    # the same kind of object in several colours, and no black-and-white photo carries a colour name
    for thing, colours in [("hoodie", {"black", "white", "blue", "mustard"}), ("shoes", {"white", "yellow"}),
                           ("polo shirt", {"black", "white"}), ("paint", {"red", "turquoise"}),
                           ("flower", {"red", "yellow", "pink"})]:
        have = {c for c in colours if with_label(f"{c} {thing}")}
        assert have == colours, (thing, have)
    assert len(with_label("white shoes")) >= 4
    for f in bw:
        assert not {"red", "yellow", "white shoes", "yellow shoes"} & set(labels[f]), f


def test_derived_photos_name_their_base_and_the_edit_that_made_them():
    from tools.gallery_additions import DERIVED, EDIT_WORDS

    labels, rows = _labels(), _attribution()
    captions = json.loads((GALLERY / "captions.json").read_text(encoding="utf-8"))
    present = [(rel, base, kind) for rel, base, kind in DERIVED if rel in labels]
    assert len(present) >= 20
    for rel, base, kind in present:
        _, label, base_label = EDIT_WORDS[kind]
        how = f"derived from {base} by engine.data.tone.photo_edit(rgb, '{kind}')"
        assert how in captions[rel] and how in rows[rel][2], rel
        assert label in labels[rel] and base_label in labels[base], rel
        assert rows[rel][3] == rows[base][3]   # the base photo's licence
        with Image.open(GALLERY / rel) as a, Image.open(GALLERY / base) as b:
            assert a.size == b.size
            if kind == "bw":
                r, g, bl = a.convert("RGB").split()
                assert max(abs(x - y) for x, y in zip(r.getdata(), g.getdata())) <= 8, rel   # grey, JPEG noise


def test_natural_queries_cover_every_advertised_edit():
    from engine.eval.gallery_queries import load_queries

    labels = _labels()
    queries = load_queries()
    assert len(queries) >= 40
    kinds = Counter(q["kind"] for q in queries)
    assert set(kinds) == {"category", "colour", "night", "bw"} and min(kinds.values()) >= 8, kinds
    for q in queries:
        assert q["reference"] in labels and q["reference"] not in q["answers"], q
        assert all(a in labels for a in q["answers"]), q
        if q["kind"] == "night" and "night" in q["text"]:
            assert all("night" in labels[a] for a in q["answers"]), q
        if q["kind"] == "bw" and "black and white" in q["text"]:
            assert all("black and white" in labels[a] for a in q["answers"]), q
