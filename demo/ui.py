"""Page layout and event wiring. Everything that computes lives in `engine`; handlers are in handlers.py."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import gradio as gr

from engine.background import start_for
from engine.config import Settings
from engine.query import ALPHA_MAX, ALPHA_MIN, DEFAULT_ALPHA, DEFAULT_K, K_MAX, K_MIN, NQE_MAX, NQE_MIN
from engine.search import SearchEngine
from engine.service import SESSIONS, drop_session_engine, load_default_engine

from . import handlers as h
from .formatting import EXPANDER_LABELS, default_method_note, method_choices
from .upload import QueryNumber, reference_image

TITLE = "Composed image search"
INTRO = ("Give a reference image and say what to change — *the same shoes but white*, *at night*, *as a black and "
         "white photo*, *a hammer instead* — "
         "and the engine finds matching images in the gallery. Click a result to use it as the new reference.")
CSS = (Path(__file__).with_name("style.css")).read_text(encoding="utf-8")  # the page's styles, in their own file
# Passed to launch(head=...) with CSS. Gradio's client closes its event stream through a stand-in object whose
# close() only logs "Method not implemented." (a warning after every finished search, nothing wrong); that one
# message is dropped so the browser console shows only warnings that mean something.
HEAD = """<script>
(() => {
  const warn = console.warn.bind(console);
  console.warn = (...args) => {
    if (args.length === 1 && args[0] === 'Method not implemented.') { return; }
    warn(...args);
  };
})();
</script>"""

# The last step after a query: put its state in the page URL (keeping Gradio's own "__" parameters such as
# __theme) and in the visible share link. Inputs: (query string, current link); output: the link. It also counts
# the queries the page has finished showing (`data-queries-shown` on <body>; the own-photos tab:
# `data-own-queries-shown`, OWN_SHOWN_JS), so a script or test can wait for a query and every step after it,
# not merely for its first visible change (which the previous query's later steps can also make).
SET_URL_JS = """
(qs, current) => {
  if (!qs) { return current; }
  document.body.dataset.queriesShown = String(Number(document.body.dataset.queriesShown || 0) + 1);
  const link = window.location.origin + window.location.pathname + '?' + qs;
  const page = new URLSearchParams(qs);
  for (const [key, value] of new URLSearchParams(window.location.search)) {
    if (key.startsWith('__')) { page.set(key, value); }
  }
  try { window.history.replaceState(null, '', window.location.pathname + '?' + page.toString()); } catch (e) {}
  return link;
}
"""

OWN_SHOWN_JS = """
() => {
  document.body.dataset.ownQueriesShown = String(Number(document.body.dataset.ownQueriesShown || 0) + 1);
  return [];
}
"""

# Every query event and every step after it runs the user's LATEST request: Gradio's default for a click
# ("once") drops a click that comes while the same event is still running, so a second Search with a changed
# text or box showed the first query's results; "always_last" runs it as soon as the running one ends, with
# the inputs as they are then. The steps after a query (history, share link, ...) are also "always_last": a
# step still running for the previous query would otherwise skip the same step for the next one.
LATEST = "always_last"
# The keyword arguments of every step chained after a query (``event.success(fn, inputs, outputs, **CHAINED)``):
# not in the API, no progress overlay flashing over fresh results, the latest request (LATEST). One dict, so a
# new step cannot forget one of them (tests/test_page_events.py checks the built page).
CHAINED = dict(api_name=False, show_progress="hidden", trigger_mode=LATEST)

# "Copy link": the clipboard API where allowed, else select the link box and copy; the button says it worked.
COPY_JS = """
(link) => {
  const url = link || window.location.href;
  const box = document.querySelector('#share-link textarea, #share-link input');
  const done = () => {
    const b = document.querySelector('#copy-link');
    if (b) { const old = b.textContent; b.textContent = 'Copied'; setTimeout(() => { b.textContent = old; }, 1500); }
  };
  const fallback = () => { if (box) { box.select(); try { document.execCommand('copy'); done(); } catch (e) {} } };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(url).then(done, fallback);
  } else { fallback(); }
  return [];
}
"""


@dataclass
class SearchPanel:
    """The inputs, buttons and result panels of one search tab (:func:`_search_controls`)."""
    image: Any = None
    picker: Any = None  # the gallery picker (main tab only)
    text: Any = None
    button: Any = None
    compare_btn: Any = None  # main tab only
    method: Any = None
    k: Any = None
    alpha: Any = None
    lattqe: Any = None
    lattqe_did: Any = None  # what expansion did for the last query
    keep_out: Any = None
    expander: Any = None
    nqe: Any = None
    gallery: Any = None
    compare_out: Any = None  # main tab only
    explanation: Any = None
    raw: Any = None
    ids: Any = None
    run: Any = None  # state: the last run (handlers.run_record: the request as searched and its response)

    def search_inputs(self) -> list:
        """handlers.run_search's inputs in their order: the Gradio API's /search takes its values in this order
        (/search_own: the session first)."""
        return [self.image, self.text, self.method, self.alpha, self.k, self.lattqe, self.expander, self.nqe,
                self.keep_out]

    def query(self) -> dict:
        """The query's widgets by the names handlers.after_query and handlers.Restored give them."""
        return {"image": self.image, "text": self.text, "method": self.method, "alpha": self.alpha, "k": self.k,
                "lattqe_on": self.lattqe, "expander": self.expander, "nqe": self.nqe, "keep_out": self.keep_out}

    def results(self) -> dict:
        """The result panels by the names handlers.Restored gives them."""
        return {"gallery": self.gallery, "explanation": self.explanation, "raw": self.raw, "ids": self.ids,
                "compare_out": self.compare_out, "run": self.run}

    def outputs(self) -> list:
        """handlers.run_search's outputs in their order (the Gradio API returns the first three)."""
        return [self.gallery, self.explanation, self.raw, self.ids, self.run]


@dataclass
class ShareRow:
    """The main tab's share link, exports and recent queries (:func:`_share_row`)."""
    link: Any
    copy: Any
    export_json: Any
    export_png: Any
    export_file: Any
    history_table: Any
    qs: Any  # the last query's query string (hidden)
    history: Any  # state: the recent queries
    last: Any  # state: the data the export buttons write

    def recorded(self) -> dict:
        """What handlers.after_query sets (handlers.Recorded), by name."""
        return {"qs": self.qs, "history": self.history, "history_table": self.history_table, "last": self.last}


def _named(fn, result_type, outputs: dict):
    """An event handler whose outputs are named: ``fn`` returns a ``result_type`` dataclass (or None: nothing
    changes) and each field's value goes to the component of the same name in ``outputs``. Returns (the
    handler, the output components) for the event."""
    names = [f.name for f in dataclasses.fields(result_type)]
    if sorted(names) != sorted(outputs):
        raise ValueError(f"{result_type.__name__} sets {names}; the event's outputs are {list(outputs)}")

    @functools.wraps(fn)  # Gradio reads the wrapped signature (keyword inputs, gr.Request)
    def handler(*args, **kwargs):
        result = fn(*args, **kwargs)
        return {outputs[n]: gr.skip() if result is None else getattr(result, n) for n in names}

    return handler, list(outputs.values())


def _search_controls(engine: SearchEngine, prefix: str, with_compare: bool = False,
                     with_picker: bool = False) -> SearchPanel:
    """The inputs, buttons and result panels of one search tab."""
    c = SearchPanel()
    methods = method_choices(engine)
    default_method = engine.default_method  # chosen on held-out-domain validation (engine.defaults); CLI and API alike
    with gr.Row(elem_id=f"{prefix}controls"):
        with gr.Column(scale=1, min_width=240):
            c.image = reference_image(int(engine.settings.max_upload_mb * 1e6), label="Reference image",  # no decode
                                      sources=["upload", "clipboard"], height=260, elem_id=f"{prefix}reference")
            # a file that is not an image is said on upload, not only after Search (handlers.reference_checked)
            c.image.upload(h.reference_checked(engine), [c.image], [c.image], api_name=False, show_progress="hidden")
            if with_picker:
                c.picker = _gallery_picker(engine)
        with gr.Column(scale=2, min_width=280):
            c.text = gr.Textbox(label="What to change", placeholder="e.g. the same but red",
                                max_lines=2, elem_id=f"{prefix}text")
            with gr.Row(elem_classes=["cis-buttons"]):
                c.button = gr.Button("Search", variant="primary", elem_id=f"{prefix}search")
                if with_compare:
                    c.compare_btn = gr.Button("Compare methods", variant="secondary", elem_id=f"{prefix}compare")
            with gr.Row(elem_classes=["cis-method-row"]):
                c.method = gr.Dropdown(methods, value=default_method, label="Method", elem_id=f"{prefix}method",
                                       min_width=240)
                c.k = QueryNumber(DEFAULT_K, label="Number of results", info=f"{K_MIN} to {K_MAX}", step=1,
                                  precision=0, elem_id=f"{prefix}k", min_width=120)
            gr.Markdown(default_method_note(engine), elem_id=f"{prefix}method-why", elem_classes=["cis-note"])
            # α is the weighted sum's text weight; methods that ignore it hide it (h.alpha_visible)
            c.alpha = QueryNumber(DEFAULT_ALPHA, step=0.05, label="Weight of the text (α)",
                                  info=f"{ALPHA_MIN:g} (the picture only) to {ALPHA_MAX:g} (the text only)",
                                  visible=h.alpha_visible(engine, default_method), elem_id=f"{prefix}alpha")
            c.method.change(functools.partial(h.alpha_shown, engine), [c.method], [c.alpha], api_name=False,
                            show_progress="hidden")
            _expansion_controls(engine, prefix, c)
    _result_panels(prefix, with_compare, c)
    return c


def _expansion_controls(engine: SearchEngine, prefix: str, c: SearchPanel) -> None:
    """The LAttQE box with its note, the leave-the-reference-out box and the other expansion options."""
    lattqe_reason = engine.expanders_unavailable.get("lattqe")
    # not offered where validation showed it moves no answer for this backbone (engine.defaults)
    c.lattqe = gr.Checkbox(value=False, label="Refine with the top results (LAttQE)", interactive=lattqe_reason is None,
                           info=h.lattqe_info(engine), elem_id=f"{prefix}lattqe",
                           visible=lattqe_reason is not None or "lattqe" in engine.offered_expanders)
    # what LAttQE (or another expansion) did for the last query: expanded with which neighbours, or kept it
    c.lattqe_did = gr.Markdown("", visible=False, elem_id=f"{prefix}lattqe-did", elem_classes=["cis-note"])
    c.keep_out = gr.Checkbox(value=True, label="Leave the reference out of its results",
                             info="a gallery photo used as the reference is not shown as its own match",
                             elem_id=f"{prefix}exclude-reference")
    with gr.Accordion("Expansion options", open=False):
        others = [(EXPANDER_LABELS.get(n, n), n) for n in engine.offered_expanders if n != "lattqe"]
        c.expander = gr.Dropdown(others, value="none", label="Expansion (when LAttQE is off)",
                                 info=h.EXPANSION_HELP, elem_id=f"{prefix}expander")
        c.nqe = QueryNumber(0, step=1, precision=0, label="nQE (neighbours used)",
                            info=f"{NQE_MIN} (automatic: chosen on validation, capped by gallery size) to {NQE_MAX}",
                            elem_id=f"{prefix}nqe")


def _result_panels(prefix: str, with_compare: bool, c: SearchPanel) -> None:
    """Under the controls: the results grid, the compare columns, why these results, the results as JSON."""
    # captions under each picture and no inner scroll box (demo/style.css, .cis-grid)
    c.gallery = gr.Gallery(label="Results", columns=4, height="auto", elem_id=f"{prefix}results",
                           elem_classes=["cis-grid"], allow_preview=False, object_fit="contain")
    if with_compare:
        c.compare_out = gr.HTML("", elem_id=f"{prefix}compare-results", label="Compare methods")
    with gr.Accordion("Why these results", open=False):
        c.explanation = gr.Markdown(elem_id=f"{prefix}explanation")
    with gr.Accordion("Results as JSON", open=False):
        c.raw = gr.Code(language="json", elem_id=f"{prefix}json", label="Same schema as `python -m engine search --json`")
    c.ids = gr.State([])
    c.run = gr.State(None)


def _gallery_picker(engine: SearchEngine):
    """A browsable, searchable grid of the gallery; a click makes the image the reference (wired by the caller)."""
    items, ids, note, page = h.browse_gallery(engine)
    p = SimpleNamespace()
    with gr.Accordion("Pick the reference from the gallery", open=False, elem_id="picker-box"):
        p.query = gr.Textbox(label="Find in the gallery", placeholder="a word: cat, bridge, guitar…", max_lines=1,
                             elem_id="picker-filter")
        p.note = gr.Markdown(note, elem_id="picker-note", elem_classes=["cis-note"])
        p.grid = gr.Gallery(items, columns=4, height="auto", allow_preview=False, show_label=False, elem_id="picker", buttons=[],
                            elem_classes=["cis-grid"], object_fit="cover")
        with gr.Row():
            p.prev = gr.Button("◀ Previous", size="sm", elem_id="picker-prev", min_width=80)
            p.next = gr.Button("Next ▶", size="sm", elem_id="picker-next", min_width=80)
        p.ids, p.page = gr.State(ids), gr.State(page)
    outs = [p.grid, p.ids, p.note, p.page]
    p.query.change(lambda q: h.browse_gallery(engine, q, 0), [p.query], outs, api_name=False,
                   trigger_mode=LATEST, show_progress="hidden")
    p.prev.click(h.browse_page(engine, -1), [p.query, p.page], outs, api_name=False, show_progress="hidden")
    p.next.click(h.browse_page(engine, +1), [p.query, p.page], outs, api_name=False, show_progress="hidden")
    return p


def _prepare_status(engine: SearchEngine, method, lattqe) -> None:
    """CIS_PREPARE: a status line fed by engine.background; the method list and LAttQE box follow it."""
    bg = start_for(engine)
    if bg is None:
        return
    line = gr.Markdown(bg.markdown(), elem_id="prepare-status")

    def tick():
        reason = engine.expanders_unavailable.get("lattqe")
        return (bg.markdown(), gr.update(choices=method_choices(engine)),
                gr.update(interactive=reason is None, info=h.lattqe_info(engine)))

    gr.Timer(3).tick(tick, None, [line, method, lattqe], api_name=False, show_progress="hidden")


def _header(engine: SearchEngine) -> None:
    """Title, introduction, the plain line about what is searched, and "About this engine"."""
    gr.Markdown(f"# {TITLE}\n{INTRO}")
    gr.Markdown(h.summary_markdown(engine), elem_id="plain-summary")
    with gr.Accordion("About this engine", open=False, elem_id="about"):
        gr.Markdown(h.info_markdown(engine), elem_id="backbone-info")


def _examples(engine: SearchEngine):
    """The "Try one" row: (examples, their grid), or (examples, None) when the gallery has none."""
    examples = h.example_queries(engine)
    if not examples:
        return examples, None
    gr.Markdown("**Try one:** click an example to run it", elem_id="examples-title")
    grid = gr.Gallery(h.example_items(engine, examples), show_label=False, columns=len(examples),
                      height="auto", allow_preview=False, elem_id="examples", buttons=[],
                      elem_classes=["cis-grid"], object_fit="contain")
    return examples, grid


def _share_row() -> ShareRow:
    """The share link with its copy button, the export buttons and the recent queries."""
    with gr.Row(elem_id="share-row"):
        link = gr.Textbox(label="Link to this query", interactive=False, elem_id="share-link",
                          placeholder="run a search to get a shareable link", scale=4, min_width=220)
        copy = gr.Button("Copy link", elem_id="copy-link", scale=1, min_width=120)
    with gr.Row(elem_id="export-row"):
        export_json = gr.Button("Download JSON", elem_id="export-json", min_width=140)
        export_png = gr.Button("Download contact sheet (PNG)", elem_id="export-png", min_width=200)
        # shown only once an export exists (handlers.shown_file)
        export_file = gr.File(label="Download", elem_id="export-file", interactive=False, min_width=200,
                              visible=False)
    history_table = gr.Dataset(components=["textbox", "textbox"], samples=[], type="index",
                               label="Recent queries", headers=["Recent queries (click to rerun)", "Method"],
                               elem_id="history", layout="table", samples_per_page=10)
    qs = gr.Textbox(visible=False, elem_id="share-qs")
    return ShareRow(link, copy, export_json, export_png, export_file, history_table, qs, gr.State([]),
                    gr.State(None))


def _with_link(event, s: ShareRow):
    """The last step after a query: the page URL and the share link carry it (SET_URL_JS)."""
    return event.success(None, [s.qs, s.link], s.link, js=SET_URL_JS, **CHAINED)


def _with_expansion_note(event, c: SearchPanel):
    """The line under the LAttQE box: what expansion did for the query just run; and the number boxes show the
    values searched (a clamped one, already said in a notice)."""
    shown = event.success(h.searched_values, [c.run], [c.k, c.alpha, c.nqe], **CHAINED)
    return shown.success(h.expansion_done, [c.run], [c.lattqe_did], **CHAINED)


def _recorded(event, engine: SearchEngine, c: SearchPanel, s: ShareRow):
    """After a run (search or compare: the run's state says which): handlers.after_query, by name."""
    record, outputs = _named(functools.partial(h.after_query, engine), h.Recorded, s.recorded())
    return event.success(record, inputs_kwargs={"run": c.run, "history": s.history}, outputs=outputs, **CHAINED)


def _main_tab(demo: gr.Blocks, engine: SearchEngine, searches: dict) -> None:
    """The "Search the gallery" tab: examples, the search panel with its picker, share / export / history."""
    examples, ex_grid = _examples(engine)
    c = _search_controls(engine, "", with_compare=True, with_picker=True)
    _prepare_status(engine, c.method, c.lattqe)
    s = _share_row()
    _wire_search(engine, c, s, searches, examples, ex_grid)
    _wire_compare(engine, c, s)
    c.gallery.select(h.reference_picker(engine), [c.ids], c.image, api_name=False)
    c.picker.grid.select(h.reference_picker(engine), [c.picker.ids], c.image, api_name=False)
    _wire_restore(demo, engine, c, s, searches)
    _wire_share_export(engine, s)


def _wire_search(engine: SearchEngine, c: SearchPanel, s: ShareRow, searches: dict, examples, ex_grid) -> None:
    """A search (the button: the Gradio API's /search; Enter; a click on an example), then what it leaves in
    the page: history and export data, the expansion note, the single-method view, the share link."""
    search_fn = h.user_errors(functools.partial(h.run_search, engine))
    results = c.outputs()

    def then_search(event):
        shown = _with_expansion_note(_recorded(event, engine, c, s), c)
        return _with_link(shown.success(h.search_shown, None, [c.compare_out, c.gallery], **CHAINED), s)

    for trigger, api in ((c.button.click, "search"), (c.text.submit, False)):
        then_search(trigger(search_fn, c.search_inputs(), results, api_name=api, **searches))
    if ex_grid is not None:  # a click on an example fills the inputs and runs it
        then_search(ex_grid.select(h.example_picker(engine, examples), None, [c.image, c.text], api_name=False,
                                   trigger_mode=LATEST)
                    .success(search_fn, c.search_inputs(), results, api_name=False, **searches))


def _wire_compare(engine: SearchEngine, c: SearchPanel, s: ShareRow) -> None:
    """Compare methods (the Gradio API's /compare, its own limit of 2 at once), then the page shows its columns."""
    compare_fn = h.user_errors(functools.partial(h.run_compare, engine))
    ran = c.compare_btn.click(compare_fn, [c.image, c.text, c.alpha, c.k, c.lattqe, c.nqe, c.keep_out],
                              [c.compare_out, c.raw, c.run], api_name="compare", concurrency_limit=2,
                              trigger_mode=LATEST)
    shown = (_recorded(ran, engine, c, s)
             .success(h.compare_cleared, [c.run], [c.gallery, c.ids, c.explanation], **CHAINED)
             .success(lambda: gr.update(value="", visible=False), None, [c.lattqe_did], **CHAINED)
             .success(h.searched_values, [c.run], [c.k, c.alpha, c.nqe], **CHAINED))
    _with_link(shown, s)


def _wire_restore(demo: gr.Blocks, engine: SearchEngine, c: SearchPanel, s: ShareRow, searches: dict) -> None:
    """A query restored into the page and run (handlers.Restored, by name): from the URL when the page
    loads, or on a click on a recent query."""
    outputs = {**c.query(), **c.results(), **s.recorded()}
    restore, restored = _named(h.url_restorer(engine), h.Restored, outputs)
    _with_link(_with_expansion_note(demo.load(restore, [s.history], restored, api_name=False), c), s)
    rerun, _ = _named(h.user_errors(functools.partial(h.rerun_history, engine)), h.Restored, outputs)
    clicked = s.history_table.click(rerun, [s.history, s.history_table], restored, api_name=False, **searches)
    _with_link(_with_expansion_note(clicked, c), s)


def _wire_share_export(engine: SearchEngine, s: ShareRow) -> None:
    """Copy link (in the browser), and the two downloads of the last results."""
    s.copy.click(None, [s.link], None, js=COPY_JS, api_name=False)
    for button, export in ((s.export_json, h.export_json_file), (s.export_png, h.export_png_file)):
        button.click(h.user_errors(h.shown_file(functools.partial(export, engine))), [s.last], s.export_file,
                     api_name=False)


def _own_tab(engine: SearchEngine, searches: dict) -> None:
    """The "Search your own photos" tab: a zip indexed for this session (the Gradio API's /index_zip), its
    photos to pick from, and a search panel over them (/search_own)."""
    gr.Markdown("Upload a **.zip** of photos (jpg, png, webp, bmp, tiff, gif). They are indexed for "
                "this session only and deleted when you leave.")
    session = gr.State(None, delete_callback=drop_session_engine)
    with gr.Row():
        upload = gr.File(label="Zip of photos", file_types=[".zip"], elem_id="own-upload")
        with gr.Column():
            index_type = gr.Dropdown(h.index_type_choices(engine), value="auto", label="Index",
                                     info="ICS: compact binary codes, a fraction of the memory and a little less exact", elem_id="own-index-type")
            index_btn = gr.Button("Index the photos", elem_id="own-index")
    status = gr.Markdown(elem_id="own-status")
    with gr.Accordion("Pick the reference from your photos", open=True, elem_id="own-picker-box"):
        own_grid = gr.Gallery([], columns=6, height="auto", allow_preview=False, show_label=False,
                              elem_id="own-picker", buttons=[], elem_classes=["cis-grid"], object_fit="cover")
    own_ids = gr.State([])
    o = _search_controls(engine, "own-")
    (index_btn.click(h.user_errors(functools.partial(h.index_upload, engine)), [session, upload, index_type],
                     [session, status], api_name="index_zip", concurrency_limit=1)
     .success(h.own_photos, [session], [own_grid, own_ids], api_name=False))
    own_grid.select(h.result_as_reference, [session, own_ids], o.image, api_name=False)
    for trigger, api in ((o.button.click, "search_own"), (o.text.submit, False)):
        shown = _with_expansion_note(trigger(h.user_errors(h.run_search), [session, *o.search_inputs()],
                                             o.outputs(), api_name=api, **searches), o)
        shown.success(None, None, None, js=OWN_SHOWN_JS, **CHAINED)
    o.gallery.select(h.result_as_reference, [session, o.ids], o.image, api_name=False)


def build_demo(settings: Settings, engine: Optional[SearchEngine] = None) -> gr.Blocks:
    """The page: a header, the "Search the gallery" tab (:func:`_main_tab`) and the "Search your own photos"
    tab (:func:`_own_tab`) on one queue. Without ``engine``, the gallery's engine is loaded here
    (engine.service.load_default_engine, which also gives its backbone the text micro-batcher). ``settings``:
    the entry point's (app.py builds one)."""
    engine = engine or load_default_engine(settings)
    # Every kind of search (button, Enter, an example, a history rerun, the own-photos tab) shares one pool of
    # CIS_CONCURRENCY workers (separate per-event limits would add up to several times it). Default 8 on 2
    # cores, measured (docs/deploy.md, "Load test"): searches running together share text forward passes
    # (engine/batching.py), so 8 served more than 4 (21-27 against 18-21 requests/s at 20 clients) for about
    # 90 MB more memory.
    searches = {"concurrency_id": "search", "concurrency_limit": max(1, settings.concurrency), "trigger_mode": LATEST}
    # uploads and generated files in Gradio's cache are deleted after an hour (checked every hour)
    with gr.Blocks(title=TITLE, delete_cache=(3600, 3600), analytics_enabled=False) as demo:
        _header(engine)
        with gr.Tabs():
            with gr.Tab("Search the gallery", id="main"):
                _main_tab(demo, engine, searches)
            with gr.Tab("Search your own photos", id="own"):
                _own_tab(engine, searches)
    # Queue: each event runs at most its `concurrency_limit` jobs at once (events without one: CIS_CONCURRENCY);
    # at most CIS_QUEUE_MAX jobs wait. Beyond that the page shows Gradio's "This application is currently busy.
    # Please try again." and API clients get HTTP 503 "Queue is full" instead of an ever longer wait.
    demo.queue(max_size=max(1, settings.queue_max), default_concurrency_limit=max(1, settings.concurrency),
               status_update_rate="auto", api_open=False)
    SESSIONS.start_janitor(engine.settings)  # sweeps session folders left by an earlier server, then periodically
    # The gallery and its thumbnails are served from where they are (static paths): results, examples and
    # the picker then cost no hash-and-copy into Gradio's cache per image and request, and no cached copy
    # can be swept away between a reply and the browser's fetch. These are the folders allowed_paths
    # already lists, so nothing more is reachable.
    gr.set_static_paths(allowed_paths(engine))
    return demo


def allowed_paths(engine: SearchEngine):
    """The only folders the server may serve files from: the gallery and its thumbnails.

    Nothing else (not the repository, the index files or the checkpoints) is listed; Gradio also serves
    its own cache of uploads and outputs, where uploaded galleries' result thumbnails are copied (their
    session folders, with photos, embeddings and metadata, are never served). Paths are resolved so that
    `..` or links cannot widen them."""
    out = []
    for p in (Path(engine.index.source), Path(engine.index.folder) / "thumbs"):
        p = str(p.resolve())
        if p not in out:
            out.append(p)
    return out
