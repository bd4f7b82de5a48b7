"""Training and evaluation of the RTIC composer (``python -m engine train rtic``).

Trains on precomputed (reference, text, target) embeddings of a frozen backbone
(:class:`engine.data.cir_triplets.TripletSet`).

* main-stream loss: DML loss -- softmax cross-entropy of the normalised composed vector against every
  target of the batch (K = B) with a learnable temperature; rows that share the target image or the
  query are masked out of each other's negatives. Option: batch-hard triplet loss.
* ``--gcn``: stage 1 trains plain RTIC; stage 2 builds the sparse correlation graph
  (:mod:`engine.train.gcn_graph`) and trains a freshly initialised RTIC (``--gcn-init stage1`` to start
  from stage 1 instead) together with the GCN stream; total loss = pair_weight * pair loss +
  gcn_weight * BCE. The GCN stream is dropped afterwards: the checkpoint holds only the main stream.
* optimiser: AdamW (default) or SGD (momentum 0.9) with a step decay x gamma every ``step_every``
  epochs (the paper's unified setting: SGD, lr 0.01, gamma 1/sqrt(2), every 10 epochs).
* ``--tone-edits`` (``--data cir``): the training split's photos also become tone-edit triplets
  (:func:`engine.data.tone.tone_triplets`: photo + "at night" / "in black and white" -> its own edited
  version), because the offline CIR set has colour edits but no light or tone edits. With ``--data cir`` the
  held-out report also ranks the held-out split's photos' tone edits among every version of those photos
  (``held_out_tone``), trained with them or not.
* a run folder (``runs/rtic/<name>`` by default) keeps ``state-<stage>.pt`` after every epoch for ``--resume``
  and ``history.json``; the final model goes to ``<out>/rtic[-gcn]-<backbone>.safetensors``.

:func:`evaluate_rtic` gives R@1/R@10/R@50 of RTIC models and the training-free baselines (image,
text, sum) on a held-out split.

Modules: :mod:`.data` (synthetic triplets, splits, the data sets of the command), :mod:`.model` (recipe,
losses, optimiser), :mod:`.loop` (training, both stages), :mod:`.report` (held-out recalls), :mod:`.cli` (the
command; checkpoints through :func:`engine.compose.rtic.save_rtic`).
"""
from .cli import main
from .data import load_triplets, split_by_reference_group, synthetic_triplets, tone_set
from .loop import fit, grouped_permutation, train_rtic
from .model import (TrainConfig, batch_hard_triplet_loss, compose_all, dml_loss, make_optimizer, negatives_mask,
                    pair_loss)
from .report import evaluate_by_kind, evaluate_rtic, held_out

__all__ = ["TrainConfig", "batch_hard_triplet_loss", "compose_all", "dml_loss", "evaluate_by_kind", "evaluate_rtic",
           "fit", "grouped_permutation", "held_out", "load_triplets", "main", "make_optimizer", "negatives_mask", "pair_loss",
           "split_by_reference_group", "synthetic_triplets", "tone_set", "train_rtic"]
