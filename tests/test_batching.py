"""The text micro-batcher (engine/batching.py): concurrent callers share forward passes and each gets the
rows of its own texts, equal to encoding them alone."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

TEXTS = ["the same but red", "as a dog", "at night", "a much bigger one with two wheels and a red roof",
         "in the snow", "with flowers", "made of wood", "a photo of a cat sleeping on a sofa"]


def _wait_for(cond, timeout=20.0):
    t = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < t, "timed out"
        time.sleep(0.005)


def _queue_behind_first(threads, first_is_encoding, batcher, gate):
    """Start the first caller and wait until its encode is running (held by ``gate``), start the others and
    wait until every one of them is queued, then release the encoder and wait for all callers."""
    threads[0].start()
    _wait_for(first_is_encoding)
    for th in threads[1:]:
        th.start()
    _wait_for(lambda: len(batcher._queue) == len(threads) - 1)
    gate.set()
    for th in threads:
        th.join(30)


def test_concurrent_texts_share_one_forward_and_match_unbatched_encodes(packaged):
    from engine.batching import TextBatcher

    calls, gate = [], threading.Event()

    def encode(texts):  # the real encoder, counted; the first call is held until the others have queued
        calls.append(list(texts))
        if len(calls) == 1:
            gate.wait(20)
        return type(packaged).encode_texts(packaged, texts)

    batcher = TextBatcher(encode, max_batch=16)
    out = {}

    def caller(i):
        out[i] = batcher([TEXTS[i]]).embeddings[0]

    first = threading.Thread(target=caller, args=(0,))
    first.start()
    _wait_for(lambda: len(calls) == 1)
    rest = [threading.Thread(target=caller, args=(i,)) for i in range(1, len(TEXTS))]
    for th in rest:
        th.start()
    _wait_for(lambda: len(batcher._queue) == len(TEXTS) - 1)
    gate.set()
    for th in [first, *rest]:
        th.join(30)
    # one forward for the first caller, one for the seven that queued meanwhile (texts of different lengths)
    assert len(calls) == 2 and batcher.forward_calls == 2
    assert calls[0] == [TEXTS[0]] and sorted(calls[1]) == sorted(TEXTS[1:])
    for i, text in enumerate(TEXTS):
        alone = type(packaged).encode_texts(packaged, [text]).embeddings[0]
        assert out[i].shape == alone.shape
        assert float((out[i] - alone).abs().max()) < 1e-5, text


def test_batches_respect_max_batch_and_a_lone_caller_waits_for_nothing():
    import torch

    from engine.backbones.base import TextEncoding
    from engine.batching import TextBatcher

    sizes, gate = [], threading.Event()

    def encode(texts):
        sizes.append(len(texts))
        if len(sizes) == 1:
            gate.wait(20)
        return TextEncoding(torch.tensor([[float(len(t))] for t in texts]), [])

    batcher = TextBatcher(encode, max_batch=3)
    gate.set()  # a lone caller: encoded at once, alone
    assert batcher(["abc"]).embeddings.tolist() == [[3.0]] and sizes == [1]
    sizes.clear()
    gate.clear()
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, batcher(["x" * i]).embeddings[0, 0].item()))
               for i in range(1, 8)]
    _queue_behind_first(threads, lambda: len(sizes) == 1, batcher, gate)
    assert sizes == [1, 3, 3] and results == {i: float(i) for i in range(1, 8)}
    # more texts than max_batch in one call (index building) go through as they are
    assert batcher(["a", "bb", "ccc", "dddd"]).embeddings[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert sizes[-1] == 4


def test_a_failing_or_truncated_text_gets_its_own_error_and_notices():
    import torch

    from engine.backbones.base import TextEncoding
    from engine.batching import TextBatcher

    gate, calls = threading.Event(), []

    def encode(texts):
        calls.append(list(texts))
        if len(calls) == 1:
            gate.wait(20)
        if "boom" in texts:
            raise ValueError("boom")
        notices = [f"{t} truncated" for t in texts if t.startswith("long")]
        return TextEncoding(torch.ones(len(texts), 2), notices)

    batcher = TextBatcher(encode)
    out = {}

    def caller(t):
        try:
            out[t] = batcher([t]).notices
        except ValueError as exc:
            out[t] = exc

    threads = [threading.Thread(target=caller, args=(t,)) for t in ("first", "boom", "long one", "short")]
    _queue_behind_first(threads, lambda: len(calls) == 1, batcher, gate)
    assert isinstance(out["boom"], ValueError)
    assert out["long one"] == ["long one truncated"] and out["short"] == [] and out["first"] == []


def test_batch_texts_routes_the_backbone_once_and_searches_are_unchanged(gallery_engine):
    from engine.batching import TextBatcher, batch_texts
    from engine.search import search

    before = search(gallery_engine, text="a red car", method="text", k=5)
    b = batch_texts(gallery_engine.backbone)
    assert isinstance(b, TextBatcher) and batch_texts(gallery_engine.backbone) is b
    calls = b.forward_calls
    after = search(gallery_engine, text="a red car", method="text", k=5)
    assert b.forward_calls == calls + 1
    assert [r.id for r in after.results] == [r.id for r in before.results]
    assert [r.score for r in after.results] == pytest.approx([r.score for r in before.results], abs=1e-5)


def test_the_engine_loader_installs_the_batcher_not_the_page(monkeypatch):
    """load_default_engine gives the backbone its TextBatcher (CIS_TEXT_BATCH texts at most; 1: none), so
    every server that loads the engine (the page, the Gradio API, POST /api/search) batches; the page's
    builder does not touch the backbone."""
    from types import SimpleNamespace

    from engine import service
    from engine.batching import TextBatcher
    from engine.config import Settings

    class Backbone:
        def encode_texts(self, texts):
            return texts

    engine = SimpleNamespace(backbone=Backbone())
    monkeypatch.setattr(service, "_open_default_engine", lambda settings, progress=None: engine)
    monkeypatch.setenv("CIS_TEXT_BATCH", "1")
    assert service.load_default_engine(Settings()) is engine and "encode_texts" not in vars(engine.backbone)
    monkeypatch.setenv("CIS_TEXT_BATCH", "8")
    service.load_default_engine(Settings())
    batcher = engine.backbone.encode_texts
    assert isinstance(batcher, TextBatcher) and batcher.max_batch == 8 and batcher(["a"]) == ["a"]
    ui = (Path(__file__).resolve().parent.parent / "demo" / "ui.py").read_text()
    assert "batch_texts" not in ui and "engine.batching" not in ui
