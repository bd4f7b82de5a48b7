"""`python -m engine bench`: figures for docs/BENCHMARKS.md, measured in one run on this machine.

Sections (``--only`` picks some; every module of :mod:`engine.bench` registers its own in ``SECTIONS``):
query (per-stage latency per composer/expander, cache speed-up), memory (bytes per gallery item), compare,
indexing (throughput vs the backbone's raw forward pass), ann (search latency and recall@10 per index type at
100k / 1M synthetic vectors), startup, info, loadtest, expanders, ics, context-i2w, integrity, prepare-cost,
text-batch. ``ics`` and ``loadtest`` are long and run only when named.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..config import ROOT, Settings
from ..process import configure_process
from ..fileio import atomic_write_text
from ..reports import merge_sections
from ..sysinfo import machine
from .base import HEAVY, SECTIONS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine bench", description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help="comma-separated sections: " + ",".join(SECTIONS))
    p.add_argument("--skip", default="", help="comma-separated sections to skip")
    p.add_argument("--queries", type=int, default=30)
    p.add_argument("--sizes", default="100000,1000000", help="synthetic gallery sizes for the ANN section")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--ann-queries", type=int, default=200)
    p.add_argument("--index-types", default="flat,ivf,hnsw,ivfpq")
    p.add_argument("--hnsw-max", type=int, default=200_000, help="largest synthetic gallery to build HNSW for "
                   "(1M takes over 15 min on 2 loaded cores)")
    p.add_argument("--ivfpq-max", type=int, default=1_000_000, help="largest synthetic gallery to build IVF-PQ "
                   "for (1M: 4096 cells, about 2 min to build on 2 quiet cores)")
    p.add_argument("--hnsw-efc", default="40,80", help="HNSW efConstruction values compared at the smallest size")
    p.add_argument("--hnsw-ef-search", default="16,32,64,128", help="HNSW efSearch values measured")
    p.add_argument("--ics-million-only", action="store_true", help="ics section: only the 1M speed table (a few "
                   "minutes), keeping the mAP / recall tables of the last full run in --out")
    p.add_argument("--ics-threads", type=int, default=1, help="ics section: cores the compact indexes' Hamming "
                   "scan is split over (the rest of a query runs on one)")
    p.add_argument("--ics-bits", default="16,32,64,128", help="ics section: code lengths compared")
    p.add_argument("--ics-epochs", type=int, default=8, help="ics section: training epochs of each hash head")
    p.add_argument("--ics-train", type=int, default=60000, help="ics section: Fashion-MNIST images to train on "
                   "(the 10,000 test images are the queries and the rest of the gallery)")
    p.add_argument("--ics-queries", type=int, default=1000, help="ics section: queries of the mAP and recall tables")
    p.add_argument("--ics-multilabel", default="packaged", help="ics section: backbone of the multi-label table "
                   "('' = no such table)")
    p.add_argument("--index-images", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--compare-repeats", type=int, default=3, help="compare section: timed runs (the median counts)")
    p.add_argument("--expander-gallery", type=int, default=10000, help="expanders section: synthetic gallery size")
    p.add_argument("--expander-queries", type=int, default=100, help="expanders section: queries")
    p.add_argument("--loadtest-clients", type=int, default=20)
    p.add_argument("--loadtest-duration", type=float, default=45.0, help="loadtest section: seconds of load")
    p.add_argument("--loadtest-warmup", type=float, default=60.0, help="loadtest section: seconds of load before "
                   "the measured window")
    p.add_argument("--loadtest-compute-seconds", type=float, default=8.0, help="loadtest section: seconds of the "
                   "single-query measurement that gives the compute limit")
    p.add_argument("--prepare-archs", default="tiny-vit-a,ViT-B-32,ViT-L-14", help="prepare-cost section: "
                   "open_clip architectures measured")
    p.add_argument("--text-batches", default="1,2,4,8,16", help="text-batch section: batch sizes")
    p.add_argument("--text-repeats", type=int, default=15, help="text-batch section: forward passes per batch size")
    p.add_argument("--out", default=str(ROOT / "docs" / "BENCHMARKS.md"), help="markdown file to write ('' = none)")
    p.add_argument("--json", default="", help="also write the raw figures as JSON here")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.index_types = [s for s in args.index_types.split(",") if s]
    args.hnsw_efc = [int(s) for s in args.hnsw_efc.split(",") if s]
    args.hnsw_ef_search = [int(s) for s in args.hnsw_ef_search.split(",") if s]
    args.ics_bits = [int(s) for s in args.ics_bits.split(",") if s]
    args.text_batches = [int(s) for s in args.text_batches.split(",") if s]
    args.prepare_archs = [s for s in args.prepare_archs.split(",") if s]
    names = [n for n in SECTIONS if n not in HEAVY]
    if args.only:
        names = [n for n in args.only.split(",") if n]
    names = [n for n in names if n not in set(args.skip.split(","))]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown bench section {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    from ..service import load_default_engine

    settings = Settings()
    configure_process(settings)
    ctx = {"engine": load_default_engine(settings), "settings": settings}
    parts = [f"# Benchmarks\n\nWritten by `python -m engine bench` on {time.strftime('%Y-%m-%d')}.\n\n"
             f"**Machine:** {machine()}\n\nRatios are measured within one run; the machine is shared and noisy."]
    raw = {}
    for name in names:
        fn = SECTIONS.get(name)
        print(f"[bench] {name} ...", flush=True)
        t = time.perf_counter()
        md, data = fn(args, ctx)
        print(md, flush=True)
        print(f"[bench] {name} took {time.perf_counter() - t:.0f} s", flush=True)
        # each section carries its own date and machine, so `--only X` rewrites X's line with X
        parts.append(f"## {name}\n\n_Measured {time.strftime('%Y-%m-%d')} on {machine()}._\n\n{md}")
        raw[name] = data
    text = "\n\n".join(parts) + "\n"
    if args.out:
        out = Path(args.out)
        if out.exists() and args.only:
            text = merge_sections(out.read_text(), parts[1:])
        atomic_write_text(out, text)
        print(f"[bench] wrote {out}")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(raw, indent=2, default=float))
    return 0

