"""Evaluation: retrieval metrics, official CIR benchmarks (FashionIQ, CIRR, CIRCO) and run records.

``metrics`` is numpy only; ``official`` glues the loaders of :mod:`engine.data.cir_official` to any
embed/compose callables; ``record`` writes the JSON record of every run. See docs/evaluation.md.
"""
from .metrics import (
    average_precisions,
    circo_map,
    cirr_recall,
    cirr_subset_recall,
    fashioniq_average,
    fashioniq_recall,
    mean_average_precision,
    ranked_indices,
    recall_at_k,
    target_ranks,
    top_k_ids,
)
from .record import write_run_record

__all__ = [
    "average_precisions",
    "circo_map",
    "cirr_recall",
    "cirr_subset_recall",
    "fashioniq_average",
    "fashioniq_recall",
    "mean_average_precision",
    "ranked_indices",
    "recall_at_k",
    "target_ranks",
    "top_k_ids",
    "write_run_record",
]
