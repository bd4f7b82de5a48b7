"""Micro-batching of text encodes across concurrent searches.

A transformer encodes 8 short texts in one forward pass for about twice the cost of one (the packaged
backbone on CPU, one thread: 4.2x less per text at batch 8, 5.7x at batch 16; ``python -m engine bench
--only text-batch``, docs/BENCHMARKS.md, *text-batch*), while an image encoder on CPU does not gain from
batching. A server that runs several searches
at once therefore sends their texts through one :class:`TextBatcher`:

* the first caller while no encode runs encodes at once (no timer, no added latency when idle);
* callers that arrive while an encode runs wait; when it ends, the first of them encodes everything that
  queued up meanwhile (at most ``max_batch`` texts) in one forward pass and hands each caller its rows.

So batches form only when there is contention, and their size follows the load. Calls with more than
``max_batch`` texts (index building, training) bypass the queue. Each caller gets exactly the rows of its
own texts; when any text of a batch was truncated, the batch's callers are encoded again one by one so that
every caller gets its own truncation notices.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable, List, Optional, Sequence

import torch

from .backbones.base import Backbone, TextEncoding

DEFAULT_MAX_BATCH = 16


class _Job:
    __slots__ = ("texts", "result", "error", "done")

    def __init__(self, texts: List[str]):
        self.texts = texts
        self.result: Optional[TextEncoding] = None
        self.error: Optional[BaseException] = None
        self.done = False


class TextBatcher:
    """Callable like ``backbone.encode_texts``: ``batcher(texts) -> TextEncoding``, thread-safe.

    ``encode`` is the unbatched encoder. ``forward_calls`` counts calls to it and ``batch_sizes`` keeps the
    number of texts of the last 10,000 of them (what the load test and the tests read)."""

    def __init__(self, encode: Callable[[Sequence[str]], TextEncoding], max_batch: int = DEFAULT_MAX_BATCH):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.encode, self.max_batch = encode, int(max_batch)
        self._cv = threading.Condition()
        self._queue: "deque[_Job]" = deque()
        self._busy = False
        self.forward_calls = 0
        self.batch_sizes: "deque[int]" = deque(maxlen=10_000)

    def __call__(self, texts: Sequence[str]) -> TextEncoding:
        texts = list(texts)
        if not texts or len(texts) > self.max_batch:
            return self._forward(texts)
        job = _Job(texts)
        with self._cv:
            self._queue.append(job)
            while self._busy and not job.done:
                self._cv.wait()
            if job.done:  # another caller encoded it
                return self._result(job)
            # this caller leads the next batch: its own texts first, then whoever queued, up to max_batch
            self._busy = True
            self._queue.remove(job)
            batch, n = [job], len(texts)
            while self._queue and n + len(self._queue[0].texts) <= self.max_batch:
                nxt = self._queue.popleft()
                batch.append(nxt)
                n += len(nxt.texts)
        try:
            self._run(batch)
        finally:
            with self._cv:
                for j in batch:
                    j.done = True
                self._busy = False
                self._cv.notify_all()
        return self._result(job)

    @staticmethod
    def _result(job: _Job) -> TextEncoding:
        if job.error is not None:
            raise job.error
        return job.result

    def _forward(self, texts: List[str]) -> TextEncoding:
        with self._cv:
            self.forward_calls += 1
            self.batch_sizes.append(len(texts))
        return self.encode(texts)

    def _run(self, batch: List[_Job]) -> None:
        if len(batch) == 1:
            try:
                batch[0].result = self._forward(batch[0].texts)
            except BaseException as exc:  # noqa: BLE001 - handed to its caller
                batch[0].error = exc
            return
        try:
            enc = self._forward([t for j in batch for t in j.texts])
        except BaseException:  # noqa: BLE001 - a bad text must fail only its own caller
            enc = None
        if enc is None or enc.notices:  # one by one: each caller its own error or truncation notices
            for j in batch:
                try:
                    j.result = self._forward(j.texts)
                except BaseException as exc:  # noqa: BLE001
                    j.error = exc
            return
        start = 0
        for j in batch:
            rows = enc.embeddings[start:start + len(j.texts)]
            j.result = TextEncoding(rows.clone() if isinstance(rows, torch.Tensor) else rows, [])
            start += len(j.texts)


def batch_texts(backbone: Backbone, max_batch: int = DEFAULT_MAX_BATCH) -> TextBatcher:
    """Route ``backbone.encode_texts`` through a :class:`TextBatcher` (once; later calls return the same one).

    Every composer and the explanation call ``backbone.encode_texts``, so concurrent searches on any engine
    that shares this backbone batch their texts together."""
    current = backbone.__dict__.get("encode_texts")
    if isinstance(current, TextBatcher):
        return current
    batcher = TextBatcher(backbone.encode_texts, max_batch)
    backbone.encode_texts = batcher
    return batcher

