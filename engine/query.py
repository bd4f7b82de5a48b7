"""One query: :class:`SearchRequest`, built and read by every route, and its one validation.

The page, the Gradio API (``/search``, ``/compare``), the JSON route (``POST /api/search``), the CLI
(``search``, ``compare``), share links, the page's history and compare mode all turn what they received into
a ``SearchRequest`` with :meth:`SearchRequest.build`, and every search runs from it
(:func:`engine.search.run`). So every route has the same limits and says the same sentence:

- ``k`` (results), ``alpha`` (text weight) and ``nqe`` (neighbours for expansion) that are numbers but out of
  range are **clamped to the nearest limit and the clamp is said**: the request carries a notice, which the
  response repeats (``notices``), never silently;
- a value that is not a number, a text over the length limit, a flag that is not true or false is refused
  with one sentence (:class:`~engine.errors.InputError`), naming the field and its limits.

The reference rule is part of the query: ``keep_reference`` (off by default, the CIRR convention) keeps a
gallery photo used as the reference among its own results.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, List, Optional

from .config import MAX_K
from .errors import InputError

K_MIN, K_MAX = 1, MAX_K
ALPHA_MIN, ALPHA_MAX = 0.0, 1.0
NQE_MIN, NQE_MAX = 0, 512  # 0: automatic (chosen on validation, capped by the gallery size; engine.defaults)
DEFAULT_K, DEFAULT_ALPHA = 12, 0.5
MAX_TEXT_CHARS = 1000  # the default of CIS_MAX_TEXT_CHARS (engine.config); routes pass the live setting

# field -> (what it is, in words; its range, in words): the one sentence of a refusal and of a clamp
_WORDS = {
    "k": ("k (the number of results)", f"a whole number from {K_MIN} to {K_MAX}"),
    "alpha": ("alpha (the text weight)", f"a number from {ALPHA_MIN:g} to {ALPHA_MAX:g}"),
    "nqe": ("nQE (the neighbours used for expansion)", f"a whole number from {NQE_MIN} (automatic) to {NQE_MAX}"),
}
FIELDS = ("image", "text", "method", "alpha", "k", "expand", "nqe", "negative_text", "keep_reference", "explain")


def limit_sentence(name: str) -> str:
    """The one sentence that states a numeric field's limits (a refusal says it as is)."""
    what, span = _WORDS[name]
    return f"{what} must be {span}"


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _number(value, name: str, lo, hi, whole: bool, notices: List[str]):
    """``value`` checked (a real number, finite) and clamped into [lo, hi]; a changed value adds a notice."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise InputError(limit_sentence(name) + ".")
    out = float(value)
    if whole:
        out = float(round(out))
    out = min(max(out, lo), hi)
    out = int(out) if whole else out
    if out != value:
        notices.append(f"{limit_sentence(name)}; {_shown(value)} was changed to {_shown(out)}.")
    return out


def check_text(value, name: str = "text", max_chars: int = MAX_TEXT_CHARS) -> Optional[str]:
    """A text stripped (empty: None); refused in one sentence when it is not a string or over ``max_chars``."""
    if value is None:
        return None
    words = "the text" if name == "text" else "the negative text"
    if not isinstance(value, str):
        raise InputError(f"{words} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{words} holds a lone surrogate (an invalid \\ud800-\\udfff escape); send valid "
                         "Unicode text") from None
    value = value.strip()
    if len(value) > max_chars:
        raise InputError(f"{words} has {len(value)} characters; the limit is {max_chars}")
    return value or None


def gallery_reference(value: Optional[str]):
    """A reference named in text (the CLI, the JSON route): ``gallery:ID`` is that gallery image's id; any
    other text is left as it is (a file path); None stays None."""
    if value is None or not str(value).startswith("gallery:"):
        return value
    tail = str(value)[len("gallery:"):]
    if not tail.isdigit():
        raise InputError(f"bad gallery image {str(value)[:40]!r}; expected gallery:ID")
    return int(tail)


def _name(value, name: str) -> Optional[str]:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InputError(f"{name} must be a name such as 'sum', not {type(value).__name__}")
    return value.strip() or None


def _flag(value, name: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(f"{name} must be true or false")
    return value


@dataclass
class SearchRequest:
    """Everything one search needs. ``image``: a gallery id (int), a file path, the bytes of an image file, or
    None (text only). ``method`` None: the engine's default (engine.defaults). ``expand``: the expansion
    (``none``, ``lattqe``, ``aqe``, ...); ``nqe`` 0: its automatic neighbour count. ``notices``: what
    :meth:`build` changed (a clamped value), said to the user with the results."""

    image: Any = None
    text: Optional[str] = None
    method: Optional[str] = None
    alpha: float = DEFAULT_ALPHA
    k: int = DEFAULT_K
    expand: str = "none"
    nqe: int = 0
    negative_text: Optional[str] = None
    keep_reference: bool = False
    explain: bool = True
    notices: List[str] = field(default_factory=list, compare=False)

    @classmethod
    def build(cls, max_text_chars: int = MAX_TEXT_CHARS, **values) -> "SearchRequest":
        """The one validation: ``values`` (any of :data:`FIELDS`; missing ones take their defaults) checked,
        normalised and clamped. Raises InputError (one sentence) on a value that cannot be used."""
        unknown = sorted(set(values) - set(FIELDS))
        if unknown:
            raise InputError(f"unknown field {unknown[0]!r}; the fields are {', '.join(sorted(FIELDS))}")
        notices: List[str] = []
        v = {name: values.get(name) for name in FIELDS}
        image = v["image"]
        if isinstance(image, str) and not image.strip():
            image = None
        req = cls(
            image=image,
            text=check_text(v["text"], "text", max_text_chars),
            method=_name(v["method"], "method"),
            alpha=_number(DEFAULT_ALPHA if v["alpha"] is None else v["alpha"], "alpha", ALPHA_MIN, ALPHA_MAX,
                          False, notices),
            k=_number(DEFAULT_K if v["k"] is None else v["k"], "k", K_MIN, K_MAX, True, notices),
            expand=_name(v["expand"], "expand") or "none",
            nqe=_number(0 if v["nqe"] is None else v["nqe"], "nqe", NQE_MIN, NQE_MAX, True, notices),
            negative_text=check_text(v["negative_text"], "negative_text", max_text_chars),
            keep_reference=_flag(v["keep_reference"], "keep_reference", False),
            explain=_flag(v["explain"], "explain", True),
            notices=notices,
        )
        if req.image is None and req.text is None:
            raise InputError("give a reference image, a modification text, or both")
        return req

    def replace(self, **changes) -> "SearchRequest":
        """A copy with ``changes`` (already valid values; the notices are kept)."""
        return dataclasses.replace(self, notices=list(self.notices), **changes)

    def search_kwargs(self) -> dict:
        """The keyword arguments of :func:`engine.search.search` for this request."""
        return {"image": self.image, "text": self.text, "method": self.method, "alpha": self.alpha, "k": self.k,
                "expand": self.expand, "nqe": self.nqe, "negative_text": self.negative_text,
                "explain": self.explain, "exclude_reference": not self.keep_reference}

    def to_json(self) -> dict:
        """What was asked, for a response or a report (the reference named, never a server path)."""
        image = self.image
        shown = (f"gallery:{image}" if isinstance(image, int) and not isinstance(image, bool)
                 else None if image is None else "uploaded")
        return {"image": shown, "text": self.text, "method": self.method, "alpha": self.alpha, "k": self.k,
                "expand": self.expand, "nqe": self.nqe, "negative_text": self.negative_text,
                "keep_reference": self.keep_reference}
