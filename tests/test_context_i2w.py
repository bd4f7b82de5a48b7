"""Context-I2W: mapper shapes, frozen backbone, gate, pseudo-word injection, training on a small real set,
the authors'-checkpoint mapping against an independent reference forward, spaCy subject replacement,
checkpoints and the composer factory."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.backbones.factory import create_backbone
from engine.compose.base import COMPOSERS, ComposerUnavailable, Query
from engine.checkpoints import file_name
from engine.compose.context_i2w import (ContextI2WComposer, ContextI2WConfig, ContextI2WMapper, load_authors_checkpoint,
                                        load_context_i2w, save_context_i2w)
from engine.errors import CheckpointError, InputError

SMALL = dict(depth=1, heads=2, dim_head=16, middle_dim=64)


@pytest.fixture(scope="module", autouse=True)
def _isolated_cache(tmp_path_factory):
    old = os.environ.get("CIS_CACHE_DIR")
    os.environ["CIS_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    torch.set_num_threads(1)
    yield
    if old is None:
        os.environ.pop("CIS_CACHE_DIR", None)
    else:
        os.environ["CIS_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def tiny_a():
    return create_backbone("tiny:tiny-vit-a", "cpu")


@pytest.fixture(scope="module")
def tiny_b():
    return create_backbone("tiny:tiny-vit-b", "cpu")


def _mapper(backbone, seed=0, **kw):
    torch.manual_seed(seed)
    return ContextI2WMapper(ContextI2WConfig.for_backbone(backbone, **{**SMALL, **kw})).eval()  # no dropout


def _tokens(backbone, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return backbone.encode_images_with_tokens(torch.randn(n, 3, 64, 64, generator=g))


# -- model ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny_a", "tiny_b"])
def test_output_shapes_and_composer(name, request):
    bb = request.getfixturevalue(name)
    m = _mapper(bb)
    emb, tok = _tokens(bb)
    ctx = bb.encode_texts(["* on a table", "a red *", "* running"]).embeddings
    s = m(ctx, tok)
    assert s.shape == (3, bb.token_dim)
    assert tok.shape[-1] == bb.vision_width
    comp = ContextI2WComposer(bb, m)
    out = comp.compose(Query(text="with a red hat", image_embedding=emb[0], image_tokens=tok[0], has_image=True))
    assert out.vector.shape == (bb.embed_dim,)
    assert abs(float(np.linalg.norm(out.vector)) - 1) < 1e-5
    assert out.explanation["prompt"] == f"a photo of {bb.placeholder} , with a red hat"
    assert out.explanation["gate"] == 0.0
    # the vector is the text encoder's embedding of that prompt with S* computed from that prompt's context
    ctx1 = bb.encode_texts([out.explanation["prompt"]]).embeddings
    ref = bb.encode_texts_with_pseudo([out.explanation["prompt"]], m(ctx1, tok[:1]))[0].detach()
    assert np.allclose(out.vector, ref.numpy(), atol=1e-5)
    # the placeholder inside user text is removed with a notice, never a crash
    out2 = comp.compose(Query(text=f"a {bb.placeholder} star", image_embedding=emb[0], image_tokens=tok[0],
                              has_image=True))
    assert out2.explanation["prompt"] == f"a photo of {bb.placeholder} , a star" and out2.notices
    # no image: the training-free prior (the text alone), saying so
    alone = comp.compose(Query(text="x", has_image=False))
    t = bb.encode_texts(["x"]).embeddings[0]
    np.testing.assert_allclose(alone.vector, (t / t.norm()).numpy(), atol=1e-5)
    assert "prior_only" in alone.explanation


def test_context_changes_the_pseudo_word(tiny_a):
    m = _mapper(tiny_a)
    _, tok = _tokens(tiny_a, 1)
    ctx = tiny_a.encode_texts(["* in the snow", "a drawing of *"]).embeddings
    s = m(ctx, tok.expand(2, -1, -1))
    assert not torch.allclose(s[0], s[1], atol=1e-4)


def test_gradients_reach_only_the_mapper(tiny_a):
    m = _mapper(tiny_a)
    with torch.no_grad():
        m.gate.fill_(0.5)  # with the gate at 0 the local branch would (correctly) get no gradient
    emb, tok = _tokens(tiny_a, 4)
    ctx = tiny_a.encode_texts(["* a", "* b", "* c", "* d"]).embeddings
    txt = tiny_a.encode_texts_with_pseudo([f"a photo of {tiny_a.placeholder}"] * 4, m(ctx, tok))
    loss = -(emb * txt).sum()
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    for name, p in tiny_a.model.named_parameters():
        assert not p.requires_grad and p.grad is None, name


def test_gate_at_zero_removes_the_local_branch(tiny_b):
    m = _mapper(tiny_b, depth=2)
    _, tok = _tokens(tiny_b, 2)
    ctx = tiny_b.encode_texts(["* one", "* two"]).embeddings
    assert m.gate_value() == 0.0
    base = m(ctx, tok).detach()
    g, l = m.parts(ctx, tok)
    assert torch.allclose(base, g)
    with torch.no_grad():  # scramble everything that only the local branch uses
        for p in list(m.local_branch.parameters()) + list(m.extractor.parameters()):
            p.add_(torch.randn_like(p))
    assert torch.equal(m(ctx, tok).detach(), base)
    with torch.no_grad():
        m.gate.fill_(0.3)
    g2, l2 = m.parts(ctx, tok)
    assert torch.allclose(m(ctx, tok), g2 + math.tanh(0.3) * l2, atol=1e-6)
    assert not torch.allclose(m(ctx, tok), base, atol=1e-4)


def test_injecting_a_real_word_equals_encoding_the_word(tiny_a):
    m = _mapper(tiny_a)
    word = tiny_a.word_token_embedding("dog")
    with torch.no_grad():  # make the mapper output exactly that token embedding
        m.global_branch.out.weight.zero_()
        m.global_branch.out.bias.copy_(word)
    _, tok = _tokens(tiny_a, 1)
    out = ContextI2WComposer(tiny_a, m).compose(Query(text="on the grass", image_embedding=torch.zeros(64),
                                                     image_tokens=tok[0], has_image=True))
    ref = tiny_a.encode_texts(["a photo of dog , on the grass"]).embeddings[0]
    assert np.allclose(out.vector, ref.numpy(), atol=1e-5)
    # and a different word gives a different vector
    other = tiny_a.encode_texts(["a photo of cat , on the grass"]).embeddings[0]
    assert not np.allclose(out.vector, other.numpy(), atol=1e-3)


# -- training on a small real set -------------------------------------------------------------------------

CAPTIONS = {
    "astronaut": "a woman in a space suit smiles in front of a flag", "coffee": "a cup of coffee sits on a saucer",
    "chelsea": "a ginger cat looks to the side", "rocket": "a rocket stands on the launch pad",
    "camera": "a man holds a camera on a tripod", "coins": "old coins lie on a dark table",
    "horse": "a horse stands in silhouette", "hubble_deep_field": "galaxies shine in deep space",
    "immunohistochemistry": "stained cells fill the slide", "moon": "the moon surface shows craters",
    "page": "a page of printed text", "text": "letters are written on a sign",
    "brick": "a brick wall runs across the picture", "grass": "green grass grows thick",
    "gravel": "gravel covers the ground", "colorwheel": "a colour wheel shows every hue",
    "logo": "a snake logo sits on a white background", "clock": "a clock hangs on the wall",
}


@pytest.fixture(scope="module")
def crops(tmp_path_factory):
    """Random crops of scikit-image's sample photos, captioned by hand: 7 train + 3 held-out per photo."""
    skd = pytest.importorskip("skimage.data")
    from PIL import Image

    from engine.train.context_i2w import Pair

    root = tmp_path_factory.mktemp("crops")
    rng = np.random.default_rng(0)
    train, val = [], []
    for name, cap in CAPTIONS.items():
        im = getattr(skd, name)()
        if im.dtype == bool:
            im = im.astype(np.uint8) * 255
        pil = Image.fromarray(im).convert("RGB")
        w, h = pil.size
        for k in range(10):
            s = int(min(w, h) * rng.uniform(0.5, 0.9))
            x, y = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
            p = root / f"{name}_{k}.png"
            pil.crop((x, y, x + s, y + s)).resize((64, 64)).save(p)
            (train if k < 7 else val).append(Pair(p, cap))
    return train, val


def test_training_lowers_loss_and_beats_the_untrained_mapper(tiny_b, crops, tmp_path):
    from engine.train.context_i2w import TrainConfig, evaluate_pairs, prepare_features, train_mapper

    train, val = crops
    ftr = prepare_features(tiny_b, train, progress=False)
    fva = prepare_features(tiny_b, val, progress=False)
    assert len(ftr) == len(train) and ftr.tokens.shape[1:] == (5, 96) and ftr.tokens.dtype == np.float16
    m = _mapper(tiny_b)
    before = evaluate_pairs(tiny_b, m, fva)["context-i2w"]
    out = tmp_path / "ckpt" / "context_i2w-test.safetensors"
    hist = train_mapper(tiny_b, m, ftr, TrainConfig(epochs=30, batch_size=16, lr=1e-3, warmup_steps=10),
                        out=out, run_dir=tmp_path / "run", progress=False)
    assert hist[-1]["step"] == 30 * (len(ftr) // 16) == 210
    assert hist[-1]["loss"] < 0.75 * hist[0]["loss"]
    after = evaluate_pairs(tiny_b, m, fva)["context-i2w"]
    chance5 = 5 / len(fva) * 100
    assert after["R@5"] > before["R@5"] + 15 and after["R@5"] > 2 * chance5, (before, after)
    # the per-epoch checkpoint reloads to the same mapper, for this backbone only
    m2, rec = load_context_i2w(out, tiny_b.fingerprint)
    assert rec["training"]["history"][-1]["epoch"] == 30
    _, tok = _tokens(tiny_b, 2)
    ctx = tiny_b.encode_texts(["* a", "* b"]).embeddings
    assert torch.allclose(m2(ctx, tok), m(ctx, tok), atol=1e-6)
    # resume continues from the saved state instead of starting again
    hist2 = train_mapper(tiny_b, m2, ftr, TrainConfig(epochs=31, batch_size=16, lr=1e-3, warmup_steps=10),
                         run_dir=tmp_path / "run", resume=True, progress=False)
    assert len(hist2) == 31 and hist2[:30] == hist


def test_global_dropout_opens_the_gate_and_select_best_keeps_the_best_epoch(tiny_b, crops):
    """Without help the gate stays near 0 (the global branch alone fits the loss); dropping the global
    branch for a share of rows makes the local branch carry the image, so |tanh(gate)| grows. With
    held-out pairs the trainer ends with the weights of its best epoch by their R@10."""
    from engine.train.context_i2w import TrainConfig, evaluate_pairs, prepare_features, train_mapper

    train, val = crops
    ftr = prepare_features(tiny_b, train, progress=False)
    fva = prepare_features(tiny_b, val, progress=False)
    gates = {}
    for p in (0.0, 0.5):
        torch.manual_seed(0)
        m = _mapper(tiny_b)
        hist = train_mapper(tiny_b, m, ftr, TrainConfig(epochs=8, batch_size=16, lr=1e-3, warmup_steps=5,
                                                        global_dropout=p, gate_init=0.1),
                            progress=False, val_feats=fva)
        gates[p] = abs(m.gate_value())
        best = max(range(len(hist)), key=lambda i: (hist[i]["val_R@10"], i))
        assert hist[-1]["best_epoch"] == hist[best]["epoch"]
        assert evaluate_pairs(tiny_b, m, fva)["context-i2w"]["R@10"] == pytest.approx(hist[best]["val_R@10"])
    assert gates[0.5] > gates[0.0] and gates[0.5] > 0.1, gates


def test_local_zero_init_starts_from_the_global_branch_and_the_local_branch_then_learns(tiny_b, crops):
    """With the local branch's last layer at zero and the gate open, S* starts exactly as the global branch's
    output (no random local noise); training then gives the local branch an output of its own."""
    from engine.train.context_i2w import TrainConfig, local_share, prepare_features, train_mapper

    ftr = prepare_features(tiny_b, crops[0], progress=False)
    torch.manual_seed(0)
    m = _mapper(tiny_b)
    cfg = TrainConfig(epochs=4, batch_size=16, lr=1e-3, warmup_steps=5, gate_init=0.3, local_zero_init=True,
                      global_dropout=0.3)
    train_mapper(tiny_b, m, ftr, cfg, progress=False, max_steps=0)
    _, tok = _tokens(tiny_b, 3)
    ctx = tiny_b.encode_texts(["* a", "* b", "* c"]).embeddings
    m.eval()
    g, loc = m.parts(ctx, tok)
    assert m.gate_value() == pytest.approx(0.3, abs=1e-6)
    assert float(loc.abs().max()) == 0.0 and torch.allclose(m(ctx, tok), g) and local_share(m, ftr) == 0.0
    train_mapper(tiny_b, m, ftr, cfg, progress=False)
    m.eval()
    g, loc = m.parts(ctx, tok)
    assert abs(m.gate_value()) > 0.1
    ratio = (m.gate.tanh() * loc).norm(dim=-1) / g.norm(dim=-1)
    assert float(ratio.min()) > 0.05
    assert local_share(m, ftr) > 0.05


def test_recoloured_pairs_name_the_new_colour(monkeypatch):
    from engine.data.cir_triplets import Triplet
    from engine.train.context_i2w import data as context_i2w_data
    from engine.train.context_i2w import load_pairs

    rows = [Triplet("a", "ref.png", "make it blue", ["hammer__blue.png"],
                    {"kind": "recolour", "attribute": "blue", "reference_caption": "hammer, a tool"}),
            Triplet("b", "ref.png", "make it blue", ["hammer__blue.png"],  # the same target again
                    {"kind": "recolour", "attribute": "blue", "reference_caption": "hammer, a tool"}),
            Triplet("c", "x.png", "as a woman", ["y.png"], {"kind": "gender", "reference_caption": "man"})]
    monkeypatch.setattr(context_i2w_data, "load_offline_cir", lambda split, hold_out=False: rows)
    pairs = load_pairs("recoloured", "train")
    assert [(p.path.name, p.caption) for p in pairs] == [("hammer__blue.png", "blue hammer, a tool")]


def test_evaluate_context_i2w_against_baselines(tiny_a, crops):
    from engine.train.context_i2w import evaluate_context_i2w, image_features

    train, _ = crops
    imgs = [str(p.path) for p in train[:21]]  # 3 photos x 7 crops
    trip = [{"reference": imgs[i], "text": "another view", "targets": [imgs[i + 1]]} for i in range(0, 20, 2)]
    res = evaluate_context_i2w(tiny_a, _mapper(tiny_a), trip, gallery=imgs, progress=False)
    assert set(res) == {"context-i2w", "image", "text", "sum", "context-i2w (local branch off)",
                        "context-i2w (image removed)"}
    assert res["context-i2w (local branch off)"] == res["context-i2w"]  # a fresh mapper's gate is 0
    # image-only recall recomputed independently: rank of the target with the reference removed
    emb, _ = image_features(tiny_a, [Path(p) for p in imgs], progress=False)
    hits = 0
    for i in range(0, 20, 2):
        s = emb @ emb[i]
        s[i] = -np.inf
        hits += int((s > s[i + 1]).sum() < 5)
    assert res["image"]["R@5"] == pytest.approx(hits / 10 * 100)
    for r in res.values():
        assert 0 <= r["R@1"] <= r["R@5"] <= r["R@10"] <= 100


# -- the authors' checkpoint ------------------------------------------------------------------------------


def _authors_state(C=24, W=32, OUT=20, MID=28, n_layer=2, depth=6, inner=512, latents=4, seed=0):
    """A state dict with IM2TEXT_OWM_Attn's key names and shapes (their defaults: depth 6, 8 heads x 64)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.2):
        return torch.randn(*shape, generator=g) * s

    sd = {"to_c.weight": r(W, C), "W_R.weight_g": r(W, 1).abs() + 0.5, "W_R.weight_v": r(W, W),
          "ln_post.weight": 1 + r(W), "ln_post.bias": r(W), "ln_post_local.weight": 1 + r(W),
          "ln_post_local.bias": r(W), "proj": r(W, OUT), "proj_local": r(W, OUT),
          "VT_Extractor.latents": r(latents, W, s=1.0), "VT_Extractor.norm.weight": 1 + r(W),
          "VT_Extractor.norm.bias": r(W), "fc_out.weight": r(OUT, MID), "fc_out.bias": r(OUT),
          "fc_out_local.weight": r(OUT, MID), "fc_out_local.bias": r(OUT), "local_gate": torch.tensor([0.7])}
    for i in range(depth):
        p = f"VT_Extractor.layers.{i}."
        sd.update({p + "0.norm_media.weight": 1 + r(W), p + "0.norm_media.bias": r(W),
                   p + "0.norm_latents.weight": 1 + r(W), p + "0.norm_latents.bias": r(W),
                   p + "0.to_q.weight": r(inner, W), p + "0.to_kv.weight": r(2 * inner, W),
                   p + "0.to_out.weight": r(W, inner, s=0.05), p + "1.0.weight": 1 + r(W), p + "1.0.bias": r(W),
                   p + "1.1.weight": r(4 * W, W), p + "1.3.weight": r(W, 4 * W, s=0.05)})
    dims = [OUT] + [MID] * n_layer
    for br in ("layers", "layers_local"):
        for i in range(n_layer):
            sd[f"{br}.{i}.0.weight"] = r(dims[i + 1], dims[i])
            sd[f"{br}.{i}.0.bias"] = r(dims[i + 1])
    return sd


def _reference_forward(sd, c, x, heads=8, dim_head=64, depth=6, n_layer=2):
    """Their IM2TEXT_OWM_Attn.forward written out with plain tensor ops, in float64."""
    sd = {k: v.double() for k, v in sd.items()}
    c, x = c.double(), x.double()

    def ln(z, p):
        mu = z.mean(-1, keepdim=True)
        var = ((z - mu) ** 2).mean(-1, keepdim=True)
        return (z - mu) / torch.sqrt(var + 1e-5) * sd[p + ".weight"] + sd[p + ".bias"]

    v = sd["W_R.weight_v"]
    w_r = sd["W_R.weight_g"] * v / torch.sqrt((v ** 2).sum(1, keepdim=True))
    x = torch.einsum("bnw,ow->bno", x, w_r) * (c @ sd["to_c.weight"].t())[:, None, :]
    lat = sd["VT_Extractor.latents"][None].repeat(x.shape[0], 1, 1)
    inner = heads * dim_head
    for i in range(depth):
        p = f"VT_Extractor.layers.{i}."
        media, latn = ln(x[:, 1:], p + "0.norm_media"), ln(lat, p + "0.norm_latents")
        q = latn @ sd[p + "0.to_q.weight"].t()
        kv = torch.cat([media, latn], 1) @ sd[p + "0.to_kv.weight"].t()
        k, vv = kv[..., :inner], kv[..., inner:]
        outs = []
        for h in range(heads):
            sl = slice(h * dim_head, (h + 1) * dim_head)
            sim = (q[..., sl] * dim_head ** -0.5) @ k[..., sl].transpose(1, 2)
            e = torch.exp(sim - sim.max(-1, keepdim=True).values)
            outs.append((e / e.sum(-1, keepdim=True)) @ vv[..., sl])
        lat = lat + torch.cat(outs, -1) @ sd[p + "0.to_out.weight"].t()
        hdn = ln(lat, p + "1.0") @ sd[p + "1.1.weight"].t()
        hdn = 0.5 * hdn * (1 + torch.erf(hdn / math.sqrt(2)))
        lat = lat + hdn @ sd[p + "1.3.weight"].t()
    local = ln(lat, "VT_Extractor.norm").mean(1)  # AvgPool2d((4, 1)) over the 4 latents

    def branch(z, norm, proj, layers, out):
        z = ln(z, norm) @ sd[proj]
        for i in range(n_layer):
            z = torch.relu(z @ sd[f"{layers}.{i}.0.weight"].t() + sd[f"{layers}.{i}.0.bias"])
        return z @ sd[out + ".weight"].t() + sd[out + ".bias"]

    glob = branch(x[:, 0], "ln_post", "proj", "layers", "fc_out")
    loc = branch(local, "ln_post_local", "proj_local", "layers_local", "fc_out_local")
    return glob + torch.tanh(sd["local_gate"]) * loc


def test_authors_checkpoint_mapping_reproduces_their_forward(tmp_path):
    sd = _authors_state()
    path = tmp_path / "epoch_30.pt"
    torch.save({"epoch": 30, "state_dict": {"module.visual.proj": torch.zeros(2, 2)},
                "state_dict_img2text": {f"module.{k}": v for k, v in sd.items()}, "optimizer": {}}, path)
    m, info = load_authors_checkpoint(path)
    cfg = m.config
    assert (cfg.vision_width, cfg.context_dim, cfg.token_dim, cfg.middle_dim) == (32, 24, 20, 28)
    assert (cfg.depth, cfg.heads, cfg.dim_head, cfg.num_latents, cfg.ff_mult, cfg.n_layer) == (6, 8, 64, 4, 4, 2)
    g = torch.Generator().manual_seed(1)
    c, x = torch.randn(3, 24, generator=g), torch.randn(3, 10, 32, generator=g)
    ref = _reference_forward(sd, c, x)
    ours = m(c, x).double()
    assert torch.allclose(ours, ref, atol=1e-4, rtol=1e-4), (ours - ref).abs().max()
    # the context's length does not matter (LayerNorms follow every path from c)
    assert torch.allclose(m(5.0 * c, x), m(c, x), atol=1e-4)
    # new-style weight-norm parametrisation names load to the same mapper
    sd2 = dict(sd)
    sd2["W_R.parametrizations.weight.original0"] = sd2.pop("W_R.weight_g")
    sd2["W_R.parametrizations.weight.original1"] = sd2.pop("W_R.weight_v")
    torch.save(sd2, tmp_path / "plain.pt")
    m2, _ = load_authors_checkpoint(tmp_path / "plain.pt")
    assert torch.allclose(m2(c, x), m(c, x), atol=1e-6)


def test_authors_checkpoint_errors_name_the_file(tmp_path, tiny_a):
    sd = _authors_state(depth=1)
    bad = dict(sd)
    bad.pop("W_R.weight_g")
    torch.save({"state_dict_img2text": bad}, tmp_path / "nogain.pt")
    with pytest.raises(CheckpointError, match="nogain.pt.*W_R"):
        load_authors_checkpoint(tmp_path / "nogain.pt")
    bad = dict(sd)
    bad["fc_out_local.weight"] = torch.zeros(20, 27)
    torch.save({"state_dict_img2text": bad}, tmp_path / "shape.pt")
    with pytest.raises(CheckpointError, match="shape.pt.*local_branch.out.weight"):
        load_authors_checkpoint(tmp_path / "shape.pt")
    bad = dict(sd, extra_thing=torch.zeros(1))
    torch.save({"state_dict_img2text": bad}, tmp_path / "extra.pt")
    with pytest.raises(CheckpointError, match="extra.pt.*unexpected"):
        load_authors_checkpoint(tmp_path / "extra.pt")
    torch.save({"state_dict_img2text": sd}, tmp_path / "ok.pt")
    with pytest.raises(CheckpointError, match="ok.pt.*ViT-L/14"):  # sizes do not fit this backbone
        load_authors_checkpoint(tmp_path / "ok.pt", backbone=tiny_a)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="junk.pt"):
        load_authors_checkpoint(tmp_path / "junk.pt")


# -- checkpoints and the composer factory -----------------------------------------------------------------


def test_checkpoint_roundtrip_fingerprint_and_factory(tmp_path, tiny_a, tiny_b):
    factory = COMPOSERS.get("context-i2w")
    with pytest.raises(ComposerUnavailable, match="no Context-I2W checkpoint"):
        factory(tiny_a, checkpoint_dir=tmp_path)
    m = _mapper(tiny_a, template="an image of * that is {text}")
    path = save_context_i2w(tmp_path / file_name("context_i2w", tiny_a.name), m, tiny_a, half=True)
    rec = json.loads(path.with_suffix(".json").read_text())
    assert rec["backbone_fingerprint"] == tiny_a.fingerprint and rec["config"]["template"].startswith("an image")
    assert rec["placeholder"] == "<|replace|>" and rec["placeholder_id"] == tiny_a.placeholder_id == 49405
    with pytest.raises(CheckpointError, match=path.name):
        load_context_i2w(path, tiny_b.fingerprint)
    with pytest.raises(ComposerUnavailable):  # only a checkpoint for another backbone is there
        factory(tiny_b, checkpoint_dir=tmp_path)
    comp = factory(tiny_a, checkpoint_dir=tmp_path)
    emb, tok = _tokens(tiny_a, 1)
    out = comp.compose(Query(text="blue", image_embedding=emb[0], image_tokens=tok[0], has_image=True))
    assert out.explanation["prompt"] == "an image of <|replace|> that is blue"
    assert out.explanation["checkpoint"] == path.name
    ctx = tiny_a.encode_texts(["* x"]).embeddings
    assert torch.allclose(comp.mapper(ctx, tok), m(ctx, tok), atol=2e-2)  # float16 storage
    (tmp_path / "context_i2w-broken.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="context_i2w-broken"):
        load_context_i2w(tmp_path / "context_i2w-broken.safetensors")
    with pytest.raises(ValueError):
        ContextI2WConfig.for_backbone(tiny_a, template="no placeholder {text}")



def test_the_shipped_checkpoint_loads_through_the_one_loader_and_saves_again_the_same(tmp_path, tiny_a):
    """The bundled checkpoint (the record format) loads through engine.checkpoints.load, anchor and router
    included; written again from its loaded record (as engine.train.anchor_fit
    does) it is in the record format, with the same tensors, anchor and figures."""
    from safetensors.torch import load_file

    from engine import checkpoints as ck
    from engine.compose.anchor import load_anchor
    from engine.config import ASSETS

    (src,) = (ASSETS / "checkpoints").glob("context_i2w-*.safetensors")
    mapper, record = load_context_i2w(src)
    assert record["format"] == ck.RECORD_FORMAT and record["part"] == "context-i2w" and record["file"] == src.name
    stored = load_file(str(src))
    assert all(torch.equal(v, stored[k].float()) for k, v in mapper.state_dict().items())
    anchor = load_anchor(src, record)
    assert anchor is not None and anchor.config.weight > 0 and anchor.text_bank is not None
    out = save_context_i2w(tmp_path / src.name, mapper, tiny_a, {**record, "anchor_fit": {"x": 1}}, half=True,
                           anchor=anchor)
    again = ck.read_record(out)
    assert again["format"] == ck.RECORD_FORMAT and again["backbone_fingerprint"] == tiny_a.fingerprint
    assert again["recipe"]["seed"] == record["training"]["train_config"]["seed"]
    assert again["validation"]["metric"] == "R@10" and again["validation"]["split"] == "val"
    assert again["anchor"] == record["anchor"] and again["anchor_fit"] == {"x": 1}
    assert again["training"]["history"] == record["training"]["history"] and again["stored_dtype"] == "float16"
    written = load_file(str(out))
    assert written.keys() == stored.keys()
    assert all(torch.equal(written[k], stored[k]) for k in stored if not k.startswith("anchor."))  # float16 again
    assert all(torch.allclose(written[k], stored[k], atol=1e-6) for k in stored)  # the anchor's banks: renormalised
    m2, r2 = load_context_i2w(out, tiny_a.fingerprint)
    assert load_anchor(out, r2).config == anchor.config
    assert all(torch.equal(v, mapper.state_dict()[k]) for k, v in m2.state_dict().items())


# -- data -------------------------------------------------------------------------------------------------


def test_spacy_subject_replacement_known_answers():
    from engine.data.subjects import load_nlp, replace_subjects

    from engine.errors import EngineError

    try:
        load_nlp()
    except EngineError as exc:  # spaCy itself is pinned: only its English model may be missing here
        if "no English spaCy pipeline is installed" not in str(exc):
            raise
        pytest.skip(f"no spaCy English model installed: {exc}")
    cases = {
        "the man in a blue shirt is riding a bike": "* in a blue shirt is riding a bike",
        "A woman holds an umbrella.": "* holds an umbrella.",
        "the car was parked by the police": "* was parked by the police",
        "two red apples on a wooden table": "* on a wooden table",
        "a dog running on the beach": "* running on the beach",
        "sunset over the mountains": "* over the mountains",
        "very quickly": None,
        "red": None,
    }
    out, stats = replace_subjects(list(cases), "*", progress=False)
    assert dict(zip(cases, out)) == cases
    assert (stats.replaced, stats.skipped, stats.parsed) == (6, 2, 8)
    out2, stats2 = replace_subjects(list(cases), "*", progress=False)  # from the on-disk cache
    assert out2 == out and stats2.parsed == 0


def test_pair_readers(tmp_path):
    from engine.train.context_i2w import load_pairs, split_pairs

    (tmp_path / "a.jpg").write_bytes(b"x")
    (tmp_path / "a.txt").write_text("a cat on a mat\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.png").write_bytes(b"x")
    (tmp_path / "sub" / "b.json").write_text(json.dumps({"caption": "a dog"}))
    (tmp_path / "sub" / "c.png").write_bytes(b"x")  # no caption: ignored
    pairs = load_pairs(str(tmp_path))
    assert [(p.path.name, p.caption) for p in pairs] == [("a.jpg", "a cat on a mat"), ("b.png", "a dog")]
    (tmp_path / "pairs.tsv").write_text("filepath\ttitle\na.jpg\ta cat\n")
    assert [(p.path, p.caption) for p in load_pairs(str(tmp_path / "pairs.tsv"))] == [(tmp_path / "a.jpg", "a cat")]
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"image": "sub/b.png", "caption": "a dog"}) + "\n")
    assert load_pairs(str(tmp_path / "pairs.jsonl"))[0].path == tmp_path / "sub" / "b.png"
    (tmp_path / "bad.csv").write_text("foo,bar\n1,2\n")
    with pytest.raises(InputError, match="bad.csv"):
        load_pairs(str(tmp_path / "bad.csv"))
    many = pairs * 50
    tr, va = split_pairs([type(p)(tmp_path / f"{i}.png", "x") for i, p in enumerate(many)], 0.2)
    assert not {p.path for p in tr} & {p.path for p in va} and 5 < len(va) < 40
