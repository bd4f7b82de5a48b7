"""Query state <-> URL query string, so a search can be shared as a link and restored from it.

A shared query names its reference image either by gallery id (``image=gallery:12``) or, for an
uploaded image, by its SHA-256 content hash (``image=sha256:<64 hex>``). A hash can be restored only
while the engine still holds that image's features in its :class:`~engine.search.FeatureCache` and
the uploaded file is still known to this server (:class:`ReferenceStore`); otherwise restoring says
so clearly and asks for the image again.

Example query string::

    image=gallery:12&text=the+same+but+red&method=sum&alpha=0.5&k=12&expand=none&nqe=64&keep_reference=1&view=compare
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Union
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from .errors import InputError
from .images import sha256_file
from .query import DEFAULT_ALPHA, DEFAULT_K, MAX_TEXT_CHARS, SearchRequest, limit_sentence

VIEWS = ("search", "compare")
_HASH = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[a-z0-9+_.-]{1,40}$")
KEYS = ("image", "text", "method", "alpha", "k", "expand", "nqe", "negative_text", "keep_reference", "view")


@dataclass
class QueryState:
    """A :class:`~engine.query.SearchRequest` as a link carries it: every field of the query, the reference as
    a gallery id or a content hash (never a path), and the page's view. ``notices``: what checking the link
    changed (a clamped value, said with the results)."""

    image_id: Optional[int] = None
    image_hash: Optional[str] = None
    text: str = ""
    method: Optional[str] = None  # None: the engine's default method (engine.defaults)
    alpha: float = DEFAULT_ALPHA
    k: int = DEFAULT_K
    expand: str = "none"
    nqe: int = 0   # 0: automatic (chosen on validation, capped by the gallery size; engine.defaults)
    negative_text: Optional[str] = None
    keep_reference: bool = False
    view: str = "search"
    notices: List[str] = field(default_factory=list, compare=False)

    def validate(self) -> "QueryState":
        """Checks the link's own fields (reference, names, view) and the query's through the one validation
        (:meth:`SearchRequest.build`: numbers out of range clamped, with a notice); raises InputError."""
        if self.image_id is not None and self.image_hash is not None:
            raise InputError("a shared query names either a gallery image or an uploaded image, not both")
        if self.image_id is not None and (not isinstance(self.image_id, int) or self.image_id < 0):
            raise InputError(f"bad gallery image id {self.image_id!r} in the link")
        if self.image_hash is not None and not _HASH.match(str(self.image_hash)):
            raise InputError("bad image hash in the link (expected 64 hex digits)")
        if self.method is not None and not _NAME.match(self.method):
            raise InputError(f"bad method name {self.method!r} in the link")
        if not _NAME.match(self.expand or ""):
            raise InputError(f"bad expansion name {self.expand!r} in the link")
        if self.view not in VIEWS:
            raise InputError(f"view in the link must be one of {', '.join(VIEWS)}")
        req = SearchRequest.build(image=self.image_id if self.image_id is not None else self.image_hash,
                                  text=self.text, method=self.method, alpha=self.alpha, k=self.k,
                                  expand=self.expand, nqe=self.nqe, negative_text=self.negative_text,
                                  keep_reference=self.keep_reference)
        self.text, self.negative_text = req.text or "", req.negative_text
        self.alpha, self.k, self.nqe = req.alpha, req.k, req.nqe
        self.notices += [n for n in req.notices if n not in self.notices]
        return self

    @property
    def has_reference(self) -> bool:
        return self.image_id is not None or self.image_hash is not None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "notices"}


def to_query_string(state: QueryState) -> str:
    """The URL query string (no leading '?') for a state; parameters in a fixed order."""
    state.validate()
    params = []
    if state.image_id is not None:
        params.append(("image", f"gallery:{state.image_id}"))
    elif state.image_hash is not None:
        params.append(("image", f"sha256:{state.image_hash}"))
    if state.text:
        params.append(("text", state.text))
    if state.method:
        params.append(("method", state.method))
    params += [("alpha", _num(state.alpha)), ("k", str(int(state.k))), ("expand", state.expand),
               ("nqe", str(int(state.nqe)))]
    if state.negative_text:
        params.append(("negative_text", state.negative_text))
    if state.keep_reference:
        params.append(("keep_reference", "1"))
    if state.view != "search":
        params.append(("view", state.view))
    return urlencode(params)


def _num(x: float) -> str:
    return f"{float(x):.6g}"


def _link_number(params: Dict[str, str], name: str, default):
    """A number from the link; one that is not a number is refused with the field's one sentence."""
    if name not in params:
        return default
    try:
        value = float(params[name])
    except ValueError:
        raise InputError(f"{limit_sentence(name)} (the link says {params[name][:20]!r}).") from None
    return int(value) if value.is_integer() and name != "alpha" else value


def from_query_string(qs: Union[str, Mapping[str, str]]) -> Optional[QueryState]:
    """Parses a query string (with or without '?') or a mapping such as ``request.query_params``.

    Returns None when it carries no query (no image and no text); raises InputError on bad values; numbers
    out of range are clamped with a notice (:meth:`QueryState.validate`). Unknown parameters are ignored
    (links may carry tracking or Gradio's own parameters).
    """
    if isinstance(qs, str):
        raw = parse_qs(qs.lstrip("?"), keep_blank_values=True)
        params: Dict[str, str] = {k: v[-1] for k, v in raw.items()}
    else:
        params = {str(k): str(v) for k, v in dict(qs).items()}
    params = {k: v for k, v in params.items() if k in KEYS}
    if not params.get("image") and not params.get("text", "").strip():
        return None
    st = QueryState()
    image = params.get("image", "")
    if image:
        kind, _, value = image.partition(":")
        if kind == "gallery" and value.isdigit():
            st.image_id = int(value)
        elif kind == "sha256" and _HASH.match(value.lower()):
            st.image_hash = value.lower()
        else:
            raise InputError(f"bad image in the link: {image[:80]!r} (expected gallery:ID or sha256:HASH)")
    st.text = params.get("text", "")
    st.method = params.get("method") or None
    st.expand = params.get("expand", st.expand) or st.expand
    st.view = params.get("view", st.view) or st.view
    st.negative_text = params.get("negative_text") or None
    keep = params.get("keep_reference", "0").strip().lower()
    if keep not in ("0", "1", "true", "false", ""):
        raise InputError("keep_reference in the link must be 1 or 0")
    st.keep_reference = keep in ("1", "true")
    st.alpha = _link_number(params, "alpha", st.alpha)
    st.k = _link_number(params, "k", st.k)
    st.nqe = _link_number(params, "nqe", st.nqe)
    return st.validate()


def share_url(base_url: str, state: QueryState) -> str:
    """``base_url`` with its query string replaced by the state's (fragment dropped)."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", to_query_string(state), ""))


def file_sha256(path: Union[str, Path]) -> str:
    """Content hash of a file, the same key the engine's feature cache uses."""
    return sha256_file(path)


class ReferenceStore:
    """Bounded LRU: content hash of an uploaded reference image -> the file the server holds for it.

    The UI records every uploaded reference here so a shared link (``sha256:...``) can be restored
    while the image's features are still in the engine's feature cache.
    """

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._d: "OrderedDict[str, str]" = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: str, path: Union[str, Path]) -> None:
        with self._lock:
            self._d[key] = str(path)
            self._d.move_to_end(key)
            while len(self._d) > self.capacity:
                self._d.popitem(last=False)

    def get(self, key: str) -> Optional[str]:
        with self._lock:
            p = self._d.get(key)
        return p if p and Path(p).is_file() else None


def state_for(engine, request: SearchRequest, view: str = "search") -> QueryState:
    """The shareable state of a request (its ``image``: a file path, a gallery id or None).

    A file whose content is a gallery image is shared by gallery id; any other file by its hash, and
    remembered in the engine's :class:`ReferenceStore` so the link can be restored.
    """
    st = QueryState(text=request.text or "", method=request.method, alpha=request.alpha, k=request.k,
                    expand=request.expand or "none", nqe=request.nqe, negative_text=request.negative_text,
                    keep_reference=request.keep_reference, view=view, notices=list(request.notices))
    image = request.image
    if isinstance(image, int) and not isinstance(image, bool):
        st.image_id = image
    elif isinstance(image, (str, Path)) and str(image):
        key = file_sha256(image)
        gid = engine.find_item(key)
        if gid is not None:
            st.image_id = gid
        else:
            st.image_hash = key
            engine.references.put(key, image)
    return st.validate()


def request_for(engine, state: QueryState, max_text_chars: int = MAX_TEXT_CHARS) -> SearchRequest:
    """The :class:`SearchRequest` a restored state searches: exactly what was searched when the link was
    made (the reference resolved by :func:`resolve_reference`; the link's notices kept)."""
    req = SearchRequest.build(max_text_chars, image=resolve_reference(engine, state), text=state.text,
                              method=state.method, alpha=state.alpha, k=state.k, expand=state.expand,
                              nqe=state.nqe, negative_text=state.negative_text,
                              keep_reference=state.keep_reference)
    req.notices[:0] = [n for n in state.notices if n not in req.notices]
    return req


def resolve_reference(engine, state: QueryState):
    """What :func:`engine.search.search` takes as ``image`` for a restored state, or None (text only).

    Raises InputError when the link names a gallery image that does not exist or an uploaded image the
    server no longer holds.
    """
    if state.image_id is not None:
        if not 0 <= state.image_id < len(engine.index):
            raise InputError(f"the link names gallery image {state.image_id}, but the gallery has "
                             f"{len(engine.index)} images")
        return state.image_id
    if state.image_hash is not None:
        gid = engine.find_item(state.image_hash)
        if gid is not None:
            return gid
        path = engine.references.get(state.image_hash)
        if path is None or state.image_hash not in engine.cache:
            raise InputError("the uploaded reference image in this link is no longer held by the server; "
                             "upload it again")
        return path
    return None


def reference_file(engine, state: QueryState) -> Optional[str]:
    """A file path showing the state's reference image (for the image input), or None."""
    ref = resolve_reference(engine, state)
    if ref is None:
        return None
    if isinstance(ref, int):
        p = engine.index.image_path(ref)
        return str(p if p.exists() else engine.index.display_path(ref))
    return str(ref)
