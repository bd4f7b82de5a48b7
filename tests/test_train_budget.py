"""The time limit `prepare` sets around a trainer ends training at an epoch boundary."""
import time

import numpy as np
import torch

from engine.train.budget import another_epoch_fits, train_deadline
from engine.train.lattqe import TrainConfig, split_classes, train_lattqe


def test_another_epoch_fits_only_inside_a_limit():
    assert another_epoch_fits(1e9)  # no limit set
    with train_deadline(time.perf_counter() + 60):
        assert another_epoch_fits(1.0) and not another_epoch_fits(120.0)
        with train_deadline(None):
            assert another_epoch_fits(1e9)
        assert not another_epoch_fits(120.0)
    assert another_epoch_fits(1e9)


def test_a_trainer_stops_at_the_epoch_that_reaches_the_limit():
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((20, 8))
    x = np.repeat(centres, 6, 0) + 0.5 * rng.standard_normal((120, 8))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    y = np.repeat(np.arange(20), 6)
    tr, va = split_classes(y, 0.3, seed=0)
    cfg = TrainConfig(epochs=4, queries_per_epoch=64, layers=1, heads=2, k_min=4, k_max=8, val_nqe=8,
                      val_queries=20, pool_size=50)
    _, free = train_lattqe(x[tr], y[tr], x[va], y[va], cfg, progress=False)
    with train_deadline(time.perf_counter()):  # already reached: one epoch runs, then it stops
        _, limited = train_lattqe(x[tr], y[tr], x[va], y[va], cfg, progress=False)
    assert len(free) == 4 and len(limited) == 1
