"""The bundled gallery answers the page's promises (#33): every photo is large enough to show as a tile, the edits
the page advertises (another colour, at night, in black and white) have several right answers, derived photos
say what they were made from (in plain words in the caption a visitor reads, in full in the attribution), and
the natural-query list covers every kind of edit."""
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
        assert how in rows[rel][2], rel   # the full derivation is in the attribution; the caption is plain words
        assert captions[rel].startswith(captions[base] + " "), rel
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


# what a visitor must never read in a caption: code, file names, the derivation of a made photo
CODE_LIKE = ("engine.", "(rgb", "derived from", ".py", "_", ".jpg", "photo_edit")
PLAIN_EDIT = {"night": ("at night", "darkened version of the daytime photo"),
              "bw": ("in black and white", "made from the colour photo")}


def test_captions_are_plain_words_and_derived_ones_name_their_edit():
    """The captions are what the page shows under each result and in the picker: no code-like text anywhere, and a
    derived photo says in plain words what it is ("the Colosseum at night (a darkened version of the daytime
    photo)")."""
    from tools.gallery_additions import DERIVED

    captions = json.loads((GALLERY / "captions.json").read_text(encoding="utf-8"))
    coded = {rel: cap for rel, cap in captions.items() if any(s in cap for s in CODE_LIKE)}
    assert not coded, coded
    present = [(rel, base, kind) for rel, base, kind in DERIVED if rel in captions]
    assert len(present) >= 20
    for rel, base, kind in present:
        edit, note = PLAIN_EDIT[kind]
        assert captions[rel] == f"{captions[base]} {edit} ({'a ' * (kind == 'night')}{note})", rel


def test_the_gallery_generator_writes_plain_captions_and_the_full_derivation_to_the_attribution(tmp_path,
                                                                                                  monkeypatch):
    """``tools/build_gallery.py``'s second pass on a one-photo gallery: the night and black-and-white versions it
    makes get plain captions, and their attribution lines keep the base's file, the function and the licence."""
    import tools.gallery_additions as additions
    from tools.build_gallery import read_attribution, refresh

    out = tmp_path / "gallery"
    (out / "buildings").mkdir(parents=True)
    Image.new("RGB", (300, 200), (200, 120, 40)).save(out / "buildings" / "tower.jpg")
    (out / "captions.json").write_text(json.dumps({"buildings/tower.jpg": "the tower"}), encoding="utf-8")
    (out / "labels.json").write_text(json.dumps({"buildings/tower.jpg": ["buildings", "tower"]}), encoding="utf-8")
    (tmp_path / "ATTRIBUTION").write_text("buildings/tower.jpg\tsrc 1\ttower.png\tCC0\tsomeone\thttps://example.org\n",
                                          encoding="utf-8")
    monkeypatch.setattr(additions, "ADDITIONS", [])
    monkeypatch.setattr(additions, "COLOUR_LABELS", {})
    monkeypatch.setattr(additions, "KIND_LABELS", {})
    monkeypatch.setattr(additions, "REAL_BLACK_AND_WHITE", ())
    monkeypatch.setattr(additions, "DERIVED", [("buildings/tower-at-night.jpg", "buildings/tower.jpg", "night"),
                                               ("buildings/tower-black-and-white.jpg", "buildings/tower.jpg", "bw")])
    refresh(out)
    captions = json.loads((out / "captions.json").read_text(encoding="utf-8"))
    assert captions == {"buildings/tower.jpg": "the tower",
                        "buildings/tower-at-night.jpg": "the tower at night (a darkened version of the daytime photo)",
                        "buildings/tower-black-and-white.jpg": "the tower in black and white (made from the colour photo)"}
    rows = {row[0]: row for row in read_attribution(tmp_path / "ATTRIBUTION")}
    for rel, kind in (("buildings/tower-at-night.jpg", "night"), ("buildings/tower-black-and-white.jpg", "bw")):
        assert rows[rel][2] == ("tower.png (derived from buildings/tower.jpg by "
                                f"engine.data.tone.photo_edit(rgb, '{kind}'))"), rows[rel]
        assert rows[rel][3:] == ("CC0", "someone", "https://example.org")
        assert (out / rel).is_file()


def test_the_page_shows_the_plain_caption_of_a_derived_photo(gallery_engine):
    """The caption under a result and in the gallery picker is the plain one, read from the index the page serves."""
    from demo.formatting import gallery_items
    from demo.handlers import browse_gallery
    from engine.search import search

    rel = "buildings/colosseum-at-night.jpg"
    plain = "Colosseum at night (a darkened version of the daytime photo)"
    items, ids, _, _ = browse_gallery(gallery_engine, "colosseum night")
    assert (plain in [cap for _, cap in items]) and len(ids) >= 1, items
    i = next(it["id"] for it in gallery_engine.index.items if it["path"] == rel)
    resp = search(gallery_engine, image=str(gallery_engine.index.image_path(i)), text="at night", k=12)
    shown = [cap for _, cap in gallery_items(gallery_engine, resp)]
    assert any(cap.endswith(" · " + plain) for cap in shown), shown
    assert not any(s in cap for cap in shown for s in CODE_LIKE if s != "_"), shown
