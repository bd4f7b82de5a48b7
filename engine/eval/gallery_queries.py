"""Natural queries on the bundled gallery: the ``gallery-queries`` section of ``python -m engine eval offline``.

A fixed list of queries a person would type on the page (``assets/gallery/queries.json``: a reference photo, a
sentence, and the gallery photos that answer it, taken from the gallery's own labels and file names, which were
assigned by eye when the gallery was built, never from a method's results). Every method answers each query through the one ``search()`` the page uses (reference left out,
top 5); the section counts the right answers in the top 5 per method, says how often each learned correction
was used, and how many of a method's top-5 lists are the weighted sum's own (what compare mode would show as
identical columns).

Record format: ``[{"reference": "<path in the gallery>", "text": "...", "answers": ["<path>", ...],
"kind": "category|colour|night|bw|..."}]`` (``bw``: black and white).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

from ..config import ROOT, Settings

QUERIES = ROOT / "assets" / "gallery" / "queries.json"
TOP = 5
USED = 0.25


def load_queries(path: Path = QUERIES) -> List[dict]:
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    for i, r in enumerate(rows):
        if not (isinstance(r, dict) and isinstance(r.get("reference"), str) and isinstance(r.get("text"), str)
                and isinstance(r.get("answers"), list) and r["answers"]):
            raise ValueError(f"{Path(path).name}: entry {i} needs reference, text and a list of answers")
    return rows


def gallery_engine(backbone, settings: Settings):
    """The bundled gallery's index (seeded from the prebuilt embeddings when they match) and its engine."""
    from ..config import cache_dir
    from ..index.build import index_source
    from ..prebuilt import seed_index
    from ..search import open_engine

    out = cache_dir() / "eval-gallery-index"
    gallery = Path(settings.gallery)
    seed_index(gallery, out, backbone)
    index_source(gallery, out, backbone, settings=settings)
    return open_engine(out, backbone=backbone, settings=settings)


def evaluate(engine, queries: List[dict], methods: Optional[List[str]] = None, k: int = TOP) -> dict:
    """{method: {"hits", "possible", "by_kind": {kind: [hits, possible]}, "used", "same_as_sum"}}."""
    from ..search import search

    id_of = {str(it["path"]): i for i, it in enumerate(engine.index.items)}
    missing = [p for q in queries for p in [q["reference"], *q["answers"]] if p not in id_of]
    if missing:
        raise ValueError(f"{len(missing)} listed photos are not in the gallery, e.g. {missing[0]}")
    methods = methods or list(engine.composers)
    tops: Dict[str, List[List[int]]] = {}
    out: Dict[str, dict] = {}
    for m in methods:
        row = {"hits": 0, "possible": 0, "by_kind": {}, "used": 0, "learned": False}
        tops[m] = []
        for q in queries:
            resp = search(engine, image=id_of[q["reference"]], text=q["text"], method=m, k=k, explain=True,
                          exclude_reference=True)
            ids = [r.id for r in resp.results]
            tops[m].append(ids)
            answers = {id_of[a] for a in q["answers"]}
            hit, possible = len(answers & set(ids)), min(k, len(answers))
            row["hits"] += hit
            row["possible"] += possible
            kind = row["by_kind"].setdefault(q.get("kind", "other"), [0, 0])
            kind[0] += hit
            kind[1] += possible
            trust = (resp.explanation or {}).get("composer", {}).get("trust")
            if trust is not None:
                row["learned"] = True
                row["used"] += int(float(trust) >= USED)
        out[m] = row
    for m in methods:
        if "sum" in tops:
            out[m]["same_as_sum"] = sum(a == b for a, b in zip(tops[m], tops["sum"]))
    return out


def markdown(res: dict, n: int, fingerprint: str) -> str:
    kinds = sorted({k for r in res.values() for k in r["by_kind"]})
    lines = [f"{n} natural queries on the bundled gallery (`assets/gallery/queries.json`, right answers from the "
             f"gallery's labels); top {TOP} of the one `search()` the page uses, reference left out; backbone `{fingerprint}`. "
             "Cells: right answers found / possible.", "",
             "| method | all | " + " | ".join(kinds) + " | learned part used | top 5 = the sum's |",
             "|---|---|" + "---|" * len(kinds) + "---|---|"]
    for m, r in res.items():
        used = f"{r['used']} of {n}" if r["learned"] else "–"
        cells = " | ".join(f"{r['by_kind'][k][0]}/{r['by_kind'][k][1]}" if k in r["by_kind"] else "–" for k in kinds)
        lines.append(f"| {m} | **{r['hits']}**/{r['possible']} | {cells} | {used} | {r.get('same_as_sum', '–')} of {n} |")
    return "\n".join(lines)


def offline_section(args, ctx):
    if not QUERIES.is_file():
        return "No query list (assets/gallery/queries.json).", {}
    queries = load_queries()
    engine = gallery_engine(ctx["backbone"], ctx["settings"])
    res = evaluate(engine, queries)
    return markdown(res, len(queries), ctx["backbone"].fingerprint), res
