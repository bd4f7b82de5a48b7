"""Event handlers: plain functions from UI values to UI values. They call the engine's one `search`."""
import copy
import functools
import html
import json
import logging
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Optional

import gradio as gr

from engine.errors import EngineError
from engine.search import SearchEngine
from engine.service import open_session, session_engine, session_index_types
from engine.query import SearchRequest
from engine.search import run as run_request
from engine.share import from_query_string, reference_file, request_for, state_for, to_query_string

from .formatting import (EXPANDER_LABELS, LABELS, backbone_markdown, compare_html, compare_summary_markdown, esc, explanation_markdown,
                         gallery_items, index_markdown, plain_summary)


log = logging.getLogger(__name__)
GENERIC_ERROR = "The server could not handle this request; check the inputs and try again."
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][^\s/\\'\"()]+){2,}[/\\]?")


def plain_message(exc: BaseException) -> str:
    """The one sentence a user sees for ``exc``: engine errors keep their message with any file path cut
    to its last part; anything else (a bug, a library's own message) becomes a generic sentence and the
    details go to the server log."""
    if not isinstance(exc, EngineError):
        log.error("request failed", exc_info=(type(exc), exc, exc.__traceback__))
        return GENERIC_ERROR
    msg = _PATH.sub(lambda m: PurePath(m.group(0).rstrip("/\\")).name, str(exc)).strip()
    msg = " ".join(msg.split())
    if len(msg) > 300:
        msg = msg[:297] + "..."
    return msg or GENERIC_ERROR


def page_error(exc: BaseException) -> gr.Error:
    """The pop-up for ``exc``: one plain sentence. A user's mistake (an engine error: an empty search, a file
    that is not an image, a bad zip) is logged as one line; anything else was logged with its traceback by
    :func:`plain_message`. Gradio is told not to print a second traceback either way."""
    msg = plain_message(exc)
    if isinstance(exc, EngineError):
        log.warning("user mistake: %s", msg)
    return gr.Error(html.escape(msg, quote=False), print_exception=False)  # pop-ups render HTML


def user_errors(fn):
    """Show every error as one plain sentence in the page (no stack trace, no server path)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:
            raise page_error(exc) from None

    return wrapper


def expansion_name(lattqe_on: bool, expander: Optional[str]) -> str:
    if lattqe_on:
        return "lattqe"
    return expander or "none"


def page_request(engine: SearchEngine, image, text, method, alpha, k, lattqe_on, expander, nqe,
                 exclude_reference=True) -> SearchRequest:
    """The page's (and the Gradio API's) values as the one query object; the one validation
    (:meth:`SearchRequest.build`) checks them as it does for every route."""
    return SearchRequest.build(engine.settings.max_text_chars, image=image or None, text=text,
                               method=method or None, alpha=alpha, k=k,
                               expand=expansion_name(bool(lattqe_on), expander), nqe=nqe or 0,
                               keep_reference=exclude_reference is False, explain=True)


def say_notices(notices) -> None:
    """What the one validation changed (a clamped value), said in the page (a toast) as well as in the
    response's notices."""
    for n in notices or []:
        gr.Warning(html.escape(n, quote=False))


def run_search(engine: SearchEngine, image, text, method, alpha, k, lattqe_on, expander, nqe,
               exclude_reference=True):
    """Returns (gallery items, explanation markdown, results JSON, result ids, the run): the run is the page's
    state of this search (:func:`run_record`), read by the steps after it."""
    own = engine is None or isinstance(engine, str)
    engine = session_engine(engine)
    if engine is None:
        raise EngineError("index a zip of photos first")
    req = page_request(engine, image, text, method, alpha, k, lattqe_on, expander, nqe, exclude_reference)
    resp = run_request(engine, req)
    say_notices(req.notices)
    data = resp.to_json()
    return (gallery_items(engine, resp, thumbs_only=own), explanation_markdown(resp),
            json.dumps(data, indent=2), [r.id for r in resp.results], run_record("search", req, data))


def run_record(view: str, request: SearchRequest, data: dict) -> dict:
    """The page's state after a run (a gr.State): the view, the request exactly as searched and the response
    (``SearchResponse.to_json()`` or the compare JSON). History, share link, exports and the expansion note
    read it; nothing parses the JSON text shown to the user."""
    return {"view": view, "request": request, "data": data}


def searched_values(run):
    """The number boxes (k, α, nQE) after a run: the values searched, so a clamped value shows as it was used."""
    req = run.get("request") if isinstance(run, dict) else None
    if not isinstance(req, SearchRequest):
        return gr.skip(), gr.skip(), gr.skip()
    return req.k, req.alpha, req.nqe


def reference_problem(engine: SearchEngine, path) -> Optional[str]:
    """The sentence for an uploaded reference that cannot be used (not an image, too large), or None: the
    same check, and so the same sentence, as a search with it would give."""
    from engine.images import decode_limits, load_image, read_bytes

    if not path:
        return None
    try:  # the reads and limits of SearchEngine.reference_features, without encoding the image
        load_image(read_bytes(path, int(engine.settings.max_upload_mb * 1e6)), **decode_limits(engine.settings))
    except EngineError as exc:
        return plain_message(exc)
    return None


def reference_checked(engine: SearchEngine):
    """Handler for an upload into the reference box: a file that is not an image is said at once (and the box
    emptied), not only after Search."""

    def check(path):
        problem = reference_problem(engine, path)
        if problem is None:
            return gr.skip()
        log.warning("user mistake: %s", problem)
        gr.Warning(html.escape(problem, quote=False))
        return None

    return check


def reference_picker(engine: SearchEngine):
    """Handler for clicks on the main gallery's results."""

    def pick(ids, evt: gr.SelectData):
        return result_as_reference(engine, ids, evt)

    return pick


def result_as_reference(engine: SearchEngine, ids, evt: gr.SelectData):
    """Clicking a result makes its image the new reference."""
    if engine is None or not ids or evt is None or evt.index is None:
        return gr.update()
    if isinstance(engine, str):  # an uploaded gallery: its folder is not served, so hand over the pixels
        from engine.images import load_image

        try:
            eng = session_engine(engine)
            i = ids[int(evt.index)]
            path = eng.index.image_path(i)
            return load_image(path if path.exists() else eng.index.thumb_path(i), max_pixels=eng.settings.max_pixels)
        except EngineError as exc:
            raise page_error(exc) from None
    i = ids[int(evt.index)]
    path = engine.index.image_path(i)
    return str(path if path.exists() else engine.index.display_path(i))


def index_upload(base: SearchEngine, old: Optional[str], file, index_type: str = "auto",
                 progress=gr.Progress()):
    """Index an uploaded zip for this session with ``index_type`` (``auto`` or an ``ics-K`` compact index);
    returns (session key, status markdown). The gallery lives in engine.service.SESSIONS (time to live,
    cap on live sessions); the page keeps only its key."""
    if file is None:
        raise EngineError("choose a .zip of photos to upload")
    path = file if isinstance(file, str) else getattr(file, "name", None)

    def report(done, total, stage):
        progress((done, max(total, 1)), desc=stage)

    progress(0, desc="checking the archive")
    key = open_session(path, base, old=old, progress=report, index_type=index_type or "auto")
    eng = session_engine(key)
    st = eng.index.stats()
    skipped = eng.index.meta.get("skipped", [])
    msg = (f"Indexed **{st['items']}** photos ({index_markdown(eng)}). Pick one of them as the reference under "
           "*Pick the reference from your photos*, or upload any image.")
    if skipped:
        msg += f" Skipped {len(skipped)}: " + "; ".join(f"{esc(s['path'])} ({esc(s['reason'])})" for s in skipped[:5])
    return key, msg


OWN_PICKER_MAX = 200


def own_photos(key):
    """The uploaded gallery's photos for the own-photos picker: (thumbnail items, ids); a click on one makes it
    the reference (:func:`result_as_reference`). At most OWN_PICKER_MAX are shown."""
    from PIL import Image

    eng = session_engine(key) if key else None
    if eng is None:
        return [], []
    items, ids = [], []
    for it in eng.index.items[:OWN_PICKER_MAX]:
        thumb = eng.index.thumb_path(int(it["id"]))
        if not thumb.exists():
            continue
        with Image.open(thumb) as im:
            im.load()
            items.append((im.copy(), PurePath(it["path"]).name))
        ids.append(int(it["id"]))
    return items, ids


def index_type_choices(engine: SearchEngine):
    """(label, value) pairs for the upload tab's index type menu."""
    def label(t: str) -> str:
        if t == "auto":
            return "Float vectors (exact search)"
        return f"{t.upper()}: {int(t.split('-')[1]) // 8} bytes per image + re-rank"

    return [(label(t), t) for t in session_index_types(engine)]


def info_markdown(engine: SearchEngine) -> str:
    """The "About this engine" panel's text (technical details)."""
    return backbone_markdown(engine)


def summary_markdown(engine: SearchEngine) -> str:
    """The page's plain line about what is searched, and with what."""
    return plain_summary(engine)


def lattqe_info(engine: SearchEngine) -> str:
    """The LAttQE box's note: what it does, why it is unavailable, or the engine's warning that its
    checkpoint measured worse than no expansion on its own validation queries."""
    from engine.expand.lattqe import keeps_query_note, validation_shortfall

    reason = engine.expanders_unavailable.get("lattqe")
    if reason is not None:
        return f"unavailable: {reason}"
    record = getattr(engine.expanders.get("lattqe"), "record", None)
    note = validation_shortfall(record) or keeps_query_note(record)
    return "re-forms the query from its top results" + (f"; note: {note}" if note else "")


def alpha_visible(engine: SearchEngine, method: str) -> bool:
    """Whether the α slider matters for ``method``: only composers that read the query's text weight use it."""
    composer = engine.composers.get(method or engine.default_method)
    return bool(getattr(composer, "uses_alpha", False))


def alpha_shown(engine: SearchEngine, method):
    """Handler for a method change: the α slider is shown only for methods that use it."""
    return gr.update(visible=alpha_visible(engine, method))


EXPANSION_HELP = ("re-form the query from its top results, then search again. AQE: the query plus the average "
                  "of its nearest results; AQEwD: the same, nearer results weighing more; α-QE: each result "
                  "weighted by its similarity to the query")


def expansion_done(run) -> str:
    """The line under the LAttQE box after a search: what expansion did for that query (empty without one).
    ``run``: the page's state of the last run (:func:`run_record`)."""
    from .formatting import expansion_note

    data = run.get("data") if isinstance(run, dict) else None
    note = expansion_note(data if isinstance(data, dict) and "results" in data else None)
    return gr.update(value=note, visible=bool(note))  # no empty box under LAttQE when nothing was expanded


# -- examples and the gallery picker ----------------------------------------------------------------
# The bundled gallery's examples: (photo, text, labels that make a result right), one per edit the page's tagline
# names. Each has at least 4 right answers in the gallery (judged by eye, docs/gallery.md), and
# tests/test_examples_prebuilt.py checks that the page's default method finds at least 4 of them in its top 5.
EXAMPLES = [
    ("products/yellow-plimsolls-3.jpg", "the same shoes but white", {"white shoes"}),
    ("buildings/empire-state-building.jpg", "at night", {"night"}),
    ("buildings/india-gate.jpg", "as a black and white photo", {"black and white"}),
    ("tools/measuring-tape-2.jpg", "a hammer instead", {"hammer"}),
]
GENERIC_TEXTS = ["the same but red", "at night", "a bigger one", "in the snow"]


def example_queries(engine: SearchEngine, n: int = 4):
    """[(gallery id, text)] for the "Try one" row: the bundled gallery's :data:`EXAMPLES` when its photos are
    in the index, else (another gallery) the first image of the first ``n`` folders with a generic text."""
    by_path = {it["path"]: int(it["id"]) for it in engine.index.items}
    picks = [(by_path[path], text) for path, text, _ in EXAMPLES
             if path in by_path and engine.index.image_path(by_path[path]).exists()]
    if len(picks) == len(EXAMPLES):
        return picks[:n]
    picks, seen = [], set()
    for it in engine.index.items:
        top = it["path"].split("/")[0] if "/" in it["path"] else ""
        if top in seen or not engine.index.image_path(it["id"]).exists():
            continue
        seen.add(top)
        picks.append((int(it["id"]), GENERIC_TEXTS[len(picks) % len(GENERIC_TEXTS)]))
        if len(picks) >= n:
            break
    return picks


def example_items(engine: SearchEngine, examples):
    """Gallery items for the "Try one" row: the thumbnail, captioned with its text."""
    return [(str(engine.index.display_path(i)), f"“{text}”") for i, text in examples]


def example_picker(engine: SearchEngine, examples):
    """Handler for a click on an example: returns (reference image, text); the search runs next."""

    def pick(evt: gr.SelectData):
        if evt is None or evt.index is None or not 0 <= int(evt.index) < len(examples):
            return gr.update(), gr.update()
        i, text = examples[int(evt.index)]
        return str(engine.index.image_path(i)), text

    return pick


PICKER_PAGE = 24


def browse_gallery(engine: SearchEngine, query: str = "", page: int = 0):
    """One page of the gallery picker: the gallery images whose caption or path contains every word of
    ``query`` (case-insensitive). Returns (gallery items, ids, note, page)."""
    words = str(query or "").lower().split()
    ids = [int(it["id"]) for it in engine.index.items
           if all(w in ((it.get("caption") or "") + " " + it["path"]).lower() for w in words)]
    pages = max(1, -(-len(ids) // PICKER_PAGE))
    page = min(max(0, int(page or 0)), pages - 1)
    shown = ids[page * PICKER_PAGE:(page + 1) * PICKER_PAGE]
    items = [(str(engine.index.display_path(i)), engine.index.items[i].get("caption") or
              PurePath(engine.index.items[i]["path"]).name) for i in shown]
    if not ids:
        note = f"No gallery image matches {esc(query)}."
    else:
        note = (f"{len(ids)} images" + (f" match {esc(query)}" if words else "") +
                (f" · page {page + 1} of {pages}" if pages > 1 else "") + " · click one to use it as the reference")
    return items, shown, note, page


def browse_page(engine: SearchEngine, step: int):
    """Handler for the picker's filter box and page buttons: (query, page) -> the four picker outputs."""

    def show(query, page):
        return browse_gallery(engine, query, int(page or 0) + step)

    return show


def shown_file(fn):
    """An export handler whose file box appears only once there is a file to download."""

    @functools.wraps(fn)
    def wrapper(*args):
        return gr.update(value=fn(*args), visible=True)

    return wrapper


# -- compare mode, shareable links, history, export ----------------------------------------
HISTORY_MAX = 10


def run_compare(engine: SearchEngine, image, text, alpha, k, lattqe_on, nqe, exclude_reference=True):
    """Compare mode: returns (compare HTML, compare JSON, the run). LAttQE columns are added when the LAttQE
    box is ticked and LAttQE is available."""
    req = page_request(engine, image, text, None, alpha, k, False, "none", nqe, exclude_reference)
    return compare_request_run(engine, req, bool(lattqe_on))


def compare_request_run(engine: SearchEngine, req: SearchRequest, lattqe_on: bool):
    """Compare mode for one request: (compare HTML, compare JSON, the run)."""
    from engine.compare import compare_request

    res = compare_request(engine, req, lattqe=bool(lattqe_on) and "lattqe" in engine.expanders)
    say_notices(req.notices)
    data = res.to_json()
    return compare_html(engine.index.display_path, data), json.dumps(data, indent=2), run_record("compare", req, data)


def _expand_parts(expand: str):
    """(LAttQE checkbox, other-expander dropdown) for an expansion name."""
    return (True, "none") if expand == "lattqe" else (False, expand or "none")


def history_label(engine: SearchEngine, st) -> str:
    """The query part of a past query's line: reference and text."""
    if st.image_id is not None:
        it = engine.index.items[st.image_id]
        ref = it.get("caption") or it["path"]
    elif st.image_hash is not None:
        ref = "uploaded image " + st.image_hash[:8]
    else:
        ref = ""
    text = f"“{st.text}”" if st.text else ""
    return " + ".join(x for x in (ref, text) if x)


def history_method(st) -> str:
    """The method part of a past query's line (its own column, so it is never cut): method, k, expansion."""
    mode = ("compare all methods" if st.view == "compare" else
            LABELS.get(st.method, st.method) if st.method else "default method")
    return (f"{mode} · k={st.k}" + ("" if st.expand == "none" else f" · {EXPANDER_LABELS.get(st.expand, st.expand)}")
            + (" · reference kept" if st.keep_reference else ""))


def _remember(engine: SearchEngine, history, st):
    """History with ``st`` first (deduplicated, at most HISTORY_MAX); returns (history, dataset update)."""
    qs = to_query_string(st)
    entries = [e for e in (history or []) if e["qs"] != qs]
    entries.insert(0, {"qs": qs, "label": history_label(engine, st), "method": history_method(st)})
    entries = entries[:HISTORY_MAX]
    return entries, gr.Dataset(samples=[[e["label"], e.get("method", "")] for e in entries])


@dataclass
class Recorded:
    """What a finished search or compare run leaves in the page (:func:`after_query`); demo/ui.py wires each
    field to the output of the same name."""
    qs: str  # the query string: the share link and the page URL carry it
    history: list  # the recent queries, newest first (the page's state)
    history_table: Any  # the "Recent queries" table
    last: Any  # the data the export buttons write


def after_query(engine: SearchEngine, run, history) -> Recorded:
    """After a successful search or compare run: the share query string, the history, the data to export,
    all from ``run`` (:func:`run_record`: the request exactly as searched, and its response)."""
    req = run["request"]
    st = state_for(engine, req, view=run["view"])
    hist, table = _remember(engine, history, st)
    image = req.image if isinstance(req.image, (str, Path)) else None
    if isinstance(req.image, int) and not isinstance(req.image, bool):
        image = str(engine.index.image_path(req.image))
    return Recorded(to_query_string(st), hist, table, with_query(copy.deepcopy(run["data"]), image, req.text))


def with_query(data, image, text):
    """The export data with what was asked (``asked``: the contact sheet shows the reference and the text);
    ``image_file`` is the server-side file, used for the sheet only and left out of the JSON download."""
    if not isinstance(data, dict):
        return data
    image = image if isinstance(image, (str, Path)) and image else None
    data["asked"] = {"text": (text or "").strip(), "reference": PurePath(str(image)).name if image else None,
                     "image_file": str(image) if image else None}
    return data


@dataclass
class Restored:
    """A query restored from a link or the history, and its run (:func:`run_state`): the value of every page
    output it sets, by name; demo/ui.py wires each field to the output of the same name."""
    image: Any  # the query's widgets
    text: str
    method: str
    alpha: float
    k: int
    lattqe_on: bool
    expander: str
    nqe: int
    keep_out: bool
    gallery: Any  # the results: single-method gallery, explanation, JSON, ids, compare columns, the run
    explanation: str
    raw: str
    ids: list
    compare_out: str
    run: dict
    qs: str  # then what after_query records (Recorded)
    history: list
    history_table: Any
    last: Any


def run_state(engine: SearchEngine, st, history) -> Restored:
    """Restores a query state into the inputs and runs exactly that query (the reference rule included)."""
    req = request_for(engine, st, engine.settings.max_text_chars)
    shown = reference_file(engine, st)
    lattqe_on, expander = _expand_parts(st.expand)
    if st.view == "compare":
        html_, raw, run = compare_request_run(engine, req, lattqe_on)
        gallery, expl, ids = gr.update(value=[], visible=False), compare_summary_markdown(run["data"]), []
    else:
        resp = run_request(engine, req)
        say_notices(req.notices)
        data = resp.to_json()
        run = run_record("search", req, data)
        gallery, expl, raw, ids, html_ = (gr.update(value=gallery_items(engine, resp), visible=True),
                                          explanation_markdown(resp),
                                          json.dumps(data, indent=2), [r.id for r in resp.results], "")
    hist, table = _remember(engine, history, st)
    return Restored(image=shown, text=st.text, method=st.method or engine.default_method, alpha=st.alpha, k=st.k,
                    lattqe_on=lattqe_on, expander=expander, nqe=st.nqe, keep_out=not st.keep_reference,
                    gallery=gallery, explanation=expl, raw=raw, ids=ids, compare_out=html_, run=run,
                    qs=to_query_string(st), history=hist, history_table=table,
                    last=with_query(copy.deepcopy(run["data"]), shown, st.text))


def restore_from_url(engine: SearchEngine, history, request: gr.Request) -> Optional[Restored]:
    """Page load: when the URL carries a query (see engine.share), restore it and run it; None leaves the
    page as it is (no query in the URL, or one that cannot be opened: a warning says why)."""
    params = dict(request.query_params) if request is not None else {}
    try:
        st = from_query_string(params)
        return None if st is None else run_state(engine, st, history)
    except Exception as exc:
        msg = plain_message(exc)
        if isinstance(exc, EngineError):
            log.warning("user mistake: could not open a link: %s", msg)
        gr.Warning(f"Could not open this link: {html.escape(msg, quote=False)}")
        return None


def rerun_history(engine: SearchEngine, history, index) -> Optional[Restored]:
    """A click on a history entry reruns that query (None: not an entry, nothing changes)."""
    if index is None or not history or not 0 <= int(index) < len(history):
        return None
    st = from_query_string(history[int(index)]["qs"])
    return run_state(engine, st, history)


EXPORT_TTL_S = 3600


def _export_folder() -> Path:
    """A fresh folder for one export; exports older than an hour are removed (Gradio keeps its own copy)."""
    root = Path(tempfile.gettempdir()) / "cis-exports"
    root.mkdir(exist_ok=True)
    now = time.time()
    for old in root.iterdir():
        try:
            if now - old.stat().st_mtime > EXPORT_TTL_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return Path(tempfile.mkdtemp(dir=root))


def export_json_file(engine: SearchEngine, data):
    """The last results as a JSON file (same schema as `python -m engine search --json`, or the compare JSON)."""
    from engine.export import export_json

    if not data:
        raise EngineError("nothing to export yet: run a search first")
    folder = _export_folder()
    stem = "compare" if "columns" in data else "results"
    if isinstance(data.get("asked"), dict):  # the server's file path stays on the server
        data = {**data, "asked": {k: v for k, v in data["asked"].items() if k != "image_file"}}
    return str(export_json(data, folder / f"{stem}.json"))


def export_png_file(engine: SearchEngine, data):
    """The last results as a contact-sheet PNG (rank, score and caption under each image)."""
    from engine.export import export_contact_sheet

    if not data:
        raise EngineError("nothing to export yet: run a search first")
    folder = _export_folder()
    stem = "compare" if "columns" in data else "results"
    return str(export_contact_sheet(data, engine.index.display_path, folder / f"{stem}-contact-sheet.png"))


def compare_cleared(run):
    """After a compare run: the single-method gallery is emptied and hidden, the explanation summarises the run."""
    data = run.get("data") if isinstance(run, dict) else {}
    return gr.update(value=[], visible=False), [], compare_summary_markdown(data or {})


def search_shown():
    """After a single-method search: the compare columns are cleared and the results gallery shown."""
    return "", gr.update(visible=True)


def url_restorer(engine: SearchEngine):
    """The page-load handler (a closure: Gradio finds the gr.Request parameter by its type hint)."""

    def restore(history, request: gr.Request):
        return restore_from_url(engine, history, request)

    return restore
