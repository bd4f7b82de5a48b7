"""Turn engine responses into what the page shows. Every user-supplied string is HTML-escaped."""
from __future__ import annotations

import html
import re
from pathlib import PurePath
from typing import List, Optional, Tuple
from urllib.parse import quote

from engine.export import breakdown_rows
from engine.labels import EXPAND_LABELS, METHOD_LABELS

from engine.search import SearchEngine, SearchResponse

LABELS, EXPANDER_LABELS = METHOD_LABELS, EXPAND_LABELS  # the engine's one table, under the names demo/ uses


# Characters Markdown reads as syntax wherever they stand (emphasis, code, links and images, tables, strike,
# e-mail autolinks); ``(``, ``)``, ``+``, ``-``, ``.`` and ``:`` only matter next to these, and stay as typed
_MD_SPECIAL = {c: f"&#{ord(c)};" for c in "\\`*_{}[]#!|~@"}
_MD_TABLE = str.maketrans(_MD_SPECIAL)
_AUTOLINK = re.compile(r"(?i)(://|www\.)")  # the two autolink starts of GitHub Markdown, broken up


def esc(text) -> str:
    """User or file text made inert in both HTML and Markdown, changed no more than that: ``<``, ``>``, ``&`` and
    ``"`` become HTML references (every attribute here is double-quoted), the characters Markdown reads as syntax
    anywhere become numeric references (which render as the characters), and autolink starts (``://``, ``www.``)
    are broken up. An apostrophe, brackets, plus signs and full stops stay as typed, so a label such as
    "Image + text (weighted sum)" reaches a page or an API client as it is written."""
    out = html.escape(str(text if text is not None else ""), quote=False).replace('"', "&quot;").translate(_MD_TABLE)
    return _AUTOLINK.sub(lambda m: m.group(1).replace("/", "&#47;").replace(".", "&#46;"), out)


def code(text) -> str:
    """Text shown as code: a Markdown code span for plain names (``ics-64``), an escaped ``<code>``
    element for anything holding characters a code span would not make inert."""
    text = " ".join(str(text if text is not None else "").split())
    if re.fullmatch(r"[\w.:/+@=,()* -]*", text):
        return f"`{text}`"
    return f"<code>{esc(text)}</code>"


def method_choices(engine: SearchEngine) -> List[Tuple[str, str]]:
    out = []
    for name, reason in engine.methods().items():
        label = LABELS.get(name, name)
        out.append((label if reason is None else f"{label} (unavailable: {_short(reason)})", name))
    return out


def _short(reason: str, n: int = 60) -> str:
    return reason if len(reason) <= n else reason[: n - 1] + "…"


def result_caption(r) -> str:
    """``#rank · score · caption`` (the file name when the image has no caption, as in uploaded photos)."""
    cap = f"#{r.rank} · {r.score:.3f}"
    name = r.caption or PurePath(str(r.path or "")).name
    if name:
        cap += f" · {name}"
    if "rank_before_expansion" in r.explain:   # only with expansion: say so only where the rank changed
        before = r.explain["rank_before_expansion"]
        if before is None:
            cap += " · new after expansion"
        elif before > r.rank:
            cap += f" · ▲ from #{before}"
        elif before < r.rank:
            cap += f" · ▼ from #{before}"
    return cap


def gallery_items(engine: SearchEngine, resp: SearchResponse, thumbs_only: bool = False):
    """(image, caption) per result. ``thumbs_only`` (uploaded galleries, whose folder is not served):
    the thumbnail's pixels, which Gradio copies into its own cache; the session folder stays private."""
    if not thumbs_only:
        return [(str(engine.index.display_path(r.id)), result_caption(r)) for r in resp.results]
    from PIL import Image

    out = []
    for r in resp.results:
        thumb = engine.index.thumb_path(r.id)
        if not thumb.exists():
            continue
        with Image.open(thumb) as im:
            im.load()
            out.append((im.copy(), result_caption(r)))
    return out


def explanation_markdown(resp: SearchResponse) -> str:
    return explanation_markdown_json(resp.to_json())


UNFAMILIAR = 0.5  # a familiarity under this is what the note calls "unlike its training data"


def zero_trust_reason(comp: dict) -> str:
    """Why a learned composer used none of its own correction, in words that agree with the figures shown
    beside them: the operation the router read (when it decided), else only the input whose familiarity is
    low is called unlike the training data."""
    op = comp.get("operation") or {}
    if isinstance(op, dict) and op.get("name") and float(op.get("trust", 1) or 0) <= 0.0:
        return f"validation showed it does not help with “{esc(op['name'])}” edits"
    text_low = float(comp.get("text_familiarity", 1)) < UNFAMILIAR
    image_low = float(comp.get("image_familiarity", 1)) < UNFAMILIAR
    if text_low and image_low:
        return "the text and the picture are unlike its training data"
    if text_low:
        return "the text is unlike its training data"
    if image_low:
        return "the picture is unlike its training data"
    if op.get("name"):
        return f"validation showed little gain from it on “{esc(op['name'])}” edits"
    return "its correction is not trusted for this query"


def anchor_lines(comp: dict) -> list:
    """How much of a learned composer's own correction this query used (engine.compose.anchor): 0 % is the
    training-free weighted sum, used where the text or the picture is unlike the composer's training data."""
    out = []
    if (comp.get("automatic") or {}).get("says"):
        out.append(esc(comp["automatic"]["says"]))
    if comp.get("prior_only"):
        out.append(f"**Weighted sum used:** {esc(comp['prior_only'])}")
    elif isinstance(comp.get("trust"), (int, float)):
        share = float(comp["trust"])
        why = zero_trust_reason(comp) + ", so this is the weighted sum" if share == 0 else "the rest is the weighted sum"
        out.append(f"**Learned correction used:** {share:.0%} ({why}; text familiarity "
                   f"{float(comp.get('text_familiarity', 0)):.2f}, image familiarity "
                   f"{float(comp.get('image_familiarity', 0)):.2f})")
    return out


def explanation_markdown_json(data: dict) -> str:
    """'Why these results': the query's composition (formula, prompt, gate), the expansion, and a table
    with each result's similarity to the reference image, to the text, the composed score and (with
    expansion) where it came from. ``data`` is a search JSON (``SearchResponse.to_json()``)."""
    explanation = data.get("explanation") or {}
    method = data.get("method", "")
    lines = []
    comp = explanation.get("composer", {}) or {}
    lines.append(f"**Method:** {esc(LABELS.get(method, method))}")
    if comp.get("prompt"):
        lines.append(f"**Prompt encoded:** <code>{esc(comp['prompt'])}</code>")
    for key in ("formula", "gate", "gate_mean"):
        if comp.get(key) is not None:
            val = comp[key]
            shown = esc(f"{val:.3f}" if isinstance(val, float) else val)
            if key == "formula":  # a code span: '*' stays '*' (no emphasis, no character reference)
                shown = code(val)
            lines.append(f"**{esc(key.replace('_', ' '))}:** {shown}")
    if comp.get("top_changed_channels"):
        lines.append("**Channels changed most:** " + ", ".join(
            f"#{c['channel']} ({c['change']:+.3f})" for c in comp["top_changed_channels"]))
    if "weights" in comp:
        lines.append("**Weights:** " + ", ".join(f"{esc(k)}={v:.2f}" for k, v in comp["weights"].items()))
    lines += anchor_lines(comp)
    ex = explanation.get("expansion")
    if ex:
        lines.append(expansion_summary(data))
        if not ex.get("kept_query"):
            for nb in ex.get("neighbours", [])[:8]:
                w = float(nb["weight"])
                if abs(w) <= 1e-6:
                    continue
                bar = "█" * max(0, min(20, int(round(abs(w) * 20))))
                lines.append(f"<code>{bar:<20}</code> {w:.3f} {esc(nb['path'])}")
    for n in data.get("notices", []):
        lines.append(f"⚠️ {esc(n)}")
    table = why_table_markdown(data)
    if table:
        lines.append(table)
    t = data.get("timings_ms", {})
    stages = ", ".join(f"{esc(k.replace('_', ' '))} {v:.1f} ms" for k, v in t.items() if k != "image_cache_hit")
    hit = " (reference features from cache)" if t.get("image_cache_hit") else ""
    lines.append(f"**Timings:** {stages}{hit}")
    return "\n\n".join(lines)


def kept_reason(ex: dict) -> str:
    """Why an expansion returned the query unchanged, in words."""
    if ex.get("kept_because"):
        return str(ex["kept_because"])
    if "weight floor 1" in str(ex.get("formula", "")):
        return ("its weight floor, chosen on validation, is 1: no amount of expansion improved search there, so "
                "every neighbour gets weight 0")
    return "no neighbour was close enough to the query to get a weight above 0"


def expansion_summary(data: dict) -> str:
    """One sentence on what expansion did for this query: kept the query (and why), or re-formed it from
    which neighbours and how many results moved relative to the search without expansion."""
    ex = (data.get("explanation") or {}).get("expansion") or {}
    if not ex:
        return ""
    name = esc(EXPANDER_LABELS.get(ex.get("method"), ex.get("method")))
    if ex.get("kept_query"):
        return (f"**Expansion:** {name} kept the query: {esc(kept_reason(ex))}. The results are those of the "
                "search without expansion.")
    rows = breakdown_rows(data)
    moved = sum(1 for r in rows if r["rank_before_expansion"] != r["rank"])
    used = ex.get("used_neighbours", len(ex.get("neighbours", [])))
    return (f"**Expansion:** {name} re-formed the query from {used} of its {ex.get('nqe')} nearest results; "
            f"{moved} of {len(rows)} results are placed differently than without expansion.")


def expansion_note(data: Optional[dict]) -> str:
    """The line under the LAttQE box after a search: what expansion did for that query (empty without one)."""
    ex = ((data or {}).get("explanation") or {}).get("expansion") or {}
    if not ex:
        return ""
    name = EXPANDER_LABELS.get(ex.get("method"), ex.get("method"))
    if ex.get("kept_query"):
        return f"For this query: {esc(name)} kept the query: {esc(kept_reason(ex))}."
    nbs = [PurePath(str(nb.get("path", ""))).stem for nb in ex.get("neighbours", []) if abs(float(nb["weight"])) > 1e-6]
    shown = ", ".join(esc(n) for n in nbs[:4]) + (f" and {len(nbs) - 4} more" if len(nbs) > 4 else "")
    return f"For this query: {esc(name)} expanded the query with {shown or 'its nearest results'}."


def index_markdown(engine: SearchEngine) -> str:
    """``N images, index `type`, B bytes per image ...`` (compact indexes also name their re-rank stage)."""
    st = engine.index.stats()
    vi = st.get("vector_index", {})
    text = (f"{st['items']} images, index {code(vi.get('type', st['index_type']))}, "
            f"{vi.get('bytes_per_item', 0):g} bytes per image in the vector index")
    if "rerank" in vi:
        text += (f" (binary codes; the top {vi['rerank']} by Hamming distance are re-ranked with float16 "
                 f"vectors, {vi['bytes_per_item_with_rerank_vectors']:g} bytes per image in all)")
    return text


def backbone_markdown(engine: SearchEngine) -> str:
    """The technical details, for the "About this engine" panel: backbone name and fingerprint, device, why
    this backbone (the fallback reason), the gallery's index type and bytes per image, and what each method
    and expansion needs when it is not available."""
    b = engine.backbone.describe()
    lines = [f"**Backbone:** {code(b.get('name', ''))} on {esc(b.get('device', ''))} — {esc(b.get('why', ''))}"]
    if b.get("fingerprint"):
        lines.append(f"**Backbone fingerprint:** {code(b['fingerprint'])} (checkpoints must carry the same one)")
    lines.append(f"**Gallery:** {index_markdown(engine)}")
    if hasattr(engine, "defaults"):
        method = engine.default_method
        lines.append(f"**Default method:** {esc(LABELS.get(method, method))}, {esc(engine.defaults.why())}. It is "
                     "chosen on the validation side of the held-out-domain suite (photos, words and phrasings no "
                     "trainer saw: `python -m engine eval generalise --side val --choose`) and is the same for the "
                     "page, the command line and the JSON API; without a record for this backbone it is the "
                     "weighted sum.")
    methods = getattr(engine, "methods", None)
    if callable(methods):
        lines.append("**Methods:** " + "; ".join(
            f"{esc(LABELS.get(n, n))}: {'available' if why is None else esc(why)}" for n, why in methods().items()))
    unavailable = getattr(engine, "expanders_unavailable", None)
    if unavailable is not None:
        names = [EXPANDER_LABELS.get(n, n) for n in getattr(engine, "expanders", {})]
        lines.append("**Expansions:** " + "; ".join(
            [esc(", ".join(names)) + " available"] + [f"{esc(EXPANDER_LABELS.get(n, n))}: {esc(why)}"
                                                      for n, why in unavailable.items()]))
    return "  \n".join(lines)


def default_method_note(engine: SearchEngine) -> str:
    """One plain sentence under the method menu: the method in use (``engine.default_method``, the same for the
    CLI and the JSON API) and why, in a stakeholder's words; the figures behind it (``engine.defaults.why()``)
    are in "About this engine"."""
    method = engine.default_method
    if method == "auto":
        why = ("for each request it uses the method that did best on that kind of change (a new object, a colour, "
               "night, ...) when tested on photos and wordings it had never seen")
    elif getattr(engine.defaults, "source", None):
        why = ("it found the right photos most often when tested on photos and wordings it had never seen, so it "
               "is the default here")
    else:
        why = "it needs no training, so it works the same on any photos"
    return f"Method in use: **{esc(LABELS.get(method, method))}**. Why: {why}."


def _model_words(b: dict) -> str:
    name = str(b.get("name", ""))
    where = "a GPU" if str(b.get("device", "")).startswith("cuda") else "this computer's processor"
    if name.startswith("packaged"):
        return f"a small image-and-text model bundled with the app, running on {where}"
    if name.startswith("tiny"):
        return f"a tiny test model with random weights (results are not meaningful), running on {where}"
    return f"the {esc(name.split(':', 1)[-1].split('@', 1)[0])} image-and-text model, running on {where}"


def plain_summary(engine: SearchEngine) -> str:
    """One or two plain sentences about what the page searches and with what (the details are in
    :func:`backbone_markdown`)."""
    b = engine.backbone.describe()
    n = engine.index.stats()["items"]
    text = f"Searching **{n} photos** with {_model_words(b)}."
    if str(b.get("why", "")).startswith("offline fallback"):
        text += (" This is the compact model that works without a network connection; a larger model is used "
                 "when one is installed (see *About this engine*).")
    return text


def _f(v, fmt="{:.3f}") -> str:
    return "–" if v is None else fmt.format(v)


def expansion_cell(row: dict) -> str:
    """How expansion moved a result: 'new (from the expanded query)', '▲ 3 (was #5)', '▼ 1', '='."""
    if row.get("from_expanded_query") is None:
        return ""
    before, change = row["rank_before_expansion"], row["rank_change"]
    if before is None:
        return "new (from the expanded query)"
    tag = " (from the expanded query)" if row["from_expanded_query"] else ""
    if change > 0:
        return f"▲ {change} (was #{before}){tag}"
    if change < 0:
        return f"▼ {-change} (was #{before}){tag}"
    return "= (same rank)"


def why_table_markdown(data: dict) -> str:
    """Markdown table: one row per result with its score breakdown."""
    rows = breakdown_rows(data)
    if not rows:
        return ""
    kept = bool(((data.get("explanation") or {}).get("expansion") or {}).get("kept_query"))
    expanded = not kept and any(r["from_expanded_query"] is not None for r in rows)
    head = "| # | Result | Composed score | Image similarity | Text similarity |" + (" Expansion |" if expanded else "")
    sep = "|---:|---|---:|---:|---:|" + ("---|" if expanded else "")
    out = ["**Why each result** (cosine similarity of the result to the reference image alone, to the text "
           "alone, and to the composed query)", "", head, sep]
    for r in rows:
        name = esc(r["caption"] or r["path"]).replace("|", "&#124;")
        line = (f"| {r['rank']} | {name} | {_f(r['composed_score'] if r['composed_score'] is not None else r['score'])}"
                f" | {_f(r['image_similarity'])} | {_f(r['text_similarity'])} |")
        if expanded:
            line += f" {esc(expansion_cell(r))} |"
        out.append(line)
    return "\n".join(out)


def file_url(path) -> str:
    """URL of a file the server may serve (relative, so it works under a proxy path)."""
    return "gradio_api/file=" + quote(str(path))


def _why_title(r: dict) -> str:
    e = r.get("explain") or {}
    parts = [f"#{r['rank']} {r.get('caption') or r['path']}", f"composed {_f(e.get('composed_score', r['score']))}"]
    if e.get("image_similarity") is not None:
        parts.append(f"image {_f(e['image_similarity'])}")
    if e.get("text_similarity") is not None:
        parts.append(f"text {_f(e['text_similarity'])}")
    if "rank_before_expansion" in e and e["rank_before_expansion"] != r["rank"]:
        b = e["rank_before_expansion"]
        parts.append("new from the expanded query" if b is None else f"was #{b} before expansion")
    return " · ".join(parts)


def column_dom_id(key: str) -> str:
    """DOM id of a compare column: ``compare-col-sum``, ``compare-col-sum-lattqe``."""
    return "compare-col-" + re.sub(r"[^A-Za-z0-9_-]", "-", key)


def compare_marks(data: dict) -> Tuple[dict, dict, int]:
    """(gallery id -> how many different answers found it, for the results a minority found; column key -> the
    key of the identical earlier column; how many different answers there are), from the compare JSON."""
    minority = {int(i): int(n) for i, n in (data.get("minority") or {}).items()}
    return minority, dict(data.get("same_as") or {}), int(data.get("answers") or 0)


def compare_html(image_for, data: dict) -> str:
    """Compare mode as HTML: a responsive grid of columns (one per method), per-method timings, the results
    that only a minority of the methods found outlined and labelled in words (not by colour alone), a column
    identical to an earlier one said as "Same results as ..." instead of repeated, captions as alt text and
    the score breakdown as each image's tooltip. ``image_for(id)`` gives the file to show."""
    cols = data.get("columns", [])
    minority, same, answers = compare_marks(data)
    labels = {c["key"]: c["label"] for c in cols}
    key = (f' · <span class="cmp-shared-key">outlined</span>: found by fewer than half of the {answers} different '
           'answers' if answers > 2 else "")
    out = [f'<div class="cmp-summary" role="status">{len(cols)} methods in {data.get("wall_ms", 0):.0f} ms{key}</div>',
           '<div class="cmp-grid">']
    for c in cols:
        resp = c.get("response") or {}
        extra = ""
        comp = (resp.get("explanation") or {}).get("composer", {}) if resp else {}
        if comp.get("prompt") and c["method"] == "context-i2w":
            extra += f'<div class="cmp-note">prompt: <code>{esc(comp["prompt"])}</code></div>'
        out.append(f'<section class="cmp-col" id="{column_dom_id(c["key"])}" data-method="{esc(c["method"])}" '
                   f'data-expand="{esc(c["expand"])}" aria-label="{esc(c["label"])}">')
        out.append(f'<h3>{esc(c["label"])} <span class="cmp-time">{c["wall_ms"]:.0f} ms</span></h3>{extra}')
        if c.get("error"):
            out.append(f'<p class="cmp-error">Not run: {esc(c["error"])}</p></section>')
            continue
        if c["key"] in same:
            out.append(f'<p class="cmp-same" data-same-as="{esc(same[c["key"]])}">Same results as '
                       f'{esc(labels.get(same[c["key"]], same[c["key"]]))}.</p></section>')
            continue
        out.append('<ol class="cmp-list">')
        for r in resp.get("results", []):
            n = minority.get(int(r["id"]))
            cls = "cmp-item shared" if n else "cmp-item"
            badge = (f'<span class="cmp-badge" title="found by {n} of the {answers} different answers">'
                     f'{n} of {answers}</span>' if n else "")
            cap = r.get("caption") or r["path"]
            out.append(f'<li class="{cls}" data-id="{int(r["id"])}" data-found="{n or 0}">'
                       f'<img src="{esc(file_url(image_for(int(r["id"]))))}" alt="{esc(cap)}" '
                       f'title="{esc(_why_title(r))}">'
                       f'<span class="cmp-cap">#{r["rank"]} · {float(r["score"]):.3f} {badge}<br>{esc(cap)}</span></li>')
        out.append("</ol></section>")
    out.append("</div>")
    return "".join(out)


def compare_summary_markdown(data: dict) -> str:
    """Explanation panel text after a compare run: timings per method, identical columns, and how many results
    only a minority of the methods found."""
    lines = ["**Compare mode** — the same query through every available method."]
    minority, same, answers = compare_marks(data)
    labels = {c["key"]: c["label"] for c in data.get("columns", [])}
    for c in data.get("columns", []):
        n = len((c.get("response") or {}).get("results", []))
        state = (f"not run: {esc(c['error'])}" if c.get("error") else
                 f"same results as {esc(labels.get(same[c['key']], same[c['key']]))}" if c["key"] in same else
                 f"{n} results")
        lines.append(f"- {esc(c['label'])}: {c['wall_ms']:.0f} ms, {state}")
    lines.append("")   # a blank line: the total is its own paragraph, not part of the last bullet
    lines.append(f"**Total:** {data.get('wall_ms', 0):.0f} ms · {answers} different answers · {len(minority)} "
                 "images found by fewer than half of them")
    return "\n".join(lines)
