"""The one search function used by the UI, the CLI and the API, and the engine state it runs on."""
from __future__ import annotations

import hashlib
import io
import logging
import platform
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
from PIL import Image

from .backbones import create_backbone
from .backbones.base import Backbone
from .checkpoints import refusals, search_path
from .compose import COMPOSERS, Composer, ComposerUnavailable, Query
from .compose.base import encoded_text
from .config import MAX_K, Settings
from .defaults import engine_defaults
from .errors import CheckpointError, EngineError, InputError
from .expand import EXPANDERS, Expander, ExpanderUnavailable
from .expand.base import Expansion, expand_query, expander_reads_text
from .images import DEFAULT_MAX_BYTES, REFERENCE_SIDE, decode_limits, load_image, read_bytes
from .index.store import GalleryIndex
from .share import ReferenceStore
from .query import SearchRequest

log = logging.getLogger(__name__)
DEFAULT_NQE = None  # None (or 0): the nQE chosen on validation for the expander, capped by the gallery (engine.defaults)
SAME_IMAGE_COSINE = 0.9995  # cosine at which a gallery embedding may be the reference itself (float16 storage)
# ... and the least mean cosine of its feature-map cells, place by place, for it to be the same picture: a mirrored,
# greyed or slightly different picture can embed within SAME_IMAGE_COSINE, its cells do not all agree
SAME_IMAGE_CELLS = 0.95


@dataclass
class Result:
    rank: int
    id: int
    path: str  # path relative to the gallery root
    score: float
    caption: str = ""
    explain: Dict[str, Any] = field(default_factory=dict)


@dataclass
class SearchResponse:
    results: List[Result]
    timings_ms: Dict[str, float]
    method: str
    expand: str
    explanation: Dict[str, Any] = field(default_factory=dict)
    notices: List[str] = field(default_factory=list)
    reference_hash: Optional[str] = None

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "expand": self.expand,
            "results": [asdict(r) for r in self.results],
            "timings_ms": self.timings_ms,
            "explanation": _jsonable(self.explanation),
            "notices": self.notices,
            "reference_hash": self.reference_hash,
        }


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    return obj


def _unavailable_reason(exc: Exception, refused: list) -> str:
    """Why a learned part is unavailable: its loader's sentence, and the refused checkpoint when one was."""
    if refused and not any(r.split(" ", 1)[0] in str(exc) for r in refused):
        return f"{refused[0]} ({exc})"
    return str(exc)


class FeatureCache:
    """LRU of reference-image features keyed by content hash (so text-only changes skip the image pass)."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._d: "OrderedDict[str, Tuple[torch.Tensor, torch.Tensor]]" = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key):
        with self._lock:
            if key in self._d:
                self._d.move_to_end(key)
                self.hits += 1
                return self._d[key]
            self.misses += 1
            return None

    def put(self, key, value):
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.capacity:
                self._d.popitem(last=False)

    def __contains__(self, key):
        return key in self._d


ImageInput = Union[None, str, Path, bytes, Image.Image, int]


class SearchEngine:
    """A backbone + a gallery index + the composers and expanders available for them."""

    def __init__(self, backbone: Backbone, index: GalleryIndex, settings: Settings,
                 models_from: Optional["SearchEngine"] = None):
        """``settings``: the entry point's; ``models_from``: an engine on the same backbone whose composers and
        expanders are shared (they hold no gallery state), so a per-session gallery owns only its index."""
        self.backbone, self.index = backbone, index
        self.settings = settings
        if index.fingerprint != backbone.fingerprint:
            raise EngineError(
                f"index built with {index.fingerprint} but the backbone is {backbone.fingerprint}; rebuild the index"
            )
        self.cache = FeatureCache()
        # uploaded references by content hash, so a shared link (``sha256:...``) can be restored (engine/share.py)
        self.references = ReferenceStore(capacity=self.cache.capacity)
        self._lock = threading.Lock()
        if models_from is not None and models_from.backbone is backbone:
            self.composers, self.unavailable = models_from.composers, models_from.unavailable
            self.expanders, self.expanders_unavailable = models_from.expanders, models_from.expanders_unavailable
            self.cache = models_from.cache  # features depend on the image and the backbone only
            self.defaults = models_from.defaults
            return
        self.composers: Dict[str, Composer] = {}
        self.unavailable: Dict[str, str] = {}
        ckpt = search_path(self.settings)  # the whole search path: the factories take a folder string
        for name in COMPOSERS:
            with refusals() as refused:
                try:
                    self.composers[name] = COMPOSERS.create(name, backbone, checkpoint_dir=ckpt,
                                                              loaded=self.composers)
                except (ComposerUnavailable, CheckpointError) as exc:
                    self.unavailable[name] = _unavailable_reason(exc, refused)
                except Exception as exc:  # noqa: BLE001 - a damaged file never stops the start: one line, part off
                    self.unavailable[name] = f"its checkpoint cannot be used ({exc.__class__.__name__})"
                    log.warning("%s unavailable: %s: %s", name, exc.__class__.__name__, exc)
        self.expanders: Dict[str, Expander] = {}
        self.expanders_unavailable: Dict[str, str] = {}
        for name in EXPANDERS:
            with refusals() as refused:
                try:
                    self.expanders[name] = EXPANDERS.get(name)(
                        embed_dim=backbone.embed_dim, checkpoint_dir=ckpt, fingerprint=backbone.fingerprint
                    )
                except (ExpanderUnavailable, CheckpointError) as exc:
                    self.expanders_unavailable[name] = _unavailable_reason(exc, refused)
                except Exception as exc:  # noqa: BLE001 - as for the composers
                    self.expanders_unavailable[name] = f"its checkpoint cannot be used ({exc.__class__.__name__})"
                    log.warning("%s unavailable: %s: %s", name, exc.__class__.__name__, exc)

        self.defaults = engine_defaults(backbone, self.settings)

    @property
    def offered_expanders(self) -> List[str]:
        """The expanders the page offers: the available ones that validation showed to move some answer for
        this backbone, and, for one that serves composed queries alone, without scoring below no expansion there
        (engine.defaults.EngineDefaults.offers); the CLI and the APIs still accept every one."""
        return [n for n in self.expanders
                if self.defaults.offers(n, composed_only=expander_reads_text(self.expanders[n]))]

    @property
    def default_method(self) -> str:
        """The method a search without one uses (page, CLI and API alike): the one chosen on held-out-domain
        validation for this backbone (engine.defaults) when it loaded, else the weighted sum."""
        if self.defaults.method in self.composers:
            return self.defaults.method
        return "sum" if "sum" in self.composers else next(iter(self.composers))

    # -- reference images ---------------------------------------------------------------
    def reference_features(self, image: ImageInput) -> Tuple[str, torch.Tensor, torch.Tensor, bool]:
        """(content hash, embedding (D,), visual tokens (1+P, W), cache hit)."""
        if isinstance(image, (int, np.integer)) and not isinstance(image, bool):
            return self.gallery_features(int(image))
        if isinstance(image, Image.Image):
            buf = io.BytesIO()
            image.save(buf, "PNG")
            key = hashlib.sha256(buf.getvalue()).hexdigest()
        else:
            data = read_bytes(image, int(self.settings.max_upload_mb * 1e6))
            key = hashlib.sha256(data).hexdigest()
            image = data
        return self._cached_features(key, lambda: load_image(image, **decode_limits(self.settings),
                                                             side=REFERENCE_SIDE))  # only embedded: a small copy

    def gallery_features(self, item_id: int):
        if not 0 <= item_id < len(self.index):
            raise InputError(f"gallery item {item_id} does not exist (the gallery has {len(self.index)} images)")
        key = self.index.items[item_id]["sha256"]

        def load():
            path = self.index.image_path(item_id)
            if not path.exists():
                path = self.index.display_path(item_id)
            return load_image(path, **{**decode_limits(self.settings), "max_bytes": DEFAULT_MAX_BYTES},
                              side=REFERENCE_SIDE)

        return self._cached_features(key, load)

    def _cached_features(self, key: str, load: Callable[[], Image.Image]):
        """The one encode-and-cache path: features by content hash, the image loaded only on a miss."""
        hit = self.cache.get(key)
        if hit is not None:
            return key, hit[0], hit[1], True
        pil = load()
        with torch.no_grad():
            emb, tokens = self.backbone.encode_images_with_tokens(self.backbone.preprocess(pil).unsqueeze(0))
        value = (emb[0].float().cpu(), tokens[0].float().cpu())
        self.cache.put(key, value)
        return key, value[0], value[1], False

    def find_item(self, sha256: str) -> Optional[int]:
        for it in self.index.items:
            if it["sha256"] == sha256:
                return int(it["id"])
        return None

    # -- info ---------------------------------------------------------------------------
    def methods(self) -> Dict[str, Optional[str]]:
        """{composer name: None if available else the reason it is not}."""
        out: Dict[str, Optional[str]] = {n: None for n in self.composers}
        out.update(self.unavailable)
        return out

    def method_status(self) -> Dict[str, str]:
        """{composer name: "available" or the reason it is not} (what ``info`` prints)."""
        return {n: (reason or "available") for n, reason in self.methods().items()}

    def info(self) -> dict:
        return {
            "backbone": self.backbone.describe(),
            "index": self.index.stats(),
            "methods": self.method_status(),
            "default_method": {"method": self.default_method, "why": self.defaults.why()},
            "expanders": {**{n: "available" for n in self.expanders},
                          **{n: (r or "available") for n, r in self.expanders_unavailable.items()}},
            "feature_cache": {"entries": len(self.cache._d), "hits": self.cache.hits, "misses": self.cache.misses},
            "machine": platform.platform(),
        }


def _check_text(text: Optional[str], max_chars: int) -> Optional[str]:
    if text is None:
        return None
    if not isinstance(text, str):
        raise InputError("the modification text must be a string")
    text = text.strip()
    if not text:
        return None
    if len(text) > max_chars:
        raise InputError(f"the text has {len(text)} characters; the limit is {max_chars}")
    return text


def search(
    engine: SearchEngine,
    image: ImageInput = None,
    text: Optional[str] = None,
    method: Optional[str] = None,
    alpha: float = 0.5,
    k: int = 12,
    expand: str = "none",
    nqe: Optional[int] = DEFAULT_NQE,
    negative_text: Optional[str] = None,
    explain: bool = False,
    exclude_reference: bool = False,
) -> SearchResponse:
    """Compose (image, text) into a query, search the gallery, optionally expand and search again.

    ``image`` may be a path, bytes, a PIL image, or an int gallery id. ``method`` None: the engine's default
    (:attr:`SearchEngine.default_method`); ``nqe`` None or 0: the expander's default for this gallery's size
    (engine.defaults). Returns ranked results with per-stage timings in milliseconds. ``exclude_reference`` leaves
    a gallery image used as the reference out of its own results (the CIRR convention; the UI, CLI and API turn
    it on by default). Stages: validate -> compose -> first stage (+ expand) -> collect.
    """
    t0 = time.perf_counter()
    timings: Dict[str, float] = {}
    text, negative_text, method, alpha, k, nqe, expand = _validate(engine, image, text, negative_text, method,
                                                                   alpha, k, nqe, expand)
    query, comp, ref = _compose(engine, image, text, negative_text, alpha, method, timings)
    notices: List[str] = list(comp.notices)
    qvec = comp.vector.astype(np.float32)
    n = len(engine.index)
    # the reference (by gallery id, content hash or an identical embedding) is dropped after the search,
    # so a few more are fetched to still return k
    extra = 4 if exclude_reference and query.has_image else 0
    ref = ref + ((query.image_embedding.detach().float().cpu().numpy().astype(np.float32)
                  if extra and query.image_embedding is not None else None), query.image_tokens)
    # one first-stage search: the results themselves, or (with expansion) the nQE neighbours to expand from
    # and, in the same pass, the ranking without expansion that the display compares against
    nq = max(1, min(nqe or engine.defaults.gallery_nqe(expand, n), n))
    n1 = min(n, max(nq, k + extra)) if expand != "none" else min(n, k + extra)
    # items close to many others (hubs) are pulled down by the method's chosen weight (engine.index.hubs)
    hub = engine.defaults.hub_weight_for(method)
    t = time.perf_counter()
    s1, i1 = engine.index.search(qvec[None], n1, hub_weight=hub)
    timings["search"] = (time.perf_counter() - t) * 1e3
    explanation: Dict[str, Any] = {"composer": comp.explanation}
    if hub and engine.index.hub_density() is not None:
        explanation["hubs"] = {"weight": hub, "says": "scores are similarities less a small penalty for "
                                                      "pictures close to many others in this gallery"}
    scores, ids, first_rank = s1, i1, {}
    if expand != "none":
        qvec, scores, ids, first_rank, explanation["expansion"] = _expand(
            engine, expand, qvec, s1, i1, nq, k + extra, extra, ref, timings, hub, _text_vector(engine, expand, query))
    results = _collect(engine, scores[0], ids[0], k, extra, ref, first_rank if expand != "none" else None)
    if explain:
        _explain(engine, results, query, qvec)
    timings["total"] = (time.perf_counter() - t0) * 1e3
    return SearchResponse(results, {k_: round(v, 3) for k_, v in timings.items()}, method, expand,
                          explanation, notices, ref[1])


def run(engine: SearchEngine, request: SearchRequest) -> SearchResponse:
    """The search for one :class:`~engine.query.SearchRequest` (every route builds one); what building it
    changed (a clamped k, alpha or nQE) comes first in the response's notices."""
    resp = search(engine, **request.search_kwargs())
    resp.notices[:0] = request.notices
    return resp


def _validate(engine: SearchEngine, image, text, negative_text, method, alpha, k, nqe, expand) -> tuple:
    """The arguments checked and normalised (one sentence for each mistake, nothing computed yet)."""
    text = _check_text(text, engine.settings.max_text_chars)
    negative_text = _check_text(negative_text, engine.settings.max_text_chars)
    method = method or engine.default_method
    try:
        k = int(k)
        alpha = float(alpha)
        nqe = int(nqe or 0)
    except (TypeError, ValueError, OverflowError):
        raise InputError("k, alpha and nqe must be numbers") from None
    if nqe < 0:
        raise InputError("nqe must be 0 (automatic) or more")
    if not 1 <= k <= MAX_K:
        raise InputError(f"k must be between 1 and {MAX_K}")
    if not np.isfinite(alpha) or not 0.0 <= alpha <= 1.0:
        raise InputError("alpha must be between 0 and 1")
    if method not in engine.composers:
        if method in engine.unavailable:
            raise InputError(f"method {method!r} is not available: {engine.unavailable[method]}")
        raise InputError(f"unknown method {method!r}; available: {', '.join(engine.composers)}")
    expand = expand or "none"
    if expand not in engine.expanders:
        if expand in engine.expanders_unavailable:
            raise InputError(f"expansion {expand!r} is not available: {engine.expanders_unavailable[expand]}")
        raise InputError(f"unknown expansion {expand!r}; available: {', '.join(engine.expanders)}")
    if image is None and text is None:
        raise InputError("give a reference image, a modification text, or both")
    return text, negative_text, method, alpha, k, nqe, expand


def _compose(engine: SearchEngine, image, text, negative_text, alpha, method, timings) -> tuple:
    """(query, composition, (reference gallery id, reference hash)) with the encode and compose timings."""
    query = Query(text=text, alpha=alpha, negative_text=negative_text)
    ref_hash = ref_id = None
    if image is not None:
        t = time.perf_counter()
        ref_hash, emb, tokens, hit = engine.reference_features(image)
        query.image_embedding, query.image_tokens, query.has_image = emb, tokens, True
        timings["encode_image"] = (time.perf_counter() - t) * 1e3
        timings["image_cache_hit"] = float(hit)
        ref_id = int(image) if isinstance(image, (int, np.integer)) else None
    t = time.perf_counter()
    with torch.no_grad():
        comp = engine.composers[method].compose(query)
    timings["compose"] = (time.perf_counter() - t) * 1e3
    return query, comp, (ref_id, ref_hash)


def _text_vector(engine: SearchEngine, expand: str, query: Query) -> Optional[np.ndarray]:
    """The (D,) embedding of the query's modification text for an expander that reads it (text-conditioned
    LAttQE), encoded once per query (the composer's encoding when it made one); None for the others and for a
    query without a text."""
    if not expander_reads_text(engine.expanders[expand]) or not query.text:
        return None
    emb, _ = encoded_text(engine.backbone, query)
    return emb.detach().float().cpu().numpy().astype(np.float32).reshape(-1)


def _expand(engine: SearchEngine, expand: str, qvec, s1, i1, nq: int, n_out: int, extra: int, ref, timings,
            hub: float = 0.0, text: Optional[np.ndarray] = None):
    """(query vector, scores, ids, rank before expansion by id, the expansion's explanation) after expanding
    from the first-stage neighbours at least as close as the expander's floor (none: the query is kept);
    ``text``: the modification text's embedding, handed to the expander (only a text-conditioned one reads it)."""
    n = len(engine.index)
    t = time.perf_counter()
    valid = i1[0] >= 0
    nb_ids, nb_sims = i1[0][valid][:nq], s1[0][valid][:nq]
    floor = engine.defaults.floor_for(expand)
    close = nb_sims >= floor   # only neighbours this close are averaged in (engine.defaults)
    nb_ids, nb_sims = nb_ids[close], nb_sims[close]
    neighbours = engine.index.embeddings[nb_ids].astype(np.float32)
    ex = (expand_query(engine.expanders[expand], qvec, neighbours, nb_sims, text) if len(nb_ids) else
          Expansion(qvec, np.zeros(0), {"kept_because": f"no result is as close to the query as the floor "
                                                        f"{floor:g} (cosine) this expander needs"}))
    # ranks before expansion as the search without expansion shows them: the reference left out the same way
    shown_before = [int(i) for i in i1[0][valid] if not (extra and _is_reference(engine, int(i), *ref))]
    first_rank = {i: r for r, i in enumerate(shown_before)}
    new_vec = ex.vector.astype(np.float32)
    weights = np.asarray(ex.weights, dtype=np.float64)
    kept = not np.any(np.abs(weights) > 1e-6) or bool(np.allclose(new_vec, qvec, atol=1e-6))
    timings["expand"] = (time.perf_counter() - t) * 1e3
    if kept:   # the expander returned the query itself: the first pass is the answer, nothing moved
        scores, ids = s1[:, :min(n, n_out)], i1[:, :min(n, n_out)]
    else:
        qvec = new_vec
        scores, ids = engine.index.search(qvec[None], min(n, n_out), hub_weight=hub)
    top = [j for j in np.argsort(-np.abs(weights))[:10] if abs(weights[j]) > 1e-6]
    explanation = {
        "method": expand,
        "nqe": int(nq),
        "neighbours": [{"id": int(nb_ids[j]), "weight": float(weights[j]),
                        "path": engine.index.items[int(nb_ids[j])]["path"]} for j in top],
        **ex.explanation,
        "kept_query": bool(kept),
        "floor": round(float(floor), 4),
        "used_neighbours": int(np.sum(np.abs(weights) > 1e-6)),
    }
    if kept:
        explanation["weights"] = []   # all zero: nothing to show
    return qvec, scores, ids, first_rank, explanation


def _collect(engine: SearchEngine, scores, ids, k: int, extra: int, ref, first_rank: Optional[dict]) -> List[Result]:
    """The first ``k`` results (the reference left out when ``extra``), with their rank before expansion."""
    results: List[Result] = []
    for s, i in zip(scores, ids):
        if i < 0:
            continue
        if extra and _is_reference(engine, int(i), *ref):
            continue
        if len(results) >= k:
            break
        it = engine.index.items[int(i)]
        r = Result(rank=len(results) + 1, id=int(i), path=it["path"], score=float(s), caption=it.get("caption", ""))
        if first_rank is not None:
            before = first_rank.get(int(i))
            r.explain["rank_before_expansion"] = None if before is None else before + 1
        results.append(r)
    return results


def _is_reference(engine: SearchEngine, i: int, ref_id, ref_hash, ref_vec, ref_tokens=None) -> bool:
    """Whether gallery item ``i`` is the reference image itself: the same id, the same file bytes, or (a
    re-encoded copy, e.g. after an upload) an embedding identical up to float16 storage whose feature map
    agrees with the reference's cell by cell. A different picture that embeds the same (a mirror image, a
    grey version) is not the reference and stays in the results."""
    if (ref_id is not None and i == ref_id) or (ref_hash is not None and engine.index.items[i]["sha256"] == ref_hash):
        return True
    if ref_vec is None:
        return False
    g = engine.index.embeddings[i].astype(np.float32)
    den = float(np.linalg.norm(g) * np.linalg.norm(ref_vec))
    if not (den > 0 and float(g @ ref_vec) / den >= SAME_IMAGE_COSINE):
        return False
    if ref_tokens is None or ref_tokens.shape[0] < 2:
        return True  # nothing finer to compare with
    try:
        _, _, tokens, _ = engine.gallery_features(i)  # cached by content; encoded once otherwise
    except Exception:  # an unreadable gallery file: judged by the embedding alone
        return True
    if tokens.shape != ref_tokens.shape:
        return True
    cells = torch.nn.functional.cosine_similarity(tokens[1:].float(), ref_tokens[1:].float(), dim=-1)
    return float(cells.mean()) >= SAME_IMAGE_CELLS


def _explain(engine: SearchEngine, results: List[Result], query: Query, qvec: np.ndarray) -> None:
    """Per result: similarity to the reference image alone, to the text alone, and the composed score."""
    if not results:
        return
    ids = [r.id for r in results]
    g = engine.index.embeddings[ids].astype(np.float32)
    img = query.image_embedding.numpy().astype(np.float32) if query.has_image else None
    txt = None
    if query.text_embedding is not None:        # the composer's own encode of the same text: reused
        txt = query.text_embedding.detach().float().cpu().numpy().astype(np.float32)
    elif query.text:
        txt = engine.backbone.encode_texts([query.text]).embeddings[0].float().cpu().numpy()
    for r, v in zip(results, g):
        r.explain["image_similarity"] = None if img is None else float(v @ img)
        r.explain["text_similarity"] = None if txt is None else float(v @ txt)
        r.explain["composed_score"] = float(v @ qvec)


def open_engine(index_dir, backbone: Optional[Backbone] = None, *, settings: Settings,
                index_type: Optional[str] = None, models_from: Optional[SearchEngine] = None) -> SearchEngine:
    """Load an index folder with the backbone it was built with (or the given one); ``settings``: the entry
    point's."""
    if str(index_dir) == "gallery":      # the demo's own index (the one `python app.py` builds and serves)
        index_dir = settings.resolved_index_dir()
    if backbone is None:
        meta_backbone = GalleryIndex.load(index_dir, build_vectors=False).meta.get("backbone", "")
        backbone = create_backbone(_backbone_name_for(meta_backbone) or settings.backbone, settings.device,
                                   settings=settings)
    opts = {"checkpoint_dir": search_path(settings), "fingerprint": backbone.fingerprint,
            "memory_budget": settings.index_memory_budget}
    index = GalleryIndex.load(index_dir, expected_fingerprint=backbone.fingerprint, vector_options=opts)
    if index_type and index_type != index.meta.get("index_type"):
        index.attach_vectors(index_type, **opts)
    return SearchEngine(backbone, index, settings, models_from=models_from)


def _backbone_name_for(recorded: str) -> str:
    """Map a recorded backbone name (``packaged:efficientnet-lite0+...``) back to a factory name."""
    if recorded.startswith("packaged:efficientnet-"):
        return "packaged:" + recorded.split("efficientnet-")[1].split("+")[0]
    if recorded.startswith("open_clip:"):
        spec = recorded.split(":", 1)[1]
        if spec.endswith("/random"):
            return "tiny:" + spec.split("/")[0]
        return "open_clip:" + spec
    return ""
