"""Page layout and event wiring. Everything that computes lives in `engine`; handlers are in handlers.py."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import gradio as gr

from engine.config import Settings
from engine.search import SearchEngine
from engine.service import drop_session_engine, load_default_engine, sessions_dir

from . import handlers as h
from .formatting import EXPANDER_LABELS, method_choices

TITLE = "Composed image search"
INTRO = ("Give a reference image and say what to change — *same dress but red*, *the building at night* — "
         "and the engine finds matching images in the gallery. Click a result to use it as the new reference.")
CSS = """
#results .caption-label { white-space: normal; }
@media (max-width: 640px) { #controls { flex-direction: column; } }
"""


def example_queries(engine: SearchEngine, n: int = 4):
    """A few gallery images with a modification text, for the Examples row."""
    texts = ["the same but red", "as a dog", "at night", "a bigger one"]
    picks, seen = [], set()
    for it in engine.index.items:
        top = it["path"].split("/")[0]
        if top in seen:
            continue
        seen.add(top)
        path = engine.index.image_path(it["id"])
        if path.exists():
            picks.append([str(path), texts[len(picks) % len(texts)]])
        if len(picks) >= n:
            break
    return picks


def _search_controls(engine: SearchEngine, prefix: str):
    methods = method_choices(engine)
    default_method = "sum" if "sum" in engine.composers else next(iter(engine.composers))
    with gr.Row(elem_id=f"{prefix}controls"):
        with gr.Column(scale=1, min_width=240):
            image = gr.Image(type="filepath", label="Reference image", sources=["upload", "clipboard"],
                             height=260, elem_id=f"{prefix}reference")
        with gr.Column(scale=2, min_width=280):
            text = gr.Textbox(label="What to change", placeholder="e.g. the same but red",
                              max_lines=2, elem_id=f"{prefix}text")
            with gr.Row():
                method = gr.Dropdown(methods, value=default_method, label="Method", elem_id=f"{prefix}method")
                k = gr.Slider(1, 48, value=12, step=1, label="Results (top-k)", elem_id=f"{prefix}k")
            alpha = gr.Slider(0, 1, value=0.5, step=0.05, label="α (text weight, weighted sum)")
            lattqe_reason = engine.expanders_unavailable.get("lattqe")
            lattqe = gr.Checkbox(value=False, label="LAttQE expansion", interactive=lattqe_reason is None,
                                 info=("re-forms the query from its top results" if lattqe_reason is None
                                       else f"unavailable: {lattqe_reason}"), elem_id=f"{prefix}lattqe")
            with gr.Accordion("Expansion options", open=False):
                others = [(EXPANDER_LABELS.get(n, n), n) for n in engine.expanders if n != "lattqe"]
                expander = gr.Dropdown(others, value="none", label="Expansion (when LAttQE is off)")
                nqe = gr.Slider(1, 128, value=64, step=1, label="nQE (neighbours used)")
            button = gr.Button("Search", variant="primary", elem_id=f"{prefix}search")
    gallery = gr.Gallery(label="Results", columns=4, height="auto", elem_id=f"{prefix}results",
                         allow_preview=False, object_fit="contain")
    with gr.Accordion("Why these results", open=False):
        explanation = gr.Markdown(elem_id=f"{prefix}explanation")
    with gr.Accordion("Results as JSON", open=False):
        raw = gr.Code(language="json", elem_id=f"{prefix}json", label="Same schema as `python -m engine search --json`")
    ids = gr.State([])
    return image, text, method, alpha, k, lattqe, expander, nqe, button, gallery, explanation, raw, ids


def build_demo(settings: Optional[Settings] = None, engine: Optional[SearchEngine] = None) -> gr.Blocks:
    settings = settings or Settings()
    engine = engine or load_default_engine(settings)
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"# {TITLE}\n{INTRO}")
        gr.Markdown(h.info_markdown(engine), elem_id="backbone-info")
        with gr.Tabs():
            with gr.Tab("Search the gallery", id="main"):
                (image, text, method, alpha, k, lattqe, expander, nqe, button, gallery, explanation, raw,
                 ids) = _search_controls(engine, "")
                examples = example_queries(engine)
                if examples:
                    gr.Examples(examples, inputs=[image, text], label="Try one")
                inputs = [image, text, method, alpha, k, lattqe, expander, nqe]
                outputs = [gallery, explanation, raw, ids]
                search_fn = h.user_errors(functools.partial(h.run_search, engine))
                button.click(search_fn, inputs, outputs, api_name="search", concurrency_limit=4)
                text.submit(search_fn, inputs, outputs, api_name=False, concurrency_limit=4)
                gallery.select(h.reference_picker(engine), [ids], image, api_name=False)
            with gr.Tab("Search your own photos", id="own"):
                gr.Markdown("Upload a **.zip** of photos (jpg, png, webp, bmp, tiff, gif). They are indexed for "
                            "this session only and deleted when you leave.")
                session = gr.State(None, delete_callback=drop_session_engine)
                with gr.Row():
                    upload = gr.File(label="Zip of photos", file_types=[".zip"], elem_id="own-upload")
                    index_btn = gr.Button("Index the photos", elem_id="own-index")
                status = gr.Markdown(elem_id="own-status")
                (o_image, o_text, o_method, o_alpha, o_k, o_lattqe, o_expander, o_nqe, o_button, o_gallery,
                 o_expl, o_raw, o_ids) = _search_controls(engine, "own-")
                index_btn.click(h.user_errors(functools.partial(h.index_upload, engine)), [session, upload], [session, status],
                                api_name="index_zip", concurrency_limit=1)
                o_inputs = [session, o_image, o_text, o_method, o_alpha, o_k, o_lattqe, o_expander, o_nqe]
                o_outputs = [o_gallery, o_expl, o_raw, o_ids]
                o_button.click(h.user_errors(h.run_search), o_inputs, o_outputs, api_name="search_own",
                               concurrency_limit=4)
                o_text.submit(h.user_errors(h.run_search), o_inputs, o_outputs, api_name=False)
                o_gallery.select(h.result_as_reference, [session, o_ids], o_image, api_name=False)
    demo.queue(max_size=int(settings_value("CIS_QUEUE_MAX", 64)), default_concurrency_limit=4)
    demo.cis_engine = engine
    return demo


def settings_value(name: str, default):
    import os

    return os.environ.get(name, default)


def allowed_paths(engine: SearchEngine):
    """The only folders the server may serve files from: the gallery, its thumbnails, session galleries."""
    return [str(engine.index.source), str(Path(engine.index.folder) / "thumbs"), str(sessions_dir())]
