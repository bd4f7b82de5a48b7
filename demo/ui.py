"""Page layout and event wiring. Everything that computes lives in `engine`; handlers are in handlers.py."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import gradio as gr

from engine.batching import batch_texts
from engine.config import Settings
from engine.search import SearchEngine
from engine.service import SESSIONS, drop_session_engine, load_default_engine

from . import handlers as h
from .formatting import EXPANDER_LABELS, default_method_note, method_choices
from .upload import reference_image

TITLE = "Composed image search"
INTRO = ("Give a reference image and say what to change — *same dress but red*, *the building at night* — "
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

# After a query: put its state in the page URL (keeping Gradio's own "__" parameters such as __theme) and in
# the visible share link. Inputs: (query string, current link); output: the link.
SET_URL_JS = """
(qs, current) => {
  if (!qs) { return current; }
  const link = window.location.origin + window.location.pathname + '?' + qs;
  const page = new URLSearchParams(qs);
  for (const [key, value] of new URLSearchParams(window.location.search)) {
    if (key.startsWith('__')) { page.set(key, value); }
  }
  try { window.history.replaceState(null, '', window.location.pathname + '?' + page.toString()); } catch (e) {}
  return link;
}
"""

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


def _search_controls(engine: SearchEngine, prefix: str, with_compare: bool = False, with_picker: bool = False):
    """The inputs, buttons and result panels of one search tab; returns them as attributes of a namespace."""
    from types import SimpleNamespace

    c = SimpleNamespace(compare_btn=None, compare_out=None, picker=None)
    methods = method_choices(engine)
    default_method = engine.default_method  # chosen on held-out-domain validation (engine.defaults); CLI and API alike
    with gr.Row(elem_id=f"{prefix}controls"):
        with gr.Column(scale=1, min_width=240):
            c.image = reference_image(int(engine.settings.max_upload_mb * 1e6), label="Reference image",  # no decode
                               sources=["upload", "clipboard"], height=260, elem_id=f"{prefix}reference")
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
                c.k = gr.Slider(1, h.UI_MAX_K, value=12, step=1, label="Results (top-k)", elem_id=f"{prefix}k")
            gr.Markdown(default_method_note(engine), elem_id=f"{prefix}method-why", elem_classes=["cis-note"])
            # α is the weighted sum's text weight; methods that ignore it hide it (h.alpha_visible)
            c.alpha = gr.Slider(0, 1, value=0.5, step=0.05, label="α (text weight, weighted sum)",
                                visible=h.alpha_visible(engine, default_method), elem_id=f"{prefix}alpha")
            c.method.change(functools.partial(h.alpha_shown, engine), [c.method], [c.alpha], api_name=False,
                            show_progress="hidden")
            lattqe_reason = engine.expanders_unavailable.get("lattqe")
            c.lattqe = gr.Checkbox(value=False, label="LAttQE expansion", interactive=lattqe_reason is None,
                                   info=h.lattqe_info(engine), elem_id=f"{prefix}lattqe")
            # what LAttQE (or another expansion) did for the last query: expanded with which neighbours, or kept it
            c.lattqe_did = gr.Markdown("", visible=False, elem_id=f"{prefix}lattqe-did", elem_classes=["cis-note"])
            c.keep_out = gr.Checkbox(value=True, label="Leave the reference out of its results",
                                     info="a gallery photo used as the reference is not shown as its own match",
                                     elem_id=f"{prefix}exclude-reference")
            with gr.Accordion("Expansion options", open=False):
                others = [(EXPANDER_LABELS.get(n, n), n) for n in engine.expanders if n != "lattqe"]
                c.expander = gr.Dropdown(others, value="none", label="Expansion (when LAttQE is off)",
                                         info=h.EXPANSION_HELP, elem_id=f"{prefix}expander")
                c.nqe = gr.Slider(0, h.UI_MAX_NQE, value=0, step=1, label="nQE (neighbours used)",
                                  info="0 = automatic: chosen on validation, capped by gallery size",
                                  elem_id=f"{prefix}nqe")
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
    return c


def _gallery_picker(engine: SearchEngine):
    """A browsable, searchable grid of the gallery; a click makes the image the reference (wired by the caller)."""
    from types import SimpleNamespace

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
                   trigger_mode="always_last", show_progress="hidden")
    p.prev.click(h.browse_page(engine, -1), [p.query, p.page], outs, api_name=False, show_progress="hidden")
    p.next.click(h.browse_page(engine, +1), [p.query, p.page], outs, api_name=False, show_progress="hidden")
    return p


def _prepare_status(engine: SearchEngine, method, lattqe) -> None:
    """CIS_PREPARE: a status line fed by engine.background; the method list and LAttQE box follow it."""
    from engine.background import start_for

    bg = start_for(engine)
    if bg is None:
        return
    line = gr.Markdown(bg.markdown(), elem_id="prepare-status")

    def tick():
        reason = engine.expanders_unavailable.get("lattqe")
        return (bg.markdown(), gr.update(choices=method_choices(engine)),
                gr.update(interactive=reason is None, info=h.lattqe_info(engine)))

    gr.Timer(3).tick(tick, None, [line, method, lattqe], api_name=False, show_progress="hidden")


def build_demo(settings: Optional[Settings] = None, engine: Optional[SearchEngine] = None) -> gr.Blocks:
    settings = settings or Settings()
    engine = engine or load_default_engine(settings)
    # uploads and generated files in Gradio's cache are deleted after an hour (checked every hour)
    # Every kind of search (button, Enter, an example, a history rerun, the own-photos tab) shares one pool of
    # CIS_CONCURRENCY workers (separate per-event limits would add up to several times it). Default 8 on 2
    # cores, measured (docs/deploy.md, "Load test"): searches running together share text forward passes
    # (engine/batching.py), so 8 served more than 4 (21-27 against 18-21 requests/s at 20 clients) for about
    # 90 MB more memory.
    searches = {"concurrency_id": "search", "concurrency_limit": max(1, settings.concurrency)}
    with gr.Blocks(title=TITLE, delete_cache=(3600, 3600), analytics_enabled=False) as demo:
        gr.Markdown(f"# {TITLE}\n{INTRO}")
        gr.Markdown(h.summary_markdown(engine), elem_id="plain-summary")
        with gr.Accordion("About this engine", open=False, elem_id="about"):
            gr.Markdown(h.info_markdown(engine), elem_id="backbone-info")
        with gr.Tabs():
            with gr.Tab("Search the gallery", id="main"):
                examples = h.example_queries(engine)
                ex_grid = None
                if examples:
                    gr.Markdown("**Try one:** click an example to run it", elem_id="examples-title")
                    ex_grid = gr.Gallery(h.example_items(engine, examples), show_label=False, columns=len(examples),
                                         height="auto", allow_preview=False, elem_id="examples", buttons=[],
                                         elem_classes=["cis-grid"], object_fit="contain")
                c = _search_controls(engine, "", with_compare=True, with_picker=True)
                image, text, method, alpha, k = c.image, c.text, c.method, c.alpha, c.k
                lattqe, expander, nqe, keep_out = c.lattqe, c.expander, c.nqe, c.keep_out
                gallery, explanation, raw, ids, compare_out = c.gallery, c.explanation, c.raw, c.ids, c.compare_out
                _prepare_status(engine, method, lattqe)
                with gr.Row(elem_id="share-row"):
                    share_link = gr.Textbox(label="Link to this query", interactive=False, elem_id="share-link",
                                            placeholder="run a search to get a shareable link", scale=4,
                                            min_width=220)
                    copy_btn = gr.Button("Copy link", elem_id="copy-link", scale=1, min_width=120)
                with gr.Row(elem_id="export-row"):
                    export_json_btn = gr.Button("Download JSON", elem_id="export-json", min_width=140)
                    export_png_btn = gr.Button("Download contact sheet (PNG)", elem_id="export-png", min_width=200)
                    # shown only once an export exists (handlers.shown_file)
                    export_file = gr.File(label="Download", elem_id="export-file", interactive=False, min_width=200,
                                          visible=False)
                history_ds = gr.Dataset(components=["textbox", "textbox"], samples=[], type="index",
                                        label="Recent queries", headers=["Recent queries (click to rerun)", "Method"],
                                        elem_id="history", layout="table", samples_per_page=10)
                qs = gr.Textbox(visible=False, elem_id="share-qs")
                history = gr.State([])
                last = gr.State(None)

                inputs = [image, text, method, alpha, k, lattqe, expander, nqe]
                outputs = [gallery, explanation, raw, ids]
                search_fn = h.user_errors(functools.partial(h.run_search, engine))
                after_search = functools.partial(h.after_query, engine, "search")
                after_compare = functools.partial(h.after_query, engine, "compare")
                post = [qs, history, history_ds, last]

                def then_search(event):
                    """The rest of a search once its inputs are set: results, history, share link."""
                    return (event.success(after_search, inputs + [raw, history], post, api_name=False)
                            .success(h.expansion_done, [raw], [c.lattqe_did], api_name=False, show_progress="hidden")
                            .success(h.search_shown, None, [compare_out, gallery], api_name=False,
                                      show_progress="hidden")
                            .success(None, [qs, share_link], share_link, js=SET_URL_JS, api_name=False))

                for trigger, api in ((c.button.click, "search"), (text.submit, False)):
                    then_search(trigger(search_fn, inputs + [keep_out], outputs, api_name=api, **searches))
                if ex_grid is not None:  # a click on an example fills the inputs and runs it
                    then_search(ex_grid.select(h.example_picker(engine, examples), None, [image, text], api_name=False)
                                .success(search_fn, inputs + [keep_out], outputs, api_name=False, **searches))
                compare_fn = h.user_errors(functools.partial(h.run_compare, engine))
                (c.compare_btn.click(compare_fn, [image, text, alpha, k, lattqe, nqe, keep_out], [compare_out, raw],
                                     api_name="compare", concurrency_limit=2)
                 .success(after_compare, inputs + [raw, history], post, api_name=False)
                 .success(h.compare_cleared, [raw], [gallery, ids, explanation], api_name=False,
                          show_progress="hidden")
                 .success(lambda: gr.update(value="", visible=False), None, [c.lattqe_did], api_name=False,
                          show_progress="hidden")
                 .success(None, [qs, share_link], share_link, js=SET_URL_JS, api_name=False))
                gallery.select(h.reference_picker(engine), [ids], image, api_name=False)
                c.picker.grid.select(h.reference_picker(engine), [c.picker.ids], image, api_name=False)
                restore_outputs = [image, text, method, alpha, k, lattqe, expander, nqe, gallery, explanation, raw, ids,
                                   compare_out, qs, history, history_ds, last]
                assert len(restore_outputs) == h.N_RESTORE_OUTPUTS
                (demo.load(h.url_restorer(engine), [history], restore_outputs, api_name=False)
                 .success(h.expansion_done, [raw], [c.lattqe_did], api_name=False, show_progress="hidden")
                 .success(None, [qs, share_link], share_link, js=SET_URL_JS, api_name=False))
                (history_ds.click(h.user_errors(functools.partial(h.rerun_history, engine)), [history, history_ds],
                                  restore_outputs, api_name=False, **searches)
                 .success(h.expansion_done, [raw], [c.lattqe_did], api_name=False, show_progress="hidden")
                 .success(None, [qs, share_link], share_link, js=SET_URL_JS, api_name=False))
                copy_btn.click(None, [share_link], None, js=COPY_JS, api_name=False)
                export_json_btn.click(h.user_errors(h.shown_file(functools.partial(h.export_json_file, engine))), [last],
                                      export_file, api_name=False)
                export_png_btn.click(h.user_errors(h.shown_file(functools.partial(h.export_png_file, engine))), [last],
                                     export_file, api_name=False)
            with gr.Tab("Search your own photos", id="own"):
                gr.Markdown("Upload a **.zip** of photos (jpg, png, webp, bmp, tiff, gif). They are indexed for "
                            "this session only and deleted when you leave.")
                session = gr.State(None, delete_callback=drop_session_engine)
                with gr.Row():
                    upload = gr.File(label="Zip of photos", file_types=[".zip"], elem_id="own-upload")
                    with gr.Column():
                        index_type = gr.Dropdown(h.index_type_choices(engine), value="auto", label="Index",
                                                 info="ICS: compact binary codes (docs/ics.md)",
                                                 elem_id="own-index-type")
                        index_btn = gr.Button("Index the photos", elem_id="own-index")
                status = gr.Markdown(elem_id="own-status")
                with gr.Accordion("Pick the reference from your photos", open=True, elem_id="own-picker-box"):
                    own_grid = gr.Gallery([], columns=6, height="auto", allow_preview=False, show_label=False,
                                          elem_id="own-picker", buttons=[], elem_classes=["cis-grid"],
                                          object_fit="cover")
                own_ids = gr.State([])
                o = _search_controls(engine, "own-")
                o_image, o_text, o_method, o_alpha, o_k = o.image, o.text, o.method, o.alpha, o.k
                o_lattqe, o_expander, o_nqe, o_keep_out = o.lattqe, o.expander, o.nqe, o.keep_out
                o_button, o_gallery, o_expl, o_raw, o_ids = o.button, o.gallery, o.explanation, o.raw, o.ids
                (index_btn.click(h.user_errors(functools.partial(h.index_upload, engine)), [session, upload, index_type],
                                 [session, status], api_name="index_zip", concurrency_limit=1)
                 .success(h.own_photos, [session], [own_grid, own_ids], api_name=False))
                own_grid.select(h.result_as_reference, [session, own_ids], o.image, api_name=False)
                o_inputs = [session, o_image, o_text, o_method, o_alpha, o_k, o_lattqe, o_expander, o_nqe, o_keep_out]
                o_outputs = [o_gallery, o_expl, o_raw, o_ids]
                for trigger, api in ((o_button.click, "search_own"), (o_text.submit, False)):
                    (trigger(h.user_errors(h.run_search), o_inputs, o_outputs, api_name=api, **searches)
                     .success(h.expansion_done, [o_raw], [o.lattqe_did], api_name=False, show_progress="hidden"))
                o_gallery.select(h.result_as_reference, [session, o_ids], o_image, api_name=False)
    # Queue: each event runs at most its `concurrency_limit` jobs at once (events without one: CIS_CONCURRENCY);
    # at most CIS_QUEUE_MAX jobs wait. Beyond that the page shows Gradio's "This application is currently busy.
    # Please try again." and API clients get HTTP 503 "Queue is full" instead of an ever longer wait.
    demo.queue(max_size=max(1, settings.queue_max), default_concurrency_limit=max(1, settings.concurrency),
               status_update_rate="auto", api_open=False)
    # concurrent searches (page, Gradio API, POST /api/search) encode their texts in shared forward passes
    if settings.text_batch > 1:  # CIS_TEXT_BATCH=1: every search encodes its own text
        batch_texts(engine.backbone, settings.text_batch)
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
