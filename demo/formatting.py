"""Turn engine responses into what the page shows. Every user-supplied string is HTML-escaped."""
from __future__ import annotations

import html
from typing import List, Tuple

from engine.search import SearchEngine, SearchResponse

LABELS = {
    "image": "Image only",
    "text": "Text only",
    "sum": "Image + text (weighted sum)",
    "context-i2w": "Context-I2W",
    "rtic": "RTIC",
}
EXPANDER_LABELS = {"lattqe": "LAttQE", "aqe": "AQE", "aqewd": "AQEwD", "alpha-qe": "α-QE", "none": "None"}


def esc(text) -> str:
    return html.escape(str(text if text is not None else ""), quote=True)


def method_choices(engine: SearchEngine) -> List[Tuple[str, str]]:
    out = []
    for name, reason in engine.methods().items():
        label = LABELS.get(name, name)
        out.append((label if reason is None else f"{label} (unavailable: {_short(reason)})", name))
    return out


def _short(reason: str, n: int = 60) -> str:
    return reason if len(reason) <= n else reason[: n - 1] + "…"


def result_caption(r) -> str:
    cap = f"#{r.rank} · {r.score:.3f}"
    if r.caption:
        cap += f" · {r.caption}"
    moved = r.explain.get("rank_before_expansion", "n/a")
    if moved is None:
        cap += " · new after expansion"
    elif moved != "n/a" and moved > r.rank:
        cap += f" · ▲ from #{moved}"
    return cap


def gallery_items(engine: SearchEngine, resp: SearchResponse):
    return [(str(engine.index.display_path(r.id)), result_caption(r)) for r in resp.results]


def explanation_markdown(resp: SearchResponse) -> str:
    lines = []
    comp = resp.explanation.get("composer", {})
    lines.append(f"**Method:** {esc(LABELS.get(resp.method, resp.method))}")
    if comp.get("prompt"):
        lines.append(f"**Prompt encoded:** <code>{esc(comp['prompt'])}</code>")
    for key in ("formula", "gate", "gate_mean"):
        if key in comp:
            val = comp[key]
            lines.append(f"**{esc(key.replace('_', ' '))}:** {esc(f'{val:.3f}' if isinstance(val, float) else val)}")
    if "weights" in comp:
        lines.append("**Weights:** " + ", ".join(f"{esc(k)}={v:.2f}" for k, v in comp["weights"].items()))
    ex = resp.explanation.get("expansion")
    if ex:
        lines.append(f"**Expansion:** {esc(EXPANDER_LABELS.get(ex['method'], ex['method']))} over "
                     f"{ex['nqe']} neighbours")
        for nb in ex.get("neighbours", [])[:8]:
            w = float(nb["weight"])
            bar = "█" * max(0, min(20, int(round(abs(w) * 20))))
            lines.append(f"<code>{bar:<20}</code> {w:.3f} {esc(nb['path'])}")
    for n in resp.notices:
        lines.append(f"⚠️ {esc(n)}")
    t = resp.timings_ms
    stages = ", ".join(f"{esc(k)} {v:.1f} ms" for k, v in t.items() if k != "image_cache_hit")
    hit = " (reference features from cache)" if t.get("image_cache_hit") else ""
    lines.append(f"**Timings:** {stages}{hit}")
    return "\n\n".join(lines)


def backbone_markdown(engine: SearchEngine) -> str:
    b = engine.backbone.describe()
    st = engine.index.stats()
    vi = st.get("vector_index", {})
    return (f"**Backbone:** `{esc(b['name'])}` on {esc(b['device'])} — {esc(b.get('why', ''))}  \n"
            f"**Gallery:** {st['items']} images, index `{esc(vi.get('type', st['index_type']))}`, "
            f"{vi.get('bytes_per_item', 0):g} bytes per image in the vector index")
