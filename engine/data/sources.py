"""Readers of real photos shipped by packages that install offline.

Each reader locates its package at run time and yields :class:`PhotoRecord` objects
(image file, caption, category labels, source package + version, licence, author,
original file reference). Sources:

* Debian ``tuxpaint-stamps-default``: PNG stamps with a ``.txt`` caption (English first line).
* Debian ``gcompris-qt-data``: Qt resource archives (``*.rcc``) read by :class:`RccArchive`,
  a pure-Python parser of the rcc binary format; per-file licences come from the README
  notes inside the archives, else from the package's Debian copyright file.
* PyPI ``saleor==2.10.1``: the wheel (downloaded with ``pip download``, never installed)
  holds the demo shop's product photos; names come from its ``populatedb_data.json``.
* ``skimage.data`` and ``sklearn.datasets.load_sample_images`` sample photos.

Extracted files are cached under ``engine.config.cache_dir() / "sources"``.
"""
from __future__ import annotations

import fnmatch
import gzip
import json
import re
import struct
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from ..config import cache_dir
from ..errors import EngineError, InputError
from ..fileio import atomic_write_bytes as _atomic_write
from .locations import configured

TUXPAINT_PACKAGE = "tuxpaint-stamps-default"
GCOMPRIS_PACKAGE = "gcompris-qt-data"
SALEOR_VERSION = "2.10.1"
RASTER_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")


def tuxpaint_dir() -> Path:
    """The Tux Paint stamps folder the entry point configured: the Debian install location unless
    CIS_TUXPAINT_STAMPS points elsewhere (:mod:`engine.data.locations`)."""
    return Path(configured().tuxpaint_stamps)


def gcompris_rcc_dir() -> Path:
    """The GCompris resource folder the entry point configured: the Debian install location unless
    CIS_GCOMPRIS_RCC points elsewhere."""
    return Path(configured().gcompris_rcc)


class SourceMissingError(EngineError):
    """A photo source package is not installed (the message says how to install it)."""


@dataclass(frozen=True)
class PhotoRecord:
    """One photo from a source package."""

    source: str                 # package name, e.g. "gcompris-qt-data"
    version: str                # package version
    ref: str                    # original file inside the package (path, or archive:path)
    labels: Tuple[str, ...]     # category path in the source (folders), most general first
    licence: str
    path: Optional[Path] = None     # file on disk (installed or extracted to the cache)
    data: Optional[bytes] = None    # or the bytes themselves
    caption: Optional[str] = None
    author: Optional[str] = None
    url: Optional[str] = None       # upstream page of the original, where known
    extra: Dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def read_bytes(self) -> bytes:
        if self.data is not None:
            return self.data
        if self.path is None:
            raise InputError(f"record {self.ref} has neither bytes nor a path")
        return Path(self.path).read_bytes()

    @property
    def name(self) -> str:
        return self.ref.replace(":", "/").rsplit("/", 1)[-1]


# --------------------------------------------------------------------------------------
# package helpers


def source_cache(name: str) -> Path:
    path = cache_dir() / "sources" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def debian_version(package: str) -> str:
    """Installed version of a Debian package ('unknown' when dpkg cannot tell)."""
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package],
            capture_output=True, text=True, timeout=20,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    changelog = Path("/usr/share/doc") / package / "changelog.Debian.gz"
    if changelog.is_file():
        with gzip.open(changelog, "rt", errors="replace") as f:
            m = re.match(r"\S+ \(([^)]+)\)", f.readline())
            if m:
                return m.group(1)
    return "unknown"


def _require_dir(path: Path, package: str) -> Path:
    if not Path(path).is_dir():
        raise SourceMissingError(
            f"{path} not found: install the Debian package {package} "
            f"(apt-get install {package})"
        )
    return Path(path)




# --------------------------------------------------------------------------------------
# Qt resource archives (rcc)

RCC_COMPRESSED_ZLIB = 0x01
RCC_DIRECTORY = 0x02
RCC_COMPRESSED_ZSTD = 0x04


@dataclass(frozen=True)
class RccEntry:
    path: str
    flags: int
    offset: int      # of the payload (after the 4-byte length) in the archive
    size: int        # stored (possibly compressed) size
    locale: Tuple[int, int] = (0, 0)   # (territory, language)


class RccArchive:
    """Read-only view of a binary Qt resource file (``rcc -binary`` output).

    Layout (all integers big-endian): header ``"qres"``, format version (u32), offsets (u32) of
    the tree, data and names sections, and (version >= 3) a u32 of global flags. The tree is an
    array of nodes; node 0 is the root directory. A node holds the name offset (u32) and flags
    (u16), then for a directory the child count and first child index (u32, u32), for a file
    the territory and language (u16, u16) and the data offset (u32); version >= 2 appends a
    u64 modification time, so nodes are 14 or 22 bytes long. A name is a u16 length in UTF-16
    code units, a u32 hash, then the UTF-16BE text. A payload is a u32 length then the bytes;
    zlib-compressed ones start with the u32 uncompressed length (``qCompress`` format),
    zstd-compressed ones are a zstd frame.
    """

    def __init__(self, data: bytes, name: str = "<rcc>"):
        self.data = data
        self.name = name
        if len(data) < 20 or data[:4] != b"qres":
            raise InputError(f"{name} is not a Qt resource file (no 'qres' header)")
        self.version, self.tree_off, self.data_off, self.names_off = struct.unpack_from(">IIII", data, 4)
        if self.version not in (1, 2, 3):
            raise InputError(f"{name}: unsupported rcc format version {self.version}")
        self.overall_flags = struct.unpack_from(">I", data, 20)[0] if self.version >= 3 else 0
        self.node_size = 14 if self.version == 1 else 22
        for label, off in (("tree", self.tree_off), ("data", self.data_off), ("names", self.names_off)):
            if off >= len(data):
                raise InputError(f"{name}: {label} section offset {off} lies past the end of the file")
        self.entries: Dict[str, RccEntry] = {}
        self._walk(0, "", depth=0, seen=set())

    @classmethod
    def open(cls, path) -> "RccArchive":
        path = Path(path)
        return cls(path.read_bytes(), name=path.name)

    def _check(self, off: int, length: int, what: str) -> None:
        if off < 0 or off + length > len(self.data):
            raise InputError(f"{self.name} is truncated or damaged ({what} at byte {off})")

    def _name(self, offset: int) -> str:
        pos = self.names_off + offset
        self._check(pos, 6, "name")
        (n,) = struct.unpack_from(">H", self.data, pos)
        self._check(pos + 6, 2 * n, "name text")
        return self.data[pos + 6: pos + 6 + 2 * n].decode("utf-16-be")

    def _walk(self, index: int, prefix: str, depth: int, seen: set) -> None:
        if depth > 64 or index in seen:
            raise InputError(f"{self.name}: resource tree has a cycle or is too deep")
        seen.add(index)
        base = self.tree_off + index * self.node_size
        self._check(base, self.node_size, "tree node")
        name_off, flags = struct.unpack_from(">IH", self.data, base)
        name = "" if index == 0 else self._name(name_off)
        if flags & RCC_DIRECTORY:
            count, first = struct.unpack_from(">II", self.data, base + 6)
            child_prefix = f"{prefix}{name}/" if index else ""
            for child in range(first, first + count):
                self._walk(child, child_prefix, depth + 1, seen)
            return
        territory, language, data_off = struct.unpack_from(">HHI", self.data, base + 6)
        pos = self.data_off + data_off
        self._check(pos, 4, "data length")
        (size,) = struct.unpack_from(">I", self.data, pos)
        self._check(pos + 4, size, "data")
        path = prefix + name
        self.entries.setdefault(path, RccEntry(path, flags, pos + 4, size, (territory, language)))

    def __contains__(self, path: str) -> bool:
        return path.lstrip("/") in self.entries

    def names(self) -> List[str]:
        return sorted(self.entries)

    def read(self, path: str) -> bytes:
        entry = self.entries.get(path.lstrip("/"))
        if entry is None:
            raise KeyError(f"{path} not in {self.name}")
        raw = self.data[entry.offset: entry.offset + entry.size]
        if entry.flags & RCC_COMPRESSED_ZSTD:
            try:
                import zstandard  # type: ignore
            except ImportError as exc:  # pragma: no cover - no zstd entries in the shipped data
                raise EngineError(
                    f"{self.name}:{path} is zstd-compressed: pip install zstandard to read it"
                ) from exc
            return zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 30)
        if entry.flags & RCC_COMPRESSED_ZLIB:
            if len(raw) < 4:
                raise InputError(f"{self.name}:{path}: compressed entry too short")
            (expected,) = struct.unpack_from(">I", raw, 0)
            try:
                out = zlib.decompress(raw[4:])
            except zlib.error as exc:
                raise InputError(f"{self.name}:{path}: damaged zlib data ({exc})") from exc
            if len(out) != expected:
                raise InputError(f"{self.name}:{path}: expected {expected} bytes, got {len(out)}")
            return out
        return raw


# --------------------------------------------------------------------------------------
# licence notes


def parse_licence_notes(text: str) -> Dict[str, Dict[str, str]]:
    """Parse the DEP-5-like README notes of GCompris resources.

    Stanzas are separated by blank lines and have ``Key: value`` fields (Copyright, License,
    Source, Comment(s), Files); values may continue on indented lines, and the file names of
    ``Files`` may also follow as bare lines. Returns file name -> fields.
    """
    result: Dict[str, Dict[str, str]] = {}
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        fields: Dict[str, str] = {}
        files: List[str] = []
        key = None
        for line in block.split("\n"):
            if not line.strip():
                continue
            m = re.match(r"^([A-Za-z][A-Za-z-]*):\s*(.*)$", line)
            if m and not line.startswith((" ", "\t")):
                key = m.group(1).lower()
                value = m.group(2).strip()
                if key == "files":
                    files.extend(value.split())
                else:
                    fields[key] = value
            elif key == "files":
                files.extend(line.split())
            elif re.fullmatch(r"\s*[\w.+-]+\.[A-Za-z0-9]{2,5}\s*", line):
                files.append(line.strip())   # a bare file list without a Files: header
                key = "files"
            elif key is not None:
                fields[key] = (fields.get(key, "") + " " + line.strip()).strip()
        for name in files:
            result[name] = dict(fields)
    return result


@dataclass
class CopyrightStanza:
    patterns: List[str]
    copyright: str
    licence: str


def parse_debian_copyright(text: str) -> List[CopyrightStanza]:
    """Files stanzas of a machine-readable Debian copyright file, in file order."""
    stanzas = []
    for block in re.split(r"\n\s*\n", text):
        fields: Dict[str, str] = {}
        key = None
        for line in block.split("\n"):
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line.strip()
                continue
            m = re.match(r"^([A-Za-z-]+):\s*(.*)$", line)
            if m:
                key = m.group(1).lower()
                fields[key] = m.group(2).strip()
        if "files" in fields:
            stanzas.append(CopyrightStanza(
                patterns=fields["files"].split(),
                copyright=fields.get("copyright", "").split("\n")[0],
                licence=fields.get("license", "").split("\n")[0],
            ))
    return stanzas


def copyright_for(path: str, stanzas: Sequence[CopyrightStanza]) -> Optional[CopyrightStanza]:
    """The last stanza whose Files pattern matches ``path`` (DEP-5 rule)."""
    hit = None
    for stanza in stanzas:
        if any(fnmatch.fnmatchcase(path, pat) for pat in stanza.patterns):
            hit = stanza
    return hit


# --------------------------------------------------------------------------------------
# Tux Paint stamps


def read_stamp_caption(txt: Path) -> Optional[str]:
    """English caption of a Tux Paint stamp: the first line of its .txt that is not a translation."""
    if not txt.is_file():
        return None
    for line in txt.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if line and not re.match(r"^[A-Za-z_@]+\.utf8=", line):
            return line
    return None


def tuxpaint_stamps(root: Optional[Path] = None, include_cartoons: bool = False) -> Iterator[PhotoRecord]:
    """PNG stamps of ``tuxpaint-stamps-default``; ``cartoon/`` folders are skipped by default."""
    root = _require_dir(Path(root) if root else tuxpaint_dir(), TUXPAINT_PACKAGE)
    version = debian_version(TUXPAINT_PACKAGE)
    licence, author = "GPL-2", "Bill Kendrick and the Tux Paint contributors"
    copyright_file = Path("/usr/share/doc") / TUXPAINT_PACKAGE / "copyright"
    if copyright_file.is_file():
        hit = copyright_for("stamps/x.png", parse_debian_copyright(copyright_file.read_text(errors="replace")))
        if hit and hit.licence:
            licence = hit.licence
    for png in sorted(root.rglob("*.png")):
        rel = png.relative_to(root)
        if not include_cartoons and "cartoon" in rel.parts:
            continue
        yield PhotoRecord(
            source=TUXPAINT_PACKAGE, version=version, ref=str(rel.as_posix()),
            labels=tuple(rel.parts[:-1]), licence=licence, path=png,
            caption=read_stamp_caption(png.with_suffix(".txt")), author=author,
        )


# --------------------------------------------------------------------------------------
# GCompris


def _note_for(name: str, notes: Dict[str, Dict[str, Dict[str, str]]]) -> Optional[Dict[str, str]]:
    """Licence note of ``name`` from the README of its folder or of an ancestor folder
    (there the file is listed by its path relative to that folder)."""
    parts = name.split("/")
    for cut in range(len(parts) - 1, 0, -1):
        folder, rel = "/".join(parts[:cut]), "/".join(parts[cut:])
        hit = notes.get(folder, {}).get(rel)
        if hit:
            return hit
    return None


def gcompris_images(rcc_dir: Optional[Path] = None, cache: Optional[Path] = None) -> Iterator[PhotoRecord]:
    """Raster images inside the GCompris resource archives, extracted to the cache.

    Labels are the folders under ``src/activities`` (activity name first). The licence comes
    from the README notes next to the file in the archive, else from the Debian copyright file.
    """
    rcc_dir = _require_dir(Path(rcc_dir) if rcc_dir else gcompris_rcc_dir(), GCOMPRIS_PACKAGE)
    version = debian_version(GCOMPRIS_PACKAGE)
    cache = Path(cache) if cache else source_cache(f"{GCOMPRIS_PACKAGE}-{version}")
    copyright_file = Path("/usr/share/doc") / GCOMPRIS_PACKAGE / "copyright"
    stanzas = parse_debian_copyright(copyright_file.read_text(errors="replace")) if copyright_file.is_file() else []
    for rcc_path in sorted(rcc_dir.glob("*.rcc")):
        archive = RccArchive.open(rcc_path)
        notes: Dict[str, Dict[str, Dict[str, str]]] = {}
        for name in archive.names():
            if name.rsplit("/", 1)[-1].upper().startswith("README"):
                folder = name.rsplit("/", 1)[0]
                notes[folder] = parse_licence_notes(archive.read(name).decode("utf-8", "replace"))
        for name in archive.names():
            if not name.lower().endswith(RASTER_EXTENSIONS):
                continue
            note = _note_for(name, notes)
            src_path = name.split("/", 1)[1] if name.startswith("gcompris/") else name
            if note and note.get("license"):
                licence, author = note["license"], note.get("copyright") or None
                url = note.get("source") or None
            else:
                hit = copyright_for(src_path, stanzas)
                licence = hit.licence if hit and hit.licence else "GPL-3+"
                author = hit.copyright if hit else None
                url = None
            target = cache / rcc_path.stem / name
            if not target.is_file():
                _atomic_write(target, archive.read(name))
            parts = src_path.split("/")
            labels = tuple(p for p in parts[2:-1] if p not in ("resource", "images", "image")) \
                if parts[:2] == ["src", "activities"] else tuple(parts[:-1])
            extra = {"comment": note.get("comment") or note.get("comments", "")} if note else {}
            yield PhotoRecord(
                source=GCOMPRIS_PACKAGE, version=version, ref=f"{rcc_path.name}:/{name}",
                labels=labels, licence=licence, path=target, caption=None, author=author,
                url=url, extra=extra,
            )


# --------------------------------------------------------------------------------------
# Saleor wheel


def saleor_wheel(cache: Optional[Path] = None, download: bool = True) -> Path:
    """Path of the saleor wheel in the cache, downloaded with ``pip download`` if absent."""
    cache = Path(cache) if cache else source_cache("saleor")
    name = f"saleor-{SALEOR_VERSION}-py3-none-any.whl"
    wheel = cache / name
    if wheel.is_file():
        return wheel
    if not download:
        raise SourceMissingError(f"{name} is not in {cache}; run: pip download --no-deps "
                                 f"--python-version 3.8 --only-binary=:all: saleor=={SALEOR_VERSION} -d {cache}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--python-version", "3.8",
           "--only-binary=:all:", f"saleor=={SALEOR_VERSION}", "-d", str(cache)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0 or not wheel.is_file():
        raise SourceMissingError(
            f"could not download the saleor {SALEOR_VERSION} wheel (needs PyPI): "
            f"{' '.join(cmd)}\n{out.stderr.strip()[-400:]}"
        )
    return wheel


def saleor_products(cache: Optional[Path] = None, download: bool = True) -> Iterator[PhotoRecord]:
    """Product photos of the Saleor demo shop (BSD-3-Clause), named from its populatedb data."""
    cache = Path(cache) if cache else source_cache("saleor")
    wheel = saleor_wheel(cache, download=download)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        licence_text = ""
        lic_name = f"saleor-{SALEOR_VERSION}.dist-info/LICENSE"
        if lic_name in names:
            licence_text = zf.read(lic_name).decode("utf-8", "replace")
        licence = "BSD-3-Clause" if "BSD 3-Clause" in licence_text else "BSD-3-Clause (see wheel)"
        author_m = re.search(r"Copyright \(c\) ([^\n]+)", licence_text)
        author = author_m.group(1).strip() if author_m else "Mirumee Software"
        products = _saleor_product_names(zf) if "saleor/static/populatedb_data.json" in names else {}
        prefix = "saleor/static/placeholders/"
        for member in sorted(names):
            if not member.startswith(prefix) or not member.lower().endswith(RASTER_EXTENSIONS):
                continue
            rel = member[len(prefix):]
            target = cache / f"saleor-{SALEOR_VERSION}" / rel
            if not target.is_file():
                _atomic_write(target, zf.read(member))
            stem = rel.rsplit("/", 1)[-1].rsplit(".", 1)[0]
            product_name, category = products.get(stem, (None, None))
            labels = tuple(rel.split("/")[:-1]) + ((category,) if category else ())
            yield PhotoRecord(
                source="saleor", version=SALEOR_VERSION, ref=f"{wheel.name}:/{member}",
                labels=labels, licence=licence, path=target, caption=product_name, author=author,
            )


def _saleor_product_names(zf: zipfile.ZipFile) -> Dict[str, Tuple[str, Optional[str]]]:
    """Placeholder file stem -> (product name, category name) from populatedb_data.json."""
    rows = json.loads(zf.read("saleor/static/populatedb_data.json"))
    products = {r["pk"]: r["fields"] for r in rows if r.get("model") == "product.product"}
    categories = {r["pk"]: r["fields"].get("name") for r in rows if r.get("model") == "product.category"}
    out: Dict[str, Tuple[str, Optional[str]]] = {}
    for r in rows:
        if r.get("model") != "product.productimage":
            continue
        image = r["fields"].get("image", "")
        stem = image.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        stem = re.sub(r"_[A-Za-z0-9]{7}$", "", stem)   # Django's random de-duplication suffix
        product = products.get(r["fields"].get("product"))
        if product and stem not in out:
            out[stem] = (product.get("name"), categories.get(product.get("category")))
    return out


# --------------------------------------------------------------------------------------
# scikit-image and scikit-learn samples

SKIMAGE_PHOTOS = {
    # function name: (file, caption, labels)
    "chelsea": ("chelsea.png", "Chelsea the cat, a tabby cat", ("animals", "cat")),
    "coffee": ("coffee.png", "a cup of coffee on a saucer", ("food", "drinks")),
    "astronaut": ("astronaut.png", "the astronaut Eileen Collins", ("people",)),
    "rocket": ("rocket.jpg", "launch of a Falcon 9 rocket", ("vehicles", "space")),
    "hubble_deep_field": ("hubble_deep_field.jpg", "the Hubble deep field: galaxies in space", ("space",)),
    "camera": ("camera.png", "a photographer with a camera on a tripod", ("people",)),
    "coins": ("coins.png", "ancient Greek coins", ("household", "money")),
}


def _docstring_licence(doc: str) -> Optional[str]:
    """Licence stated in a ``skimage.data`` docstring, normalised; None when it states none."""
    text = " ".join((doc or "").split()).lower()
    if "cc0" in text:
        return "CC0-1.0"
    if "public domain" in text:
        return "Public domain"
    if "no known copyright restrictions" in text or "no copyright restrictions" in text:
        return "No known copyright restrictions"
    return None


def skimage_samples() -> Iterator[PhotoRecord]:
    try:
        import skimage
        import skimage.data as skdata
    except ImportError as exc:
        raise SourceMissingError("scikit-image is not installed: pip install scikit-image") from exc
    data_dir = Path(skdata.__file__).parent
    for func, (fname, caption, labels) in SKIMAGE_PHOTOS.items():
        path = data_dir / fname
        if not path.is_file():
            continue
        doc = getattr(skdata, func).__doc__ or ""
        licence = _docstring_licence(doc)
        if licence is None:   # no licence stated: not redistributable as a gallery photo
            continue
        author_m = re.search(r"photographer \(([^)]+)\)", doc)
        yield PhotoRecord(
            source="scikit-image", version=skimage.__version__, ref=f"skimage/data/{fname}",
            labels=labels, licence=licence, path=path, caption=caption,
            author=author_m.group(1) if author_m else None,
        )


def sklearn_samples() -> Iterator[PhotoRecord]:
    try:
        import sklearn
        import sklearn.datasets as skds
    except ImportError as exc:
        raise SourceMissingError("scikit-learn is not installed: pip install scikit-learn") from exc
    img_dir = Path(skds.__file__).parent / "images"
    notes: Dict[str, Dict[str, str]] = {}
    readme = img_dir / "README.txt"
    if readme.is_file():
        for block in re.split(r"\n\s*\n(?=Image:)", readme.read_text(errors="replace")):
            m = re.search(r"Image:\s*(\S+)", block)
            if not m:
                continue
            lic = re.search(r"^\[1\]\s*(\S+)", block, re.M)
            who = re.search(r"^\[2\]\s*(\S+)", block, re.M)
            src = re.search(r"^\[3\]\s*(\S+)", block, re.M)
            notes[m.group(1)] = {
                "licence": "CC-BY-2.0" if lic and "by/2.0" in lic.group(1) else (lic.group(1) if lic else "see README"),
                "author": who.group(1).rstrip("/").rsplit("/", 1)[-1] if who else "",
                "url": src.group(1) if src else "",
            }
    meta = {
        "china.jpg": ("a Chinese temple building with a pagoda roof", ("buildings",)),
        "flower.jpg": ("a pink flower in close-up", ("plants", "flower")),
    }
    for fname, (caption, labels) in meta.items():
        path = img_dir / fname
        if not path.is_file():
            continue
        note = notes.get(fname, {})
        yield PhotoRecord(
            source="scikit-learn", version=sklearn.__version__, ref=f"sklearn/datasets/images/{fname}",
            labels=labels, licence=note.get("licence", "CC-BY-2.0"), path=path, caption=caption,
            author=note.get("author") or None, url=note.get("url") or None,
        )
