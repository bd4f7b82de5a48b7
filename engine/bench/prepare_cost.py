"""Bench section ``prepare-cost``: CPU cost of ``python -m engine prepare``'s two main steps per backbone."""
from __future__ import annotations

import time

from ..sysinfo import load_average
from .base import SECTIONS


def measure_costs(arch: str, batch: int = 8, steps: int = 2) -> dict:
    """CPU cost of the two things ``prepare`` spends its time on, for one open_clip architecture (random
    weights: the cost does not depend on them): extracting an image's embedding + visual tokens (ms per
    image, batch ``batch``), and one Context-I2W training step of the paper-size mapper (batch 32; the
    frozen text tower's forward and backward through the pseudo-word dominate)."""
    import torch

    from ..backbones.openclip import OpenClipBackbone
    from ..compose.context_i2w import ContextI2WConfig, ContextI2WMapper
    from ..train.context_i2w import contrastive_loss, pseudo_prompt_embeddings

    t0 = time.perf_counter()
    bb = OpenClipBackbone(arch, pretrained=None, device="cpu")
    load_s = time.perf_counter() - t0
    size = bb.model.visual.image_size
    size = int(size[0] if isinstance(size, (tuple, list)) else size)
    pixels = torch.randn(batch, 3, size, size)
    bb.encode_images_with_tokens(pixels[:1])
    t0 = time.perf_counter()
    emb, tok = bb.encode_images_with_tokens(pixels)
    extract_ms = (time.perf_counter() - t0) / batch * 1000
    torch.manual_seed(0)
    mapper = ContextI2WMapper(ContextI2WConfig.for_backbone(bb)).train()
    opt = torch.optim.AdamW(mapper.parameters(), lr=1e-4)
    reps = (32 + batch - 1) // batch
    emb, tok = emb.repeat(reps, 1)[:32], tok.repeat(reps, 1, 1)[:32]
    ctx = bb.encode_texts(["a photo of a dog"] * 32).embeddings
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        loss = contrastive_loss(emb, pseudo_prompt_embeddings(bb, mapper, tok, ctx).float(), bb.logit_scale)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return {"arch": arch, "load_s": round(load_s, 1), "extract_ms_per_image": round(extract_ms, 1),
            "step_s_batch32": round(min(times[1:]), 3), "threads": torch.get_num_threads()}


@SECTIONS.register("prepare-cost")
def section_prepare_cost(args=None, ctx=None) -> tuple:
    """Measured CPU costs per backbone and the time ``prepare`` would need for the offline caption set."""
    from ..train.context_i2w import load_pairs

    n_pairs = len(load_pairs("captions", "train"))
    load = load_average()
    rows = [measure_costs(a) for a in (getattr(args, "prepare_archs", None) or ("tiny-vit-a", "ViT-B-32", "ViT-L-14"))]
    md = [f"Load average at the start: {load}. CPU costs of `prepare`'s two main steps with random weights (the cost does not depend on them), "
          f"{rows[0]['threads']} threads, one run; estimate for Context-I2W on the offline caption set "
          f"({n_pairs:,} training pairs): extract every image once, then 10 epochs of the paper-size mapper "
          f"at batch 32. RTIC, LAttQE and ICS train on cached embeddings and add minutes, not hours. No GPU "
          f"was available, so GPU times are not given.", "",
          "| backbone | extract ms / image | mapper step s (batch 32) | estimate: extract + 10 epochs (min) |",
          "|---|---|---|---|"]
    for r in rows:
        est = (n_pairs * r["extract_ms_per_image"] / 1000 + 10 * (n_pairs // 32) * r["step_s_batch32"]) / 60
        r["estimate_min_10_epochs"] = round(est, 1)
        md.append(f"| {r['arch']} | {r['extract_ms_per_image']:.1f} | {r['step_s_batch32']:.2f} | {est:.0f} |")
    return "\n".join(md), {"pairs": n_pairs, "rows": rows}
