"""Event handlers: plain functions from UI values to UI values. They call the engine's one `search`."""
import functools
import json
from typing import Optional

import gradio as gr

from engine.errors import EngineError
from engine.search import SearchEngine, search
from engine.service import build_session_engine, drop_session_engine

from .formatting import backbone_markdown, esc, explanation_markdown, gallery_items


def user_errors(fn):
    """Show engine errors as a clear message in the page instead of a stack trace."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EngineError as exc:
            raise gr.Error(str(exc)) from None

    return wrapper


def expansion_name(lattqe_on: bool, expander: Optional[str]) -> str:
    if lattqe_on:
        return "lattqe"
    return expander or "none"


def run_search(engine: SearchEngine, image, text, method, alpha, k, lattqe_on, expander, nqe):
    """Returns (gallery items, explanation markdown, results JSON, result ids)."""
    if engine is None:
        raise EngineError("index a zip of photos first")
    resp = search(engine, image=image or None, text=text, method=method, alpha=float(alpha), k=int(k),
                  expand=expansion_name(bool(lattqe_on), expander), nqe=int(nqe), explain=True)
    return (gallery_items(engine, resp), explanation_markdown(resp), json.dumps(resp.to_json(), indent=2),
            [r.id for r in resp.results])


def reference_picker(engine: SearchEngine):
    """Handler for clicks on the main gallery's results."""

    def pick(ids, evt: gr.SelectData):
        return result_as_reference(engine, ids, evt)

    return pick


def result_as_reference(engine: SearchEngine, ids, evt: gr.SelectData):
    """Clicking a result makes its image the new reference."""
    if engine is None or not ids or evt is None or evt.index is None:
        return gr.update()
    i = ids[int(evt.index)]
    path = engine.index.image_path(i)
    return str(path if path.exists() else engine.index.display_path(i))


def index_upload(base: SearchEngine, old: Optional[SearchEngine], file, progress=gr.Progress()):
    """Index an uploaded zip for this session; returns (engine, status markdown)."""
    if file is None:
        raise EngineError("choose a .zip of photos to upload")
    path = file if isinstance(file, str) else getattr(file, "name", None)

    def report(done, total, stage):
        progress((done, max(total, 1)), desc=stage)

    progress(0, desc="checking the archive")
    eng = build_session_engine(path, base, progress=report)
    drop_session_engine(old)
    st = eng.index.stats()
    skipped = eng.index.meta.get("skipped", [])
    msg = f"Indexed **{st['items']}** photos with `{esc(eng.backbone.name)}`."
    if skipped:
        msg += f" Skipped {len(skipped)}: " + "; ".join(f"{esc(s['path'])} ({esc(s['reason'])})" for s in skipped[:5])
    return eng, msg


def info_markdown(engine: SearchEngine) -> str:
    return backbone_markdown(engine)
