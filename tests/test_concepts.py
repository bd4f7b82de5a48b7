"""The packaged backbone's colour, light and tone concepts: colour naming against known colours, the
salient region of a cut-out, light/tone scores, the tone edits, and the embedding bridge formula."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from engine.backbones.concepts import (COLOUR_TERMS, LIGHT_PROMPTS, OBJECT_PROMPT, SCENE_PROMPT, ConceptWeights,
                                       colour_memberships, concept_scores, srgb_to_lab)
from engine.data.tone import tone_edit

TERMS = list(COLOUR_TERMS)


def _rgb(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)[None]


def test_lab_matches_reference_values():
    # sRGB white -> L 100, a = b = 0; pure red -> (53.24, 80.09, 67.20) (CIE Lab, D65)
    lab = srgb_to_lab(torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.allclose(lab[0], torch.tensor([100.0, 0.0, 0.0]), atol=0.05)
    assert torch.allclose(lab[1], torch.tensor([53.24, 80.09, 67.20]), atol=0.05)
    assert torch.allclose(lab[2], torch.zeros(3), atol=1e-3)


@pytest.mark.parametrize("rgb,name", [((220, 20, 30), "red"), ((20, 60, 220), "blue"), ((30, 170, 50), "green"),
                                      ((250, 225, 20), "yellow"), ((130, 40, 170), "purple"),
                                      ((245, 245, 245), "white"), ((10, 10, 10), "black"),
                                      ((120, 120, 120), "grey"), ((250, 140, 20), "orange"),
                                      ((120, 75, 35), "brown"), ((245, 150, 190), "pink")])
def test_colour_naming_of_plain_colours(rgb, name):
    lab = srgb_to_lab(torch.tensor(rgb, dtype=torch.float32) / 255.0)
    member = colour_memberships(lab, sigma=8.0)
    assert abs(float(member.sum()) - 1.0) < 1e-5
    assert TERMS[int(member.argmax())] == name


def test_object_colour_is_the_cut_out_not_the_background():
    img = Image.new("RGB", (120, 120), (255, 255, 255))
    ImageDraw.Draw(img).ellipse((35, 35, 85, 85), fill=(25, 60, 210))
    sc = concept_scores(_rgb(img), sigma=8.0)
    assert TERMS[int(sc["object"][0].argmax())] == "blue" and float(sc["object"][0].max()) > 0.6
    assert TERMS[int(sc["scene"][0].argmax())] == "white"  # the whole picture is mostly white
    # the same disc in red: object colour changes, scene colour does not
    img2 = Image.new("RGB", (120, 120), (255, 255, 255))
    ImageDraw.Draw(img2).ellipse((35, 35, 85, 85), fill=(215, 25, 30))
    sc2 = concept_scores(_rgb(img2), sigma=8.0)
    assert TERMS[int(sc2["object"][0].argmax())] == "red"
    assert TERMS[int(sc2["scene"][0].argmax())] == "white"


def test_light_and_tone_scores_follow_the_edits():
    rng = np.random.default_rng(0)
    photo = torch.from_numpy(rng.uniform(0.2, 0.95, (1, 3, 64, 64)).astype(np.float32))
    photo[:, 0] *= 0.6  # a colourful, mid-bright picture
    night, day, bw = concept_scores(photo)["light"][0].tolist()
    assert night < 0.2 and bw < 0.2
    n2, _, _ = concept_scores(tone_edit(photo, "night"))["light"][0].tolist()
    _, _, bw2 = concept_scores(tone_edit(photo, "bw"))["light"][0].tolist()
    assert n2 > 0.8 and bw2 > 0.9
    grey = tone_edit(photo, "bw")
    assert torch.allclose(grey[:, 0], grey[:, 1]) and torch.allclose(grey[:, 1], grey[:, 2])
    assert float(tone_edit(photo, "night").mean()) < 0.5 * float(photo.mean())
    with pytest.raises(ValueError):
        tone_edit(photo, "sepia")


def test_bridge_formula_and_version(packaged):
    """With concepts on, the image embedding is normalise(class mixture + w_o * object-colour mixture
    + w_s * scene mixture + w_l * light scores), each mixture of phrases embedded by the text encoder."""
    from engine.backbones.packaged import PackagedBackbone

    w = ConceptWeights(classes=1.0, object_colour=0.7, scene_colour=0.3, light=0.5, sigma=8.0)
    b = PackagedBackbone("lite0", concepts=w, visual=0.0)  # the bridge alone (the visual channel: test_backbones)
    off = PackagedBackbone("lite0", concepts=ConceptWeights(), visual=0.0)
    assert b.fingerprint != off.fingerprint and b.fingerprint.startswith(off.fingerprint + "+concepts-")
    img = Image.new("RGB", (96, 96), (250, 250, 250))
    ImageDraw.Draw(img).rectangle((30, 20, 66, 76), fill=(200, 30, 35))
    x = b.preprocess(img)[None]
    probs, _ = b.class_probabilities(x)
    cls = torch.nn.functional.normalize(probs @ b.class_text, dim=-1)
    sc = concept_scores(x * b._std + b._mean, sigma=8.0)
    enc = lambda texts: b.encode_texts(texts).embeddings  # noqa: E731
    obj = torch.nn.functional.normalize(sc["object"] @ enc([OBJECT_PROMPT.format(t) for t in TERMS]), dim=-1)
    scene = torch.nn.functional.normalize(sc["scene"] @ enc([SCENE_PROMPT.format(t) for t in TERMS]), dim=-1)
    light = sc["light"] @ enc(list(LIGHT_PROMPTS.values()))
    expect = torch.nn.functional.normalize(cls + 0.7 * obj + 0.3 * scene + 0.5 * light, dim=-1)
    assert torch.allclose(b.encode_images(x), expect, atol=1e-4)
    assert torch.allclose(off.encode_images(x), cls, atol=1e-5)


def test_colour_changes_the_image_embedding(packaged):
    """The shipped backbone sees colour: the same shape in two colours is no longer the same image, and
    the text "red" is closer to the red one."""
    assert packaged.concepts.object_colour > 0  # the shipped weighting (docs/backbones.md)
    imgs = []
    for fill in [(210, 25, 30), (30, 60, 215)]:
        im = Image.new("RGB", (96, 96), (255, 255, 255))
        ImageDraw.Draw(im).rectangle((25, 15, 71, 81), fill=fill)
        imgs.append(packaged.preprocess(im))
    e = packaged.encode_images(torch.stack(imgs))
    assert float(e[0] @ e[1]) < 0.97
    red = packaged.encode_texts(["red"]).embeddings[0]
    assert float(e[0] @ red) > float(e[1] @ red)
