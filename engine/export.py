"""Export search results: JSON (the CLI's ``--json`` schema) and a contact-sheet PNG, plus the
per-result "why this result" rows that the UI, the CLI and the contact sheet all show.

Everything here works on the JSON form of a response (``SearchResponse.to_json()``) or of a compare
run (``CompareResult.to_json()``), so what is exported is exactly what was shown.

Contact-sheet layout (pixels), for ``n`` results in ``columns`` columns of ``thumb``-sized cells::

    width  = 2 * MARGIN + columns * thumb + (columns - 1) * GAP
    height = 2 * MARGIN + TITLE_H + sections * (SECTION_H + rows * (thumb + LABEL_H) + (rows - 1) * GAP)
             + (sections - 1) * GAP           where rows = ceil(max results in a section / columns)

With ``asked`` in the data (the page adds it: reference file and text), a query row under the title shows the
reference image and the text. A PNG over MAX_PNG_BYTES is saved with 256 colours, then scaled down.
Under each image: ``#rank · score`` and up to two lines of caption. The PNG also carries the
labels as text chunks (``cis:labels`` as JSON, ``Description`` as plain text) for screen readers
and for checking.
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple, Union

from PIL import Image, ImageDraw, ImageFont, ImageOps
from PIL.PngImagePlugin import PngInfo

from .errors import InputError
from .fileio import atomic_write_bytes as _atomic_write

MARGIN, GAP, TITLE_H, SECTION_H, LABEL_H = 16, 12, 28, 22, 50
QUERY_H = 96          # the query row (reference thumbnail and text) when the data names the query
MAX_PNG_BYTES = 480_000  # a contact sheet over this is saved with 256 colours, then smaller, until it fits
BACKGROUND, INK, MUTED = (255, 255, 255), (20, 20, 20), (90, 90, 90)


# -- atomic writes -----------------------------------------------------------------------


def export_json(data: dict, path: Union[str, Path]) -> Path:
    """Writes a response's JSON (``SearchResponse.to_json()`` or ``CompareResult.to_json()``) atomically."""
    if not isinstance(data, dict) or ("results" not in data and "columns" not in data):
        raise InputError("nothing to export yet: run a search first")
    return _atomic_write(path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))


# -- "why this result" ---------------------------------------------------------------------
def breakdown_rows(data: dict) -> List[dict]:
    """Per result of a search JSON: its scores and, with expansion, where it came from.

    Keys: rank, id, path, caption, score, composed_score, image_similarity, text_similarity,
    rank_before_expansion, from_expanded_query (True when the result was not in the first pass's top-k,
    i.e. the expanded query brought it in), rank_change (first-pass rank minus final rank: positive = moved up).
    """
    expanded = data.get("expand", "none") not in (None, "none")
    results = data.get("results", [])
    k = len(results)
    rows = []
    for r in results:
        e = r.get("explain", {}) or {}
        row = {"rank": r["rank"], "id": r["id"], "path": r["path"], "caption": r.get("caption", ""),
               "score": r["score"], "composed_score": e.get("composed_score"),
               "image_similarity": e.get("image_similarity"), "text_similarity": e.get("text_similarity"),
               "rank_before_expansion": None, "from_expanded_query": None, "rank_change": None}
        if expanded and "rank_before_expansion" in e:
            before = e["rank_before_expansion"]
            row["rank_before_expansion"] = before
            row["from_expanded_query"] = before is None or before > k
            row["rank_change"] = None if before is None else before - r["rank"]
        rows.append(row)
    return rows


def query_explanation(data: dict) -> Dict[str, object]:
    """The query-level explanation worth showing: formula, encoded prompt (Context-I2W), gate (RTIC)."""
    comp = (data.get("explanation") or {}).get("composer", {}) or {}
    out = {}
    for key in ("formula", "prompt", "gate", "gate_mean", "weights"):
        if comp.get(key) not in (None, ""):
            out[key] = comp[key]
    ex = (data.get("explanation") or {}).get("expansion")
    if ex:
        out["expansion"] = {"method": ex.get("method"), "nqe": ex.get("nqe")}
    return out


def result_label(r: dict) -> str:
    """``#rank · score`` — the first label line under an image."""
    return f"#{r['rank']} · {float(r['score']):.3f}"


# -- contact sheet -------------------------------------------------------------------------
def sheet_size(section_lengths: Sequence[int], columns: int, thumb: int, query: bool = False) -> Tuple[int, int]:
    """(width, height) of a contact sheet; see the module docstring for the formula (``query``: plus the query
    row, QUERY_H + GAP, under the title)."""
    sections = [n for n in section_lengths] or [0]
    rows = max(1, math.ceil(max(sections) / columns))
    width = 2 * MARGIN + columns * thumb + (columns - 1) * GAP
    block = SECTION_H + rows * (thumb + LABEL_H) + (rows - 1) * GAP
    height = 2 * MARGIN + TITLE_H + len(sections) * block + (len(sections) - 1) * GAP
    return width, height + ((QUERY_H + GAP) if query else 0)


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType sizes
        return ImageFont.load_default()


def _fit(draw: ImageDraw.ImageDraw, text: str, font, width: int, lines: int) -> List[str]:
    """Word-wraps ``text`` into at most ``lines`` lines of ``width`` pixels (ellipsis when cut)."""
    words, out, cur = text.split(), [], ""
    for w in words:
        trial = (cur + " " + w).strip()
        if draw.textlength(trial, font=font) <= width:
            cur = trial
            continue
        if cur:
            out.append(cur)
        cur = w
        if len(out) == lines:
            break
    if cur and len(out) < lines:
        out.append(cur)
    used = sum(len(x.split()) for x in out)
    if used < len(words) and out:
        last = out[-1]
        while last and draw.textlength(last + "…", font=font) > width:
            last = last[:-1]
        out[-1] = last + "…"
    return [_clip(draw, x, font, width) for x in out]


def _clip(draw, text, font, width):
    """``text`` cut with an ellipsis so it fits ``width`` pixels (unchanged when it fits)."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def sections_of(data: dict) -> List[Tuple[str, List[dict]]]:
    """(title, results) per section: one for a search, one per column for a compare run."""
    if "columns" in data:
        out = []
        for c in data["columns"]:
            resp = c.get("response") or {}
            title = f"{c['label']} · {c['wall_ms']:.0f} ms" + (f" · {c['error']}" if c.get("error") else "")
            out.append((title, resp.get("results", [])))
        return out
    return [(f"{data.get('method', '')}" + (f" + {data['expand']}" if data.get("expand", "none") != "none" else ""),
             data.get("results", []))]


def contact_sheet(data: dict, image_for: Callable[[int], Union[str, Path]], columns: int = 4, thumb: int = 192,
                  title: str = "Composed image search") -> Image.Image:
    """Renders results as a grid with ``#rank · score`` and the caption under each image.

    ``image_for(gallery id)`` gives the file to show (e.g. ``engine.index.display_path``). The returned
    image carries ``.cis_labels``: for each cell its section, box (x0, y0, x1, y1) and label lines.
    """
    if not isinstance(data, dict) or ("results" not in data and "columns" not in data):
        raise InputError("nothing to export yet: run a search first")
    if columns < 1 or thumb < 32:
        raise InputError("the contact sheet needs at least one column of 32-pixel images")
    sections = sections_of(data)
    query = data.get("asked") if isinstance(data.get("asked"), dict) else None
    w, h = sheet_size([len(rs) for _, rs in sections], columns, thumb, query=query is not None)
    sheet = Image.new("RGB", (w, h), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    f_title, f_label, f_cap = _font(18), _font(13), _font(12)
    draw.text((MARGIN, MARGIN), _clip(draw, title, f_title, w - 2 * MARGIN), fill=INK, font=f_title)
    rows = max(1, math.ceil(max(len(rs) for _, rs in sections) / columns)) if sections else 1
    y = MARGIN + TITLE_H
    if query is not None:   # the query itself: the reference image (when there is one) and the text
        x_text = MARGIN
        ref = query.get("image_file")
        if ref:
            try:
                with Image.open(ref) as im:
                    im = ImageOps.exif_transpose(im).convert("RGB")
                    im.thumbnail((QUERY_H, QUERY_H))
                    sheet.paste(im, (MARGIN + (QUERY_H - im.width) // 2, y + (QUERY_H - im.height) // 2))
                x_text = MARGIN + QUERY_H + GAP
            except (OSError, ValueError):
                pass
        lines = [f"Reference: {query.get('reference') or 'none'}", f"Text: {query.get('text') or '(none)'}"]
        for li, line in enumerate(lines):
            draw.text((x_text, y + 8 + 20 * li), _clip(draw, line, f_label, w - x_text - MARGIN), fill=INK,
                      font=f_label)
        sheet.cis_query = lines
        y += QUERY_H + GAP
    labels = []
    for s_title, results in sections:
        draw.text((MARGIN, y + 2), _clip(draw, s_title, f_label, w - 2 * MARGIN), fill=INK, font=f_label)
        y0 = y + SECTION_H
        for j, r in enumerate(results):
            cx = MARGIN + (j % columns) * (thumb + GAP)
            cy = y0 + (j // columns) * (thumb + LABEL_H + GAP)
            try:
                with Image.open(image_for(int(r["id"]))) as im:
                    im = ImageOps.exif_transpose(im).convert("RGB")
                    im.thumbnail((thumb, thumb))
                    sheet.paste(im, (cx + (thumb - im.width) // 2, cy + (thumb - im.height) // 2))
            except (OSError, ValueError, KeyError, IndexError):
                draw.rectangle([cx, cy, cx + thumb - 1, cy + thumb - 1], outline=MUTED)
                draw.text((cx + 6, cy + 6), "image missing", fill=MUTED, font=f_cap)
            lines = [result_label(r)] + _fit(draw, r.get("caption", "") or "", f_cap, thumb, 2)
            draw.text((cx, cy + thumb + 3), lines[0], fill=INK, font=f_label)
            for li, line in enumerate(lines[1:]):
                draw.text((cx, cy + thumb + 20 + 14 * li), line, fill=MUTED, font=f_cap)
            labels.append({"section": s_title, "rank": r["rank"], "id": r["id"],
                           "box": [cx, cy, cx + thumb, cy + thumb + LABEL_H], "lines": lines})
        y = y0 + rows * (thumb + LABEL_H) + (rows - 1) * GAP + GAP
    sheet.cis_labels = labels
    return sheet


def contact_sheet_png(sheet: Image.Image, max_bytes: int = MAX_PNG_BYTES) -> bytes:
    """PNG bytes with the labels as text chunks (``cis:labels`` JSON and a plain ``Description``). A sheet over
    ``max_bytes`` is saved with 256 colours, and if still over, scaled down (label boxes scaled with it)."""
    labels = getattr(sheet, "cis_labels", [])

    def encode(img: Image.Image, boxes) -> bytes:
        info = PngInfo()
        info.add_text("cis:labels", json.dumps(boxes))
        query = getattr(sheet, "cis_query", None)
        info.add_text("Description", "; ".join((query or []) + [" ".join(lab["lines"]) for lab in boxes]))
        if query:
            info.add_text("cis:query", json.dumps(query))
        buf = io.BytesIO()
        img.save(buf, "PNG", pnginfo=info, optimize=True)
        return buf.getvalue()

    data = encode(sheet, labels)
    scale, img = 1.0, sheet
    while len(data) > max_bytes and scale > 0.2:
        data = encode(img.quantize(256, dither=Image.Dither.FLOYDSTEINBERG), [
            {**lab, "box": [round(v * scale) for v in lab["box"]]} for lab in labels])
        if len(data) <= max_bytes:
            break
        scale *= 0.8
        img = sheet.resize((max(1, round(sheet.width * scale)), max(1, round(sheet.height * scale))), Image.LANCZOS)
    return data


def export_contact_sheet(data: dict, image_for: Callable[[int], Union[str, Path]], path: Union[str, Path],
                         columns: int = 4, thumb: int = 192, title: str = "Composed image search") -> Path:
    """Renders and writes the contact sheet PNG atomically."""
    return _atomic_write(path, contact_sheet_png(contact_sheet(data, image_for, columns, thumb, title)))


def format_explain(data: dict) -> str:
    """Plain-text 'why this result' table for ``python -m engine search --explain``."""
    q = query_explanation(data)
    lines = []
    for key in ("formula", "prompt", "gate", "gate_mean"):
        if key in q:
            v = q[key]
            lines.append(f"{key}: {v:.3f}" if isinstance(v, float) else f"{key}: {v}")
    if "expansion" in q:
        lines.append(f"expansion: {q['expansion']['method']} over {q['expansion']['nqe']} neighbours")

    def f(v):
        return "    -" if v is None else f"{v:5.3f}"

    rows = breakdown_rows(data)
    expanded = any(r["from_expanded_query"] is not None for r in rows)
    lines.append("rank  score  image   text  composed" + ("  expansion" if expanded else "") + "  path  caption")
    for r in rows:
        comp = r["composed_score"] if r["composed_score"] is not None else r["score"]
        move = ""
        if expanded:
            b = r["rank_before_expansion"]
            move = "new" if b is None else f"{r['rank_change']:+d} (was #{b})"
            move = f"  {move + (' *' if r['from_expanded_query'] else ''):<14}"
        lines.append(f"{r['rank']:4d}  {r['score']:.3f}  {f(r['image_similarity'])}  {f(r['text_similarity'])}"
                     f"  {comp:8.3f}{move}  {r['path']}  {r['caption']}")
    if expanded:
        lines.append("* = brought in by the expanded query (not in the first pass's top-k)")
    return "\n".join(lines)
