"""Train LAttQE (``python -m engine train lattqe``), evaluate every expander, benchmark them.

Training follows the issue / paper recipe on labelled gallery embeddings:

* classes are split so that validation classes never occur in training;
* each training query is expanded by the model from its top-k neighbours in the training set,
  k drawn from U{32..64} per batch and each neighbour dropped with a probability p ~ U(0, 0.6)
  drawn per query (kept neighbours stay in rank order);
* loss: contrastive ``y z^2 + (1-y) max(0, m - z)^2`` with ``z = ||q^ - d||``, margin 0.1, one
  positive (random same-class item) and 5 hard negatives per positive (the other-class items
  of a random pool, refreshed every epoch, closest to the current expanded query); plus a pairwise
  ranking term (64 same-class items against the 50 closest other-class pool items, softplus of the
  similarity gaps) and the Brier score of the neighbour weights against relevance (the auxiliary BCE
  of the relevance head is off by default; ``--weight-loss 0 --rank-loss 0 --bce-weight 1`` is the
  earlier recipe);
* Adam (lr 1e-4, weight decay 1e-6), exponential decay 0.99 per epoch, batch 64; the epoch
  with the best validation mAP (LAttQE at nQE = 64 on the held-out classes) is kept.

:func:`evaluate_expanders` measures mAP on held-out classes for no QE, AQE, AQEwD, alpha-QE,
LAttQE and the DBA variants as a function of nQE; :func:`bench_expanders` gives the added latency
per query and the batched throughput of each expander.

``--composed`` trains the text-conditioned variant on composed queries of the offline CIR set instead
(:mod:`.composed`: the modification text is a token; epoch and floor chosen on the CIR validation split).

Modules: :mod:`.data` (splits, features), :mod:`.model` (recipe, losses, sampler), :mod:`.loop` (training,
epoch and weight-floor choice), :mod:`.report` (the training history plot), :mod:`.cli` (the command). The expander evaluation (mAP vs nQE,
plots, tables, cost) is ``engine.eval.expanders`` (with the labelled set's features), below this package; the names are re-exported here.
"""
from ...eval.expanders import (DBA_NAMES, NQE_LIST, QE_METHODS, average_precisions, bench_expanders, encode_labels,
                               evaluate_expanders, format_table, labelled_features, plot_curves, qe_map)
from .cli import main
from .composed import ComposedConfig, choose_composed_floor, composed_eval, train_composed
from .data import fashion_mnist_pca, load_features, split_classes
from .loop import FLOOR_GRID, choose_floor, cir_guard, fixed_loss, train_lattqe, validation_queries
from .model import TrainConfig, contrastive_loss, ranking_loss, weight_loss
from .report import plot_history

__all__ = ["ComposedConfig", "DBA_NAMES", "FLOOR_GRID", "choose_composed_floor", "composed_eval", "train_composed", "NQE_LIST", "QE_METHODS", "TrainConfig", "average_precisions",
           "bench_expanders", "choose_floor", "cir_guard", "contrastive_loss", "encode_labels", "evaluate_expanders",
           "fashion_mnist_pca", "fixed_loss", "format_table", "labelled_features", "load_features", "main",
           "plot_curves", "plot_history", "qe_map", "ranking_loss", "split_classes", "train_lattqe",
           "validation_queries", "weight_loss"]
