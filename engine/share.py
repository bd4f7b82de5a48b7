"""Query state <-> URL query string, so a search can be shared as a link and restored from it.

A shared query names its reference image either by gallery id (``image=gallery:12``) or, for an
uploaded image, by its SHA-256 content hash (``image=sha256:<64 hex>``). A hash can be restored only
while the engine still holds that image's features in its :class:`~engine.search.FeatureCache` and
the uploaded file is still known to this server (:class:`ReferenceStore`); otherwise restoring says
so clearly and asks for the image again.

Example query string::

    image=gallery:12&text=the+same+but+red&method=sum&alpha=0.5&k=12&expand=none&nqe=64&view=search
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Union
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from .config import MAX_K
from .errors import InputError
from .images import sha256_file

VIEWS = ("search", "compare")
_HASH = re.compile(r"^[0-9a-f]{64}$")
KEYS = ("image", "text", "method", "alpha", "k", "expand", "nqe", "view")


@dataclass
class QueryState:
    """Everything needed to rerun a query (the reference is an id or a content hash, never a path)."""

    image_id: Optional[int] = None
    image_hash: Optional[str] = None
    text: str = ""
    method: str = "sum"
    alpha: float = 0.5
    k: int = 12
    expand: str = "none"
    nqe: int = 0   # 0: automatic (chosen on validation, capped by the gallery size; engine.defaults)
    view: str = "search"

    def validate(self) -> "QueryState":
        """Checks the types and ranges; raises InputError naming the bad field."""
        if self.image_id is not None and self.image_hash is not None:
            raise InputError("a shared query names either a gallery image or an uploaded image, not both")
        if self.image_id is not None and (not isinstance(self.image_id, int) or self.image_id < 0):
            raise InputError(f"bad gallery image id {self.image_id!r} in the link")
        if self.image_hash is not None and not _HASH.match(str(self.image_hash)):
            raise InputError("bad image hash in the link (expected 64 hex digits)")
        if not isinstance(self.text, str):
            raise InputError("the text in the link must be a string")
        if not re.match(r"^[a-z0-9+_.-]{1,40}$", self.method or ""):
            raise InputError(f"bad method name {self.method!r} in the link")
        if not re.match(r"^[a-z0-9+_.-]{1,40}$", self.expand or ""):
            raise InputError(f"bad expansion name {self.expand!r} in the link")
        if not (0.0 <= float(self.alpha) <= 1.0):
            raise InputError("alpha in the link must be between 0 and 1")
        if not 1 <= int(self.k) <= MAX_K:
            raise InputError(f"k in the link must be between 1 and {MAX_K}")
        if not 0 <= int(self.nqe) <= 4096:
            raise InputError("nqe in the link must be between 0 (automatic) and 4096")
        if self.view not in VIEWS:
            raise InputError(f"view in the link must be one of {', '.join(VIEWS)}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


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
    params += [("method", state.method), ("alpha", _num(state.alpha)), ("k", str(int(state.k))),
               ("expand", state.expand), ("nqe", str(int(state.nqe)))]
    if state.view != "search":
        params.append(("view", state.view))
    return urlencode(params)


def _num(x: float) -> str:
    return f"{float(x):.6g}"


def from_query_string(qs: Union[str, Mapping[str, str]]) -> Optional[QueryState]:
    """Parses a query string (with or without '?') or a mapping such as ``request.query_params``.

    Returns None when it carries no query (no image and no text); raises InputError on bad values.
    Unknown parameters are ignored (links may carry tracking or Gradio's own parameters).
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
    st.method = params.get("method", st.method) or st.method
    st.expand = params.get("expand", st.expand) or st.expand
    st.view = params.get("view", st.view) or st.view
    try:
        st.alpha = float(params.get("alpha", st.alpha))
        st.k = int(params.get("k", st.k))
        st.nqe = int(params.get("nqe", st.nqe))
    except ValueError:
        raise InputError("alpha, k and nqe in the link must be numbers") from None
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


def state_for(engine, image, text: Optional[str], method: str, alpha: float, k: int, expand: str, nqe: int,
              view: str = "search") -> QueryState:
    """The shareable state of a query as the UI holds it (``image``: a file path, a gallery id or None).

    A file whose content is a gallery image is shared by gallery id; any other file by its hash, and
    remembered in the engine's :class:`ReferenceStore` so the link can be restored.
    """
    st = QueryState(text=(text or "").strip(), method=method, alpha=float(alpha), k=int(k), expand=expand or "none",
                    nqe=int(nqe or 0), view=view)
    if isinstance(image, int) and not isinstance(image, bool):
        st.image_id = image
    elif image:
        key = file_sha256(image)
        gid = engine.find_item(key)
        if gid is not None:
            st.image_id = gid
        else:
            st.image_hash = key
            engine.references.put(key, image)
    return st.validate()


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
