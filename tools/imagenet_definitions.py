#!/usr/bin/env python3
"""Write ``assets/wordnet/imagenet-definitions.tsv``: one WordNet 3.0 definition per ImageNet class.

The packaged backbone's "definitions" bridge (``packaged:lite0+definitions``, engine/backbones/packaged.py) describes
each of the classifier's 1,000 classes by its name *and* its dictionary definition, so a word no class is named
after ("a barrier that holds back water", "a reservoir wall") can still reach the right classes. The class order and
WordNet ids are ImageNet's; the definitions are WordNet 3.0's glosses (Princeton University, licence in
``assets/wordnet/LICENSE``), read from the copy that ``timm`` (installed with ``open_clip_torch``) ships in its
package data (``timm/data/_info``). The table is written once and bundled, so a version of the backbone never
changes under a later timm.

Usage: ``python tools/imagenet_definitions.py [--out assets/wordnet/imagenet-definitions.tsv]``
"""
from __future__ import annotations

import argparse
import importlib.resources
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.fileio import atomic_write_text  # noqa: E402  (the project root is on the path only from here)

HEADER = ("# ImageNet-1k classes in the classifier's order: index<TAB>WordNet id<TAB>WordNet 3.0 definition.\n"
          "# Definitions: WordNet 3.0, Copyright 2006 by Princeton University (licence: LICENSE beside this file),\n"
          "# as shipped in timm's package data (timm/data/_info, Apache-2.0). Written by tools/imagenet_definitions.py.\n")


def _info(name: str) -> str:
    return importlib.resources.files("timm").joinpath("data", "_info", name).read_text(encoding="utf-8")


def rows() -> list:
    synsets = [s.strip() for s in _info("imagenet_synsets.txt").splitlines() if s.strip()]
    glosses = dict(line.split("\t", 1) for line in _info("imagenet_synset_to_definition.txt").splitlines() if "\t" in line)
    if len(synsets) != 1000:
        raise SystemExit(f"expected 1000 ImageNet synsets, found {len(synsets)}")
    out = []
    for i, wnid in enumerate(synsets):
        gloss = " ".join(glosses[wnid].split()).replace("\t", " ")
        out.append((i, wnid, gloss))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "assets" / "wordnet" / "imagenet-definitions.tsv"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, HEADER + "".join(f"{i}\t{w}\t{g}\n" for i, w, g in rows()))
    print(f"wrote {out} (1000 classes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
