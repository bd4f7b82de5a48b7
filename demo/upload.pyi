"""The reference-image input: a ``gr.Image`` whose preprocess never decodes a pixel.

``gr.Image`` decodes a ``data:`` URL (and re-saves it) before the handler runs, so a tiny request could
make the server decode a 12000x12000 image before any of the app's limits applied. This component hands
the handler a file path instead, whatever brought the image: an upload's path as it came, or a ``data:``
URL's bytes written to a file after its size is checked (no decoding). The handler then runs the one
bounded decoder (``engine.images.load_image``) with the app's limits.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from pathlib import Path

import gradio as gr

log = logging.getLogger(__name__)
EXTENSIONS = {"image/jpeg": ".jpg", "image/png": ".png", "image/webp": ".webp", "image/gif": ".gif",
              "image/bmp": ".bmp", "image/tiff": ".tif"}


def refuse(message: str) -> gr.Error:
    """A user's mistake: one sentence on the page, one line in the log, no traceback."""
    log.info("refused a reference image: %s", message)
    return gr.Error(message, print_exception=False)


def data_url_to_file(url: str, folder: str, max_bytes: int) -> str:
    """The bytes of a ``data:`` URL written to a file under ``folder`` (named by their hash); refuses, in one
    sentence, a URL over ``max_bytes`` (checked on its length before decoding) or one that is not base64."""
    head, sep, body = url.partition(",")
    if not sep or ";base64" not in head:
        raise refuse("the image data URL is not base64-encoded")
    if len(body) > max_bytes * 4 // 3 + 4:
        raise refuse(f"the image is over {max_bytes / 1e6:g} MB; the limit is {max_bytes / 1e6:g} MB")
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise refuse("the image data URL is not valid base64") from None
    if not data:
        raise refuse("the image is empty")
    digest = hashlib.sha256(data).hexdigest()
    mime = head[len("data:"):].split(";", 1)[0].strip().lower()
    out = Path(folder) / digest[:32] / ("image" + EXTENSIONS.get(mime, ".img"))
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        tmp = out.with_suffix(out.suffix + ".part")
        tmp.write_bytes(data)
        tmp.replace(out)
    return str(out)

from gradio.events import Dependency

class ReferenceImage(gr.Image):
    """``gr.Image(type="filepath")`` that passes a path without opening the file (``max_bytes`` bounds a
    ``data:`` URL; set it from the settings, as :func:`reference_image` does)."""

    is_template = True  # the page draws it with gr.Image's own frontend (Blocks.get_block_name)
    max_bytes = 20_000_000

    def preprocess(self, payload):
        if payload is None:
            return None
        url = getattr(payload, "url", None) or ""
        if url.startswith("data:"):
            return data_url_to_file(url, self.GRADIO_CACHE, self.max_bytes)
        if not payload.path:
            raise refuse("no image was received")
        return str(payload.path)
    from typing import Callable, Literal, Sequence, Any, TYPE_CHECKING
    from gradio.blocks import Block
    if TYPE_CHECKING:
        from gradio.components import Timer
        from gradio.components.base import Component


def reference_image(max_bytes: int, **kwargs) -> ReferenceImage:
    """The reference input of a search tab: a file path reaches the handler, never decoded pixels."""
    kwargs.setdefault("type", "filepath")
    kwargs.setdefault("image_mode", None)
    comp = ReferenceImage(**kwargs)
    comp.max_bytes = int(max_bytes)
    return comp
class QuerySlider(gr.Slider):
    """``gr.Slider`` whose value reaches the handler unchecked: its range is the query's limits
    (engine.query), and the one validation (``SearchRequest.build``) clamps an out-of-range value with a
    notice, as on every other route, instead of Gradio refusing it in words of its own ("Value 100000 is
    greater than maximum value ...") on the Gradio API only."""

    is_template = True  # drawn with gr.Slider's own frontend (Blocks.get_block_name)

    def preprocess(self, payload):
        return payload
    from typing import Callable, Literal, Sequence, Any, TYPE_CHECKING
    from gradio.blocks import Block
    if TYPE_CHECKING:
        from gradio.components import Timer
        from gradio.components.base import Component

    
class QueryNumber(gr.Number):
    """``gr.Number`` with no bounds of its own, whose value reaches the handler unchecked: a slider's (or a
    bounded number box's) frontend clamps a typed -5 to its minimum without a word, and Gradio refuses an API
    value out of range in words of its own ("Value 100000 is greater than maximum value ..."). Here the one
    validation (``engine.query.SearchRequest.build``) clamps it and says so, as on every other route; the
    limits are in the box's ``info``."""

    is_template = True  # drawn with gr.Number's own frontend (Blocks.get_block_name)

    def preprocess(self, payload):
        return payload
    from typing import Callable, Literal, Sequence, Any, TYPE_CHECKING
    from gradio.blocks import Block
    if TYPE_CHECKING:
        from gradio.components import Timer
        from gradio.components.base import Component

    