"""The prior anchor of the learned composers (engine.compose.anchor) and its fit (engine.train.anchor_fit)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.compose import Query
from engine.compose.anchor import Anchor, AnchorConfig, familiarity, kmeans_prototypes, load_anchor, prior, ramp
from engine.compose.baselines import WeightedSum
from engine.compose.rtic import RTIC, RTICComposer, RTICConfig, load_rtic, save_rtic
from engine.train.anchor_fit import FitSet, fit, kind_scores


def _unit(*rows):
    return F.normalize(torch.tensor(rows, dtype=torch.float32), dim=-1)


def test_ramp_and_familiarity_follow_their_formulas():
    f = torch.tensor([0.1, 0.5, 0.6, 0.9])
    assert torch.allclose(ramp(f, 0.4, 0.8), torch.tensor([0.0, 0.25, 0.5, 1.0]))
    assert torch.equal(ramp(f, 0.7, 0.7), torch.tensor([0.0, 0.0, 0.0, 1.0]))  # a step at hi
    assert torch.equal(ramp(f, -1.0, -1.0), torch.ones(4))  # switched off
    bank = _unit([1, 0, 0], [0, 1, 0])
    x = _unit([1, 1, 0], [0, 0, 1], [3, 0, 4])
    assert torch.allclose(familiarity(x, bank), torch.tensor([2 ** -0.5, 0.0, 0.6]), atol=1e-6)


def test_blend_is_the_prior_at_zero_trust_and_the_learned_vector_at_full_trust():
    img, txt = _unit([1, 0, 0, 0]), _unit([0, 1, 0, 0])
    learned = _unit([0, 0, 1, 0])
    a = Anchor(AnchorConfig(weight=1.0, alpha=0.5))
    p = prior(img, txt, 0.5)
    assert torch.allclose(p, _unit([1, 1, 0, 0]))
    assert torch.allclose(a.blend(img, txt, learned, torch.tensor([0.0])), p)
    assert torch.allclose(a.blend(img, txt, learned, torch.tensor([1.0])), learned)
    half = a.blend(img, txt, learned, torch.tensor([0.5]))
    assert torch.allclose(half, F.normalize(0.5 * p + 0.5 * learned, dim=-1))


def test_trust_falls_for_a_text_unlike_the_training_texts():
    bank = _unit([1, 0, 0, 0])
    cfg = AnchorConfig(weight=0.8, text_lo=0.5, text_hi=0.9)
    a = Anchor(cfg, text_bank=bank)
    img = _unit([0, 0, 0, 1], [0, 0, 0, 1])
    txt = _unit([1, 0.1, 0, 0], [0, 1, 0, 0])  # nearly a training text / unlike any
    tau = a.trust(img, txt)
    assert tau[0] == pytest.approx(0.8) and tau[1] == 0.0


def test_kmeans_prototypes_find_two_clear_clusters():
    g = torch.Generator().manual_seed(0)
    a = F.normalize(torch.tensor([1.0, 0, 0]) + 0.05 * torch.randn(20, 3, generator=g), dim=-1)
    b = F.normalize(torch.tensor([0, 1.0, 0]) + 0.05 * torch.randn(20, 3, generator=g), dim=-1)
    c = kmeans_prototypes(torch.cat([a, b]), k=2)
    assert sorted(int(i) for i in c.argmax(dim=1)) == [0, 1]


def _set(name, img, txt, learned, gallery, targets, kinds):
    b, n = len(img), len(gallery)
    cand = torch.ones(b, n, dtype=torch.bool)
    tgt = torch.zeros(b, n, dtype=torch.bool)
    for i, t in enumerate(targets):
        tgt[i, t] = True
    return FitSet(name, img, txt, learned, gallery, cand, tgt, np.array(kinds))


def test_fit_trusts_the_learned_composer_in_its_domain_and_falls_back_to_the_prior_outside():
    """In domain the learned vectors hit their targets and the prior misses; out of domain (texts unlike the
    bank) the learned vectors point away and the prior finds the target. The fit must keep both."""
    torch.manual_seed(0)
    d, n = 16, 40
    gallery = F.normalize(torch.randn(n, d), dim=-1)
    bank = F.normalize(torch.randn(4, d), dim=-1)
    # in domain: texts are bank texts; learned = the target; prior points elsewhere
    img_in = F.normalize(torch.randn(30, d), dim=-1)
    txt_in = bank[torch.arange(30) % 4]
    tgt_in = torch.arange(30) % n
    learned_in = gallery[tgt_in]
    # out of domain: texts orthogonal-ish to the bank; the prior is the target, learned is a wrong item
    txt_out = F.normalize(torch.randn(30, d) - 3 * bank.mean(0), dim=-1)
    img_out = F.normalize(torch.randn(30, d), dim=-1)
    p_out = prior(img_out, txt_out, 0.5)
    gallery_out = torch.cat([p_out, F.normalize(torch.randn(10, d), dim=-1)])
    learned_out = gallery_out[30 + torch.arange(30) % 10]
    anchor = Anchor(AnchorConfig(weight=0.0), text_bank=bank)
    suite = _set("suite val", img_out, txt_out, learned_out, gallery_out, [[i] for i in range(30)], ["a"] * 30)
    domain = _set("cir val", img_in, txt_in, learned_in, gallery, [[int(t)] for t in tgt_in], ["x"] * 30)
    cfg, report = fit(anchor, suite, domain)
    assert report["prior"]["suite_val_kinds"]["a"] == 100.0            # the prior finds every suite target
    assert report["unanchored"]["suite_val_kinds"]["a"] < 50           # the learned composer alone does not
    assert report["chosen"]["suite_val_kinds"]["a"] >= 99.0            # never below the prior
    assert report["chosen"]["in_domain_r10"] == 100.0 > report["prior"]["in_domain_r10"]
    assert cfg.weight > 0 and cfg.text_hi > -1


def test_fit_keeps_the_prior_when_the_learned_composer_is_worse_everywhere():
    torch.manual_seed(1)
    d = 8
    gallery = F.normalize(torch.randn(20, d), dim=-1)
    img, txt = F.normalize(torch.randn(20, d), dim=-1), F.normalize(torch.randn(20, d), dim=-1)
    p = prior(img, txt, 0.5)
    gallery = torch.cat([p, gallery])
    learned = -p
    s = _set("suite val", img, txt, learned, gallery, [[i] for i in range(20)], ["a"] * 20)
    dset = _set("cir val", img, txt, learned, gallery, [[i] for i in range(20)], ["x"] * 20)
    cfg, report = fit(Anchor(AnchorConfig(weight=0.0)), s, dset)
    assert cfg.weight == 0.0 and report["chosen"] == report["prior"]
    assert kind_scores(np.array([1, 2, 11]), np.array(["a", "a", "b"])) == {"a": 75.0, "b": 0.0}


def test_rtic_composer_with_an_anchor_round_trips_and_answers_a_text_alone(tmp_path, tiny):
    d = tiny.embed_dim
    torch.manual_seed(0)
    model = RTIC(RTICConfig(dim=d, n_blocks=1)).eval()
    bank = F.normalize(torch.randn(5, d), dim=-1)
    anchor = Anchor(AnchorConfig(weight=0.7, text_lo=0.2, text_hi=0.6), text_bank=bank,
                    image_bank=F.normalize(torch.randn(3, d), dim=-1))
    path = save_rtic(tmp_path / "rtic-x.safetensors", model, tiny.fingerprint, tiny.name, anchor=anchor)
    loaded, record = load_rtic(path, tiny.fingerprint)          # the anchor's tensors are not the model's
    back = load_anchor(path, record)
    assert back.config == anchor.config and torch.allclose(back.text_bank, anchor.text_bank)
    comp = RTICComposer(tiny, loaded, record, anchor=back)
    img = F.normalize(torch.randn(d), dim=0)
    text_only = comp.compose(Query(text="a red car"))
    expected = WeightedSum(tiny).compose(Query(text="a red car"))
    assert np.allclose(text_only.vector, expected.vector) and text_only.explanation["trust"] == 0.0
    both = comp.compose(Query(text="a red car", image_embedding=img, has_image=True))
    enc = tiny.encode_texts(["a red car"]).embeddings[0].float().reshape(1, -1)
    tau = back.trust(img.reshape(1, -1), enc)
    with torch.no_grad():
        want = back.blend(img.reshape(1, -1), enc, loaded(img.reshape(1, -1), enc), tau)[0].numpy()
    assert np.allclose(both.vector, want, atol=1e-5)
    assert both.explanation["trust"] == pytest.approx(float(tau[0]), abs=1e-4)
    # a checkpoint written before anchoring existed still loads, without an anchor
    old = save_rtic(tmp_path / "rtic-old.safetensors", model, tiny.fingerprint, tiny.name)
    _, rec = load_rtic(old, tiny.fingerprint)
    assert load_anchor(old, rec) is None


def test_the_page_says_how_much_of_the_learned_correction_a_query_used():
    from demo.formatting import anchor_lines

    assert anchor_lines({}) == []                                   # a training-free method: nothing to say
    line = anchor_lines({"trust": 0.0, "text_familiarity": 0.41, "image_familiarity": 0.7})[0]
    assert "0%" in line and "this is the weighted sum" in line and "0.41" in line
    assert "50%" in anchor_lines({"trust": 0.5, "text_familiarity": 1.0, "image_familiarity": 0.9})[0]
    assert "Weighted sum used" in anchor_lines({"prior_only": "no image", "trust": 0.0})[0]


def test_operation_vocabulary_masks_content_words_and_keeps_the_operation():
    from engine.compose.anchor import MASK, mask_content, operation_vocabulary

    texts = ["make it red", "make it cyan", "make it blue", "a photo of a cat", "a photo of a tree", "at night",
             "the same scene at night"]
    vocab = operation_vocabulary(texts)
    assert {"make", "it", "photo", "of", "a", "at", "night"} <= set(vocab)
    assert not {"red", "cyan", "cat", "tree", "scene"} & set(vocab)   # named once: content words
    v = frozenset(vocab)
    assert mask_content("Make it TEAL!", v) == f"make it {MASK}"       # a known operation, a new word
    assert mask_content("a photo of a snow leopard", v) == f"a photo of a {MASK}"  # a run of new words: one mask
    assert mask_content("completely different words", v) == MASK


def test_operation_familiarity_trusts_a_known_operation_with_a_new_word(tmp_path, tiny):
    """With op on, "make it teal" (never trained) is as familiar as "make it cyan" (trained), while a new
    operation stays unfamiliar; the vocabulary and the operation bank travel in the checkpoint."""
    from engine.compose.anchor import mask_content, operation_text, operation_vocabulary
    from engine.train.anchor_fit import build_banks

    texts = ["make it red", "make it cyan", "make it blue", "a photo of a cat", "a photo of a dog"]
    img = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 30, 30)).save(img)
    anchor = build_banks(tiny, texts, [str(img)], k=1)
    assert anchor.vocab == frozenset(operation_vocabulary(texts)) and anchor.op_bank.shape[0] == 2
    anchor.config = AnchorConfig(weight=1.0, text_lo=0.98, text_hi=0.99, op=1.0)
    enc = lambda ts: tiny.encode_texts(ts).embeddings.float()  # noqa: E731
    queries = ["make it teal", "make it cyan", "turn the sky stormy"]
    ops = operation_text(anchor, tiny, queries)
    assert torch.allclose(ops, enc([mask_content(q, anchor.vocab) for q in queries]))
    image = F.normalize(torch.randn(3, tiny.embed_dim), dim=-1)
    tau = anchor.trust(image, enc(queries), ops)
    assert tau[0] == pytest.approx(1.0) and tau[1] == pytest.approx(1.0) and tau[2] < 1.0
    # with op off the raw text decides: "make it teal" is not a bank text
    anchor.config = AnchorConfig(weight=1.0, text_lo=0.999, text_hi=0.9999, op=0.0)
    assert anchor.trust(image, enc(queries), ops)[0] < 1.0
    # the vocabulary and the operation bank are stored with the composer
    anchor.config = AnchorConfig(weight=1.0, text_lo=0.98, text_hi=0.99, op=1.0)
    model = RTIC(RTICConfig(dim=tiny.embed_dim, n_blocks=1)).eval()
    path = save_rtic(tmp_path / "rtic-op.safetensors", model, tiny.fingerprint, tiny.name, anchor=anchor)
    _, record = load_rtic(path, tiny.fingerprint)
    back = load_anchor(path, record)
    assert back.uses_operations and back.vocab == anchor.vocab and torch.allclose(back.op_bank, anchor.op_bank)
    comp = RTICComposer(tiny, model, record, anchor=back)
    out = comp.compose(Query(text="make it teal", image_embedding=image[0], has_image=True))
    assert out.explanation["trust"] == pytest.approx(1.0) and "operation" in out.explanation["familiarity_of"]


def test_fit_turns_operation_familiarity_on_when_new_words_of_known_operations_help():
    """The suite has new words of a known operation (kind a: the learned vectors hit the targets) and a new
    operation (kind b: the learned vectors miss, the prior hits). Raw texts are unlike the bank for both, so only
    the operation familiarity tells them apart: the fit must turn it on and keep both kinds."""
    torch.manual_seed(0)
    d = 16
    bank = F.normalize(torch.randn(4, d), dim=-1)
    op_bank = F.normalize(torch.randn(1, d), dim=-1)
    img = F.normalize(torch.randn(60, d), dim=-1)
    txt = F.normalize(torch.randn(60, d), dim=-1)                  # unlike the bank
    p = prior(img, txt, 0.5)
    wrong = F.normalize(torch.randn(60, d), dim=-1)
    gallery = torch.cat([p, wrong, F.normalize(torch.randn(60, d), dim=-1)])
    learned = torch.cat([gallery[120:150], wrong[30:]])            # a: its own targets; b: decoys
    targets = [[120 + i] for i in range(30)] + [[30 + i] for i in range(30)]
    suite = _set("suite val", img, txt, learned, gallery, targets, ["a"] * 30 + ["b"] * 30)
    new_op = F.normalize(torch.randn(1, d) - 3 * op_bank, dim=-1)
    suite.op_text = torch.cat([op_bank.expand(30, d), new_op.expand(30, d)])
    dom = _set("cir val", img[:30], bank[torch.arange(30) % 4], gallery[120:150], gallery,
               [[120 + i] for i in range(30)], ["x"] * 30)
    dom.op_text = op_bank.expand(30, d).clone()
    anchor = Anchor(AnchorConfig(weight=0.0), text_bank=bank, op_bank=op_bank, vocab=["make", "it"])
    cfg, report = fit(anchor, suite, dom)
    assert report["prior"]["suite_val_kinds"]["a"] < 50 and report["prior"]["suite_val_kinds"]["b"] == 100.0
    assert cfg.op == 1.0 and cfg.weight >= 0.5
    assert report["chosen"]["suite_val_kinds"] == {"a": 100.0, "b": 100.0}


def test_router_texts_cover_the_operations_and_are_the_same_every_time():
    from engine.train.router import operation_texts

    texts = operation_texts(per_class=60)
    classes = {c for _, c in texts}
    assert {"colour", "category", "light:night", "light:bw", "undo", "compose-object"} <= classes
    assert texts == operation_texts(per_class=60)  # seeded: a refit reads the same texts
    assert max(sum(c == k for _, c in texts) for k in classes) <= 60


def test_fit_routes_trust_by_operation_when_only_the_operation_tells_where_the_learned_part_helps():
    """Two operations on the suite: A (the learned vectors hit), B (they miss, the prior hits); their texts
    differ only in the coordinate the router reads. The routed fit gives A full trust and B none."""
    from engine.compose.router import Router
    from engine.train.anchor_fit import fit

    torch.manual_seed(3)
    d = 16
    img = F.normalize(torch.randn(60, d), dim=-1)
    base = F.normalize(torch.randn(60, d), dim=-1) * 0.3
    txt = base.clone()
    txt[:30, 0] += 1.0   # operation A
    txt[30:, 1] += 1.0   # operation B
    txt = F.normalize(txt, dim=-1)
    p = prior(img, txt, 0.5)
    wrong = F.normalize(torch.randn(60, d), dim=-1)
    gallery = torch.cat([p, wrong, F.normalize(torch.randn(60, d), dim=-1)])
    learned = torch.cat([gallery[120:150], wrong[30:]])
    targets = [[120 + i] for i in range(30)] + [[30 + i] for i in range(30)]
    suite = _set("suite val", img, txt, learned, gallery, targets, ["a"] * 30 + ["b"] * 30)
    dom = _set("cir val", img[:30], txt[:30], gallery[120:150], gallery, [[120 + i] for i in range(30)], ["x"] * 30)
    w = torch.zeros(2, d)
    w[0, 0], w[1, 1] = 20.0, 20.0
    router = Router(w, torch.zeros(2), ["op-a", "op-b"])
    anchor = Anchor(AnchorConfig(weight=0.0), router=router)  # no text bank: familiarity cannot tell A from B
    cfg, report = fit(anchor, suite, dom)
    assert cfg.route == 1.0 and report["routes"]["chosen"]
    assert report["routes"]["trust"]["op-a"] >= 0.75 and report["routes"]["trust"]["op-b"] == 0.0
    assert report["chosen"]["suite_val_kinds"]["a"] == 100.0 and report["chosen"]["suite_val_kinds"]["b"] == 100.0
    anchor.config = cfg
    tau = anchor.trust(img, txt)
    assert float(tau[:30].min()) >= 0.7 and float(tau[30:].max()) < 0.05


def test_a_routed_anchor_round_trips_in_the_checkpoint_and_explains_the_operation(tmp_path, tiny):
    from engine.compose.router import Router

    d = tiny.embed_dim
    torch.manual_seed(0)
    router = Router(torch.randn(3, d), torch.zeros(3), ["colour", "category", "light:night"],
                    torch.tensor([1.0, 0.25, 0.0]))
    anchor = Anchor(AnchorConfig(weight=1.0, route=1.0), router=router)
    model = RTIC(RTICConfig(dim=d, n_blocks=1)).eval()
    path = save_rtic(tmp_path / "rtic-r.safetensors", model, tiny.fingerprint, tiny.name, anchor=anchor)
    _, record = load_rtic(path, tiny.fingerprint)
    back = load_anchor(path, record)
    assert back.routed and back.router.classes == router.classes
    assert torch.allclose(back.router.trust, router.trust) and torch.allclose(back.router.weight, router.weight)
    comp = RTICComposer(tiny, model, record, anchor=back)
    img = F.normalize(torch.randn(d), dim=0)
    out = comp.compose(Query(text="make it red", image_embedding=img, has_image=True))
    t = tiny.encode_texts(["make it red"]).embeddings.float()
    assert out.explanation["trust"] == pytest.approx(float(router.share(t)[0]), abs=1e-4)
    assert out.explanation["operation"]["name"] in router.classes


def test_fit_routes_the_priors_text_weight_so_each_operation_gets_its_best_training_free_method():
    """Operation A's target is what its text alone says (a new object: text only is best), operation B's is the
    reference and the text together (the sum at 0.5 is best); the learned vectors miss both. A single prior
    alpha cannot be best on both; the routed fit gives A the text weight 1 and B 0.5, trusts the learned part on
    neither, and ends with no kind below its best training-free method."""
    from engine.compose.router import Router
    from engine.train.anchor_fit import fit

    torch.manual_seed(5)
    d = 32
    img = F.normalize(torch.randn(60, d), dim=-1)
    txt = F.normalize(torch.randn(60, d), dim=-1) * 0.3
    txt[:30, 0] += 1.0   # operation A
    txt[30:, 1] += 1.0   # operation B
    txt = F.normalize(txt, dim=-1)
    text_targets = txt[:30]                        # A: the text itself
    sum_targets = prior(img[30:], txt[30:], 0.5)   # B: the weighted sum at 0.5
    distract = F.normalize(torch.randn(60, d), dim=-1)
    gallery = torch.cat([text_targets, sum_targets, distract])
    learned = distract[torch.arange(60) % 60]
    targets = [[i] for i in range(60)]
    suite = _set("suite val", img, txt, learned, gallery, targets, ["a"] * 30 + ["b"] * 30)
    dom = _set("cir val", img, txt, learned, gallery, targets, ["x"] * 60)
    w = torch.zeros(2, d)
    w[0, 0], w[1, 1] = 20.0, 20.0
    anchor = Anchor(AnchorConfig(weight=0.0), router=Router(w, torch.zeros(2), ["op-a", "op-b"]))
    cfg, report = fit(anchor, suite, dom)
    best = report["best_training_free"]
    assert cfg.route == 1.0 and report["routes"]["chosen"]
    assert report["prior"]["suite_val_kinds"]["a"] < best["a"] - 10   # one alpha (0.5) misses A's targets
    assert report["routes"]["prior_text_weight"]["op-a"] >= 0.7       # A leans on its words
    assert report["routes"]["prior_text_weight"]["op-b"] == pytest.approx(0.5)
    assert report["shortfall_below_training_free"] == 0.0
    for kind in ("a", "b"):
        assert report["chosen"]["suite_val_kinds"][kind] >= best[kind] - 1.0
    # the prior the composer applies is the formula's, with each query's own text weight sum_k p_k a_k
    anchor.config = cfg
    a = anchor.router.probabilities(txt) @ anchor.router.alpha
    assert torch.allclose(anchor.text_weight(txt), a)
    zero = torch.zeros(60)
    assert torch.allclose(anchor.blend(img, txt, learned, tau=zero),
                          F.normalize((1 - a)[:, None] * img + a[:, None] * txt, dim=-1), atol=1e-5)


def test_a_routed_text_weight_round_trips_in_the_checkpoint_and_is_explained(tmp_path, tiny):
    from engine.compose.router import Router

    d = tiny.embed_dim
    torch.manual_seed(1)
    router = Router(torch.randn(2, d), torch.zeros(2), ["colour", "category"], torch.tensor([0.5, 0.0]),
                    torch.tensor([0.5, 1.0]))
    anchor = Anchor(AnchorConfig(weight=1.0, route=1.0), router=router)
    model = RTIC(RTICConfig(dim=d, n_blocks=1)).eval()
    path = save_rtic(tmp_path / "rtic-a.safetensors", model, tiny.fingerprint, tiny.name, anchor=anchor)
    _, record = load_rtic(path, tiny.fingerprint)
    back = load_anchor(path, record)
    assert torch.allclose(back.router.alpha, router.alpha)
    comp = RTICComposer(tiny, model, record, anchor=back)
    img = F.normalize(torch.randn(d), dim=0)
    out = comp.compose(Query(text="a cat instead", image_embedding=img, has_image=True))
    t = tiny.encode_texts(["a cat instead"]).embeddings.float()
    assert out.explanation["prior_text_weight"] == pytest.approx(float(router.text_weight(t)[0]), abs=1e-3)
    with pytest.raises(ValueError):
        Router(torch.randn(2, d), torch.zeros(2), ["a", "b"], None, torch.tensor([float("nan"), 1.0]))


def test_a_new_router_without_kept_banks_is_refused_in_one_sentence(capsys):
    """Without --keep-banks the router is always trained again, so --new-router alone says nothing new: refused
    before any backbone is built."""
    from engine.train.anchor_fit import main

    with pytest.raises(SystemExit) as exc:
        main(["--composer", "rtic", "--new-router"])
    assert exc.value.code == 2
    assert "--new-router goes with --keep-banks" in capsys.readouterr().err


def test_the_channel_aware_prior_weighs_the_visual_block_apart_and_is_the_plain_sum_at_one_minus_alpha():
    """Dimensions from ``split`` on are a visual block texts leave at zero: the plain sum scales it by 1 - alpha,
    the channel-aware prior by its own weight, so a text-heavy query can still keep the reference's look."""
    torch.manual_seed(0)
    img = F.normalize(torch.randn(3, 8), dim=-1)
    txt = F.normalize(torch.cat([torch.randn(3, 5), torch.zeros(3, 3)], dim=-1), dim=-1)
    for a in (0.3, 0.9):
        assert torch.allclose(prior(img, txt, a, 1 - a, split=5), prior(img, txt, a), atol=1e-6)
    q = prior(img, txt, 0.9, 1.0, split=5)
    raw = torch.cat([0.1 * img[:, :5] + 0.9 * txt[:, :5], img[:, 5:]], dim=-1)
    assert torch.allclose(q, F.normalize(raw, dim=-1), atol=1e-6)
    # the look keeps a larger share than in the plain sum at the same text weight
    assert bool((q[:, 5:].norm(dim=-1) > prior(img, txt, 0.9)[:, 5:].norm(dim=-1)).all())
    per_query = prior(img, txt, torch.tensor([0.9, 0.9, 0.9]), torch.tensor([1.0, 0.1, 1.0]), split=5)
    assert torch.allclose(per_query[0], q[0], atol=1e-6) and torch.allclose(per_query[1], prior(img, txt, 0.9, 0.1, 5)[1])
    assert torch.allclose(prior(img, txt, 0.9, 1.0, split=0), prior(img, txt, 0.9))  # no visual block: plain


def test_a_routed_anchor_keeps_its_visual_weights_through_the_checkpoint_and_uses_them(tmp_path, tiny):
    from engine.compose.router import Router

    d = tiny.embed_dim
    torch.manual_seed(0)
    router = Router(torch.randn(2, d), torch.zeros(2), ["colour", "light:night"], torch.tensor([0.0, 0.5]),
                    torch.tensor([0.7, 0.9]), torch.tensor([0.3, 1.0]))
    anchor = Anchor(AnchorConfig(weight=1.0, route=1.0, visual_from=float(d // 2)), router=router)
    model = RTIC(RTICConfig(dim=d, n_blocks=1)).eval()
    path = save_rtic(tmp_path / "rtic-v.safetensors", model, tiny.fingerprint, tiny.name, anchor=anchor)
    _, record = load_rtic(path, tiny.fingerprint)
    assert record["anchor"]["visual_from"] == d // 2
    back = load_anchor(path, record)
    assert torch.allclose(back.router.visual, router.visual)
    img = F.normalize(torch.randn(4, d), dim=-1)
    txt = F.normalize(torch.randn(4, d), dim=-1)
    want = prior(img, txt, router.text_weight(txt), router.visual_weight(txt), d // 2)
    assert torch.allclose(back.prior(img, txt), want, atol=1e-6)
    assert not torch.allclose(want, prior(img, txt, router.text_weight(txt)), atol=1e-3)
    learned = F.normalize(torch.randn(4, d), dim=-1)
    _, expl = back.explain_blend(img[:1], txt[:1], learned[:1])
    assert expl["prior_visual_weight"] == pytest.approx(float(router.visual_weight(txt[:1])[0]), abs=1e-3)
