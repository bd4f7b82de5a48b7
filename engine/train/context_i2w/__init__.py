"""Train the Context-I2W mapper on image-caption pairs (``python -m engine train context-i2w``).

Pipeline:

1. pairs (image path, caption) from the offline ``captions`` set, a CSV/TSV/JSONL file of path +
   caption, or a CC3M-style folder (``xxx.jpg`` next to ``xxx.txt`` or ``xxx.json`` with ``caption``);
2. spaCy replaces each caption's subject with the placeholder (``engine.data.subjects``, cached);
   pairs without a subject are skipped and counted;
3. the frozen backbone encodes every image once: embedding (float32) and visual tokens (float16),
   cached on disk by backbone fingerprint and image content; the context embeddings (the text
   encoder's embeddings of the subject-replaced captions) are cached the same way;
4. only the mapper trains: S* = mapper(context, tokens); the prompt ``"a photo of *"`` with S* is encoded
   by the frozen text encoder and matched to the image embedding with a symmetric InfoNCE loss at the
   backbone's logit scale. AdamW, linear warm-up + cosine schedule, AMP on CUDA, a checkpoint every
   epoch (``--out``) and a resumable state (``--run-dir``, ``--resume``).

``--checkpoint FILE`` starts from the authors' released ``IM2TEXT_OWM_Attn`` checkpoint (mapped onto
our module); with ``--epochs 0`` it only converts it to our checkpoint format for the live backbone.

Evaluation helpers used by ``python -m engine eval`` / ``bench``: :func:`evaluate_pairs` (held-out
"a photo of S*" -> image retrieval), :func:`evaluate_context_i2w` (composed retrieval R@K against the

Modules: :mod:`.data` (pairs, the held-out split, cached features), :mod:`.model` (small config, training
config, loss, schedule), :mod:`.loop` (training), :mod:`.report` (evaluation), :mod:`.cli` (the command, ``main``; not imported here: it runs the prior anchor fit,
``engine.train.anchor_fit``, which imports this package).
"""
from .data import (PairFeatures, Pair, image_features, load_pairs, prepare_features, read_pair_file, read_pair_folder,
                   recoloured_pairs, split_pairs, text_embeddings)
from .loop import train_mapper
from .model import SMALL_CONFIG, TrainConfig, contrastive_loss, pseudo_prompt_embeddings
from .report import cir_queries, evaluate_cir, evaluate_context_i2w, evaluate_pairs, local_share

__all__ = ["Pair", "PairFeatures", "SMALL_CONFIG", "TrainConfig", "cir_queries", "contrastive_loss", "evaluate_cir",
           "evaluate_context_i2w", "evaluate_pairs", "image_features", "load_pairs", "local_share",
           "prepare_features", "pseudo_prompt_embeddings", "read_pair_file", "read_pair_folder", "recoloured_pairs",
           "split_pairs", "text_embeddings", "train_mapper"]
