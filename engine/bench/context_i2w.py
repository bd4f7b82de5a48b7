"""Bench section ``context-i2w``: extra CPU latency per query of Context-I2W over text-only."""
from __future__ import annotations

import time
from typing import Dict, Optional, Tuple

import torch

from ..backbones.factory import create_backbone
from ..backbones.openclip import OpenClipBackbone
from ..checkpoints import find
from ..compose.base import COMPOSERS, Query
from ..compose.context_i2w import (
    ContextI2WComposer,
    ContextI2WConfig,
    ContextI2WMapper,
    count_parameters,
    load_context_i2w,
)
from ..train.context_i2w import SMALL_CONFIG
from .base import SECTIONS


def bench_context_i2w(backbone, mapper: Optional[ContextI2WMapper] = None, n: int = 20,
                      text: str = "with a red hat") -> Dict[str, float]:
    """Latency per query on the backbone's device, image pass excluded (it is shared with the cache):
    Context-I2W compose vs text-only compose; ``extra_ms`` is the difference."""
    if mapper is None:
        torch.manual_seed(0)
        mapper = ContextI2WMapper(ContextI2WConfig.for_backbone(backbone))  # cost does not depend on weights
    size = getattr(backbone, "size", None) or backbone.model.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    emb, tok = backbone.encode_images_with_tokens(torch.randn(1, 3, int(size), int(size)))
    query = Query(text=text, image_embedding=emb[0], image_tokens=tok[0], has_image=True)
    ci2w, txt = ContextI2WComposer(backbone, mapper), COMPOSERS.get("text")(backbone)

    def timed(comp) -> float:
        for _ in range(2):
            comp.compose(query)
        t0 = time.perf_counter()
        for _ in range(n):
            comp.compose(query)
        return (time.perf_counter() - t0) / n * 1000.0

    c_ms, t_ms = timed(ci2w), timed(txt)
    return {"backbone": backbone.name, "context_i2w_ms": round(c_ms, 2), "text_only_ms": round(t_ms, 2),
            "extra_ms": round(c_ms - t_ms, 2), "mapper_parameters": count_parameters(mapper),
            "threads": torch.get_num_threads()}


@SECTIONS.register("context-i2w")
def section_context_i2w(args=None, ctx=None, n: int = 20) -> Tuple[str, dict]:
    """``python -m engine bench`` section: extra CPU latency per query of Context-I2W over text-only.

    Backbones: open_clip ViT-B-32 with random weights (paper-size mapper: the cost does not depend on the
    weights) and the packaged offline backbone with its shipped checkpoint (else the ``--small`` mapper).
    Returns (markdown, figures).
    """
    n = int(getattr(args, "queries", n) or n)
    rows = []
    vit = OpenClipBackbone("ViT-B-32", pretrained=None, device="cpu")
    rows.append({"setting": "ViT-B-32 (random weights), paper-size mapper", **bench_context_i2w(vit, n=n)})
    try:
        pk = create_backbone("packaged", "cpu")
    except Exception as exc:  # the packaged weights are optional
        pk = None
        rows.append({"setting": f"packaged backbone unavailable ({exc.__class__.__name__})"})
    if pk is not None:
        found = find("context-i2w", pk.fingerprint, ctx["settings"].checkpoints)
        if found:
            mapper, rec = load_context_i2w(found[0][0], pk.fingerprint)
            label = f"packaged, shipped checkpoint {rec['file']}"
        else:
            torch.manual_seed(0)
            mapper, label = ContextI2WMapper(ContextI2WConfig.for_backbone(pk, **SMALL_CONFIG)).eval(), "packaged, --small mapper"
        rows.append({"setting": label, **bench_context_i2w(pk, mapper, n=n)})
    md = ["Per query on CPU, image pass excluded (it is shared with the feature cache); "
          f"mean of {n} queries after 2 warm-up queries.", "",
          "| backbone / mapper | mapper parameters | Context-I2W ms | text-only ms | extra ms |", "|---|---|---|---|---|"]
    for r in rows:
        if "extra_ms" in r:
            md.append(f"| {r['setting']} | {r['mapper_parameters']:,} | {r['context_i2w_ms']:.1f} | "
                      f"{r['text_only_ms']:.1f} | {r['extra_ms']:.1f} |")
        else:
            md.append(f"| {r['setting']} | | | | |")
    return "\n".join(md), {"rows": rows}
