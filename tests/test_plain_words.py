"""Issue #33: the page speaks a stakeholder's language first (the method in use and why in one plain
sentence, the offline backbone said for what it is), nothing a page or API client reads holds character
references, and the notes agree with the figures beside them."""
import re
from types import SimpleNamespace

import pytest

ENTITY = re.compile(r"&(#\d+|#x[0-9a-fA-F]+|[A-Za-z]+);")


def test_method_line_is_plain_and_the_figures_are_in_about(gallery_engine):
    from demo.formatting import LABELS, backbone_markdown, default_method_note

    line = default_method_note(gallery_engine)
    method = gallery_engine.default_method
    assert line.startswith(f"Method in use: **{LABELS[method]}**. Why: ")
    assert not re.search(r"\d", line) and "validation" not in line and "held-out" not in line, line
    assert gallery_engine.defaults.why() in backbone_markdown(gallery_engine)  # the details, on demand


def _fake_engine(why: str):
    backbone = SimpleNamespace(describe=lambda: {"name": "packaged:efficientnet-lite0", "device": "cpu", "why": why})
    return SimpleNamespace(backbone=backbone, index=SimpleNamespace(stats=lambda: {"items": 381}))


def test_offline_backbone_notice_says_what_it_is_not_that_something_failed():
    from demo.formatting import plain_summary

    text = plain_summary(_fake_engine("offline fallback: no network and no cached CLIP weights"))
    assert "without a network connection" in text
    assert not re.search(r"could not|failed|error|broken", text, re.I), text
    assert "without a network" not in plain_summary(_fake_engine("asked for by name"))


def test_explanation_read_by_a_page_or_api_client_has_no_character_references(gallery_engine):
    from demo import handlers as h

    _, expl, raw, _, _ = h.run_search(gallery_engine, 5, "It's a cep (big) + red", "sum", 0.5, 4, False, "none", 0)
    assert not ENTITY.search(expl), ENTITY.findall(expl)
    assert "It's a cep (big) + red" in expl and "q = (1-a)*img" in expl and "encode image" in expl


@pytest.mark.parametrize("comp, says, never", [
    ({"trust": 0.0, "text_familiarity": 1.0, "image_familiarity": 0.1}, "the picture is unlike", "text is unlike"),
    ({"trust": 0.0, "text_familiarity": 0.2, "image_familiarity": 0.9}, "the text is unlike", "picture is unlike"),
    ({"trust": 0.0, "text_familiarity": 0.1, "image_familiarity": 0.1}, "the text and the picture", "does not help"),
    ({"trust": 0.0, "text_familiarity": 1.0, "image_familiarity": 1.0,
      "operation": {"name": "colour", "probability": 0.9, "trust": 0.0}}, "does not help with “colour” edits",
     "unlike"),
    ({"trust": 0.0, "text_familiarity": 1.0, "image_familiarity": 0.95}, "not trusted for this query", "unlike"),
])
def test_the_learned_correction_note_agrees_with_its_figures(comp, says, never):
    """RTIC's note said "unlike its training data" beside text familiarity 1.00: the reason named is the
    input whose familiarity is low, or the operation the router read."""
    from demo.formatting import anchor_lines

    line = " ".join(anchor_lines(comp))
    assert says in line and never not in line, line
