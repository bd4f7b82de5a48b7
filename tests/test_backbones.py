"""Every backbone through the one interface: shapes, normalisation, tokens, pseudo-word injection."""
import pytest
import torch
from PIL import Image

from engine.backbones import create_backbone


def _check_interface(b, n_tokens=None):
    imgs = [Image.new("RGB", (90, 70), c) for c in [(250, 10, 10), (10, 10, 250)]]
    x = torch.stack([b.preprocess(im) for im in imgs])
    emb, tokens = b.encode_images_with_tokens(x)
    assert emb.shape == (2, b.embed_dim)
    assert torch.allclose(emb.norm(dim=-1), torch.ones(2), atol=1e-4)
    assert tokens.shape[0] == 2 and tokens.shape[2] == b.vision_width
    if n_tokens:
        assert tokens.shape[1] == n_tokens
    assert torch.allclose(b.encode_images(x), emb, atol=1e-5)
    t = b.encode_texts(["a red square", "a blue square"])
    assert t.embeddings.shape == (2, b.embed_dim) and t.notices == []
    assert torch.allclose(t.embeddings.norm(dim=-1), torch.ones(2), atol=1e-4)
    assert b.fingerprint.startswith(b.name + "@")


@pytest.mark.parametrize("cfg,tokens", [("tiny-vit-a", 1 + 16), ("tiny-vit-b", 1 + 4)])
def test_tiny_backbones(cfg, tokens):
    b = create_backbone(f"tiny:{cfg}", "cpu")
    _check_interface(b, tokens)


def test_packaged_backbone(packaged):
    _check_interface(packaged, 1 + 7 * 7)
    assert packaged.text_dim == 384 and packaged.vision_width == 1280
    assert packaged.embed_dim == 384 + packaged.visual.dim  # the class-name bridge + the visual channel


def test_packaged_image_embedding_is_the_class_bridge(packaged):
    """embedding = normalise(softmax(logits) @ normalised class-name text embeddings)."""
    x = packaged.preprocess(Image.new("RGB", (64, 64), (30, 200, 40)))[None]
    probs, _ = packaged.class_probabilities(x)
    names = packaged.class_names[:3]
    direct = packaged.encode_texts([f"a photo of a {n}." for n in names]).embeddings
    assert torch.allclose(direct[:, :packaged.text_dim], packaged.class_text[:3], atol=1e-5)
    assert direct[:, packaged.text_dim:].abs().max() == 0  # texts have nothing in the visual block
    expect = torch.nn.functional.normalize(probs @ packaged.class_text, dim=-1)
    class_part, _, _ = packaged.image_parts(x)
    assert torch.allclose(class_part, expect, atol=1e-5)  # the concept part: tests/test_concepts.py


@pytest.mark.parametrize("name", ["tiny:tiny-vit-a", "tiny:tiny-vit-b", "packaged"])
def test_pseudo_word_injection_matches_the_real_word(name):
    b = create_backbone(name, "cpu")
    for word in ("cat", "dog"):
        emb = b.word_token_embedding(word)
        injected = b.encode_texts_with_pseudo([f"a photo of a {b.placeholder}"], emb[None])
        written = b.encode_texts([f"a photo of a {word}"]).embeddings
        assert torch.allclose(injected, written, atol=1e-5)
    # a different embedding gives a different text embedding, and gradients reach the pseudo word
    p = torch.randn(1, b.token_dim, requires_grad=True)
    out = b.encode_texts_with_pseudo([f"a photo of a {b.placeholder}"], p)
    out.sum().backward()
    assert p.grad is not None and p.grad.abs().sum() > 0


def test_openai_bpe_backbones_use_the_authors_replace_token(tiny):
    """With the OpenAI CLIP BPE the pseudo-word slot is <|replace|>, the id of the dropped last merge."""
    from open_clip.tokenizer import SimpleTokenizer

    vocab = SimpleTokenizer()  # the vocabulary as open_clip ships it
    last_merge = max(vocab.bpe_ranks, key=vocab.bpe_ranks.get)
    assert vocab.encoder["".join(last_merge)] == 49405 == tiny.placeholder_id
    assert (vocab.sot_token_id, vocab.eot_token_id) == (49406, 49407)
    assert tiny.placeholder == "<|replace|>"
    ids = tiny.tokenizer(["a photo of <|replace|> , in red"])[0].tolist()
    n = len(vocab.encode("a photo of")) + len(vocab.encode(", in red")) + 3
    assert ids[:n] == [49406, *vocab.encode("a photo of"), 49405, *vocab.encode(", in red"), 49407]
    for text in ("the same dress but red", "the building at night", "a German shepherd, a cat instead"):
        assert tiny.tokenizer.encode(text) == vocab.encode(text)  # every other text tokenizes as before
    # the one word that used the dropped merge still encodes (in smaller pieces), never as the placeholder
    assert 49405 not in tiny.tokenizer.encode("jekyll") and tiny.tokenizer.decode(tiny.tokenizer.encode("jekyll")) \
        .strip() == "jekyll"
    assert tiny.count_tokens("a <|replace|>") == 4
    # tokenizers other than the OpenAI BPE keep the documented '*'
    assert create_backbone("packaged", "cpu").placeholder == "*"


def test_pseudo_word_needs_the_placeholder(tiny):
    from engine.errors import EngineError

    with pytest.raises(EngineError, match="placeholder"):
        tiny.encode_texts_with_pseudo(["no placeholder here"], torch.zeros(1, tiny.token_dim))


def test_overlong_text_is_truncated_with_a_notice(tiny):
    long = "red " * 200
    enc = tiny.encode_texts([long])
    assert enc.embeddings.shape == (1, tiny.embed_dim)
    assert enc.notices and "truncated" in enc.notices[0]


def test_auto_falls_back_offline_fast(monkeypatch):
    from engine.backbones import factory, openclip  # noqa: F401

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from engine.config import Settings

    assert openclip.hub_reachable(timeout=30, offline=True) is False  # answers at once, without the network
    b = factory.create_backbone("auto", "cpu", cache=False, settings=Settings())  # HF_HUB_OFFLINE read here
    assert b.name.startswith("packaged:")
    assert "offline" in b.why


def test_auto_waits_as_long_as_settings_say_and_leaves_the_process_environment_alone(monkeypatch):
    """The hub timeout comes from Settings (CIS_AUTO_TIMEOUT_S), and falling back offline does not switch
    the whole process to HF_HUB_OFFLINE."""
    import os

    from engine.backbones import factory, openclip  # noqa: F401
    from engine.config import Settings

    waited = []
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(factory, "pretrained_cached", lambda arch, tag: False)
    monkeypatch.setattr(factory, "hub_reachable", lambda timeout, offline: waited.append(timeout) or offline)
    monkeypatch.setenv("CIS_AUTO_TIMEOUT_S", "0.25")
    s = Settings()
    monkeypatch.setenv("CIS_AUTO_TIMEOUT_S", "9")  # read once: a later change does not reach this Settings
    b = factory.create_backbone("auto", "cpu", cache=False, settings=s)
    assert waited == [0.25]
    assert b.name.startswith("packaged:") and "0.25 s" in b.why
    assert "HF_HUB_OFFLINE" not in os.environ


def test_unknown_backbone_is_a_clear_error():
    from engine.errors import EngineError

    with pytest.raises(EngineError, match="unknown backbone"):
        create_backbone("nope", "cpu")


def _photos():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "assets" / "gallery"
    return sorted(root.rglob("*.jpg"))[:12]


def test_visual_channel_leaves_text_rankings_alone_and_adds_the_look(packaged):
    """image = [sqrt(1 - w^2) bridge ; w visual]: text scores are the bridge's times a constant (same
    ranking), image-to-image scores are c^2 bridge.bridge + w^2 visual.visual."""
    from engine.backbones.packaged import PackagedBackbone

    bridge_only = PackagedBackbone("lite0", visual=0.0)
    assert bridge_only.visual is None and bridge_only.embed_dim == 384
    assert bridge_only.fingerprint != packaged.fingerprint and "visual-" in packaged.fingerprint
    x = torch.stack([packaged.preprocess(Image.open(p).convert("RGB")) for p in _photos()])
    new, old = packaged.encode_images(x), bridge_only.encode_images(x)
    w = packaged.visual.weight
    c = (1 - w * w) ** 0.5
    assert torch.allclose(new[:, :384], c * old, atol=1e-5)
    texts = ["a dog", "a red car at night", "a flower"]
    t_new, t_old = packaged.encode_texts(texts).embeddings, bridge_only.encode_texts(texts).embeddings
    assert torch.allclose(t_new @ new.T, c * (t_old @ old.T), atol=1e-5)
    vis = new[:, 384:] / w
    assert torch.allclose(vis.norm(dim=-1), torch.ones(len(x)), atol=1e-4)
    assert torch.allclose(new @ new.T, c * c * (old @ old.T) + w * w * (vis @ vis.T), atol=1e-4)


def test_visual_projection_refit_is_reproducible_and_a_damaged_file_is_refused(tmp_path):
    import numpy as np

    from engine.backbones.visual import fit_projection, load_channel, projection_path

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 16)) @ np.diag(np.geomspace(8, 0.1, 16))
    m1, c1 = fit_projection(x, 4)
    m2, c2 = fit_projection(x[::-1].copy(), 4)  # same bank, other order: same projection, signs included
    assert np.allclose(m1, m2, atol=1e-6) and np.allclose(c1, c2, atol=1e-5)
    assert np.allclose(c1.T @ c1, np.eye(4), atol=1e-5)  # orthonormal directions
    # the leading direction is the one of largest variance (axis 0 here)
    assert abs(c1[0, 0]) > 0.95 and abs(c1[1, 1]) > 0.9
    np.savez(projection_path("lite9", tmp_path), mean=m1, components=c1)
    ch = load_channel("lite9", 0.5, tmp_path)
    assert ch.dim == 4 and ch.weight == 0.5
    assert load_channel("lite9", 0.0, tmp_path) is None and load_channel("lite8", 0.5, tmp_path) is None
    np.savez(projection_path("lite7", tmp_path), mean=m1, components=c1[:5])
    with pytest.raises(ValueError, match="not a visual projection"):
        load_channel("lite7", 0.5, tmp_path)


def test_definitions_bridge_is_its_own_version_and_describes_each_class_by_name_and_definition(packaged):
    """class table = normalise(e("a photo of a NAME.") + e("a photo of a NAME, DEFINITION.")); another
    fingerprint and name (checkpoints of the shipped version never load for it); texts are unchanged."""
    from engine.backbones.packaged import DEFINITION_PROMPT, imagenet_definitions

    defs = create_backbone("packaged:lite0+definitions", "cpu")
    assert defs.bridge == "definitions" and packaged.bridge == "names"
    assert defs.fingerprint != packaged.fingerprint and "+definitions-" in defs.fingerprint
    assert defs.name == packaged.name + "+definitions"
    glosses = imagenet_definitions()
    assert glosses[0].startswith("freshwater dace-like game fish") and "barrier" in glosses[defs.class_names.index("dam")]
    rows = [0, defs.class_names.index("dam"), 999]
    names = packaged.encode_texts([f"a photo of a {defs.class_names[i]}." for i in rows]).embeddings[:, :384]
    described = packaged.encode_texts([DEFINITION_PROMPT.format(defs.class_names[i], glosses[i])
                                       for i in rows]).embeddings[:, :384]
    expect = torch.nn.functional.normalize(names + described, dim=-1)
    assert torch.allclose(defs.class_text[rows], expect, atol=1e-5)
    texts = ["a dog", "a barrier that holds back water"]
    assert torch.allclose(defs.encode_texts(texts).embeddings, packaged.encode_texts(texts).embeddings, atol=1e-6)
    # a word no class is named after reaches its class through the definition, not through the names alone
    t = packaged.encode_texts(["a barrier that holds back water"]).embeddings[:, :384]
    assert defs.class_names[int((t @ defs.class_text.T).argmax())] == "dam"
    assert packaged.class_names[int((t @ packaged.class_text.T).argmax())] != "dam"


def test_packaged_spec_options_are_checked_in_one_sentence(tmp_path):
    from engine.backbones.packaged import imagenet_definitions, parse_spec
    from engine.errors import EngineError

    assert parse_spec("") == ("lite0", "names") and parse_spec("lite2+definitions") == ("lite2", "definitions")
    assert parse_spec("definitions") == ("lite0", "definitions")
    with pytest.raises(EngineError, match="unknown packaged backbone option 'glosses'"):
        create_backbone("packaged:lite0+glosses", "cpu")
    short = tmp_path / "defs.tsv"
    short.write_text("# header\n0\tn01440764\ta fish\n2\tn01443537\tanother fish\n")
    with pytest.raises(EngineError, match="class 2 where class 1 was expected"):
        imagenet_definitions(short)
    short.write_text("0\tn01440764\ta fish\n")
    with pytest.raises(EngineError, match="defines 1 classes"):
        imagenet_definitions(short)


def test_the_bundled_definitions_table_is_the_tools_output():
    """assets/wordnet/imagenet-definitions.tsv is what tools/imagenet_definitions.py writes from timm's WordNet
    copy (so rerunning the tool reproduces it), one definition per class in the classifier's order."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("imagenet_definitions", root / "tools" / "imagenet_definitions.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    lines = [ln for ln in (root / "assets" / "wordnet" / "imagenet-definitions.tsv").read_text().splitlines()
             if not ln.startswith("#")]
    assert lines == [f"{i}\t{w}\t{g}" for i, w, g in tool.rows()]
    assert (root / "assets" / "wordnet" / "LICENSE").read_text().count("Princeton University") >= 2
