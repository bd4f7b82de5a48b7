"""`python -m engine <command>`: the pipeline as stages usable alone (index, search, info, train, eval, bench)."""
from __future__ import annotations

import argparse
import errno
import importlib
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from .checkpoints import PARTS, inventory, search_path
from .config import Settings
from .errors import EngineError
from .query import DEFAULT_ALPHA, DEFAULT_K, SearchRequest, gallery_reference, limit_sentence

ANCHOR_FIT = ("engine.train.anchor_fit", "anchor a learned composer to the weighted sum (held-out validation)")


def trainers() -> dict:
    """`python -m engine train NAME`: name -> (module, help) of every learned part's trainer (read from its spec,
    engine.checkpoints.PARTS) and the anchor fit."""
    return {**{p.family: (p.trainer, p.what) for p in PARTS.values() if p.prepare is not None}, "anchor": ANCHOR_FIT}


def _add_backbone(p):
    p.add_argument("--backbone", default=None, help="auto | packaged[:lite0] | open_clip:ARCH/TAG | tiny[:cfg]")
    p.add_argument("--device", default=None, help="auto | cpu | cuda")


def _settings(args):
    from . import images  # Pillow, which `info` does not need

    s = Settings()
    images.configure(s)  # the process-wide decode budget (CIS_DECODE_BUDGET_MB)
    if getattr(args, "backbone", None):
        s.backbone = args.backbone
    if getattr(args, "device", None):
        s.device = args.device
    return s


def _info_bench() -> int:
    """Time ``python -m engine info`` against a bare ``import torch``, both in fresh processes, in one run."""
    def timed(argv):
        t = time.perf_counter()
        subprocess.run([sys.executable, *argv], check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t

    t_torch = timed(["-c", "import torch"])
    t_info = timed(["-m", "engine", "info"])
    t_torch2 = timed(["-c", "import torch"])        # after, too: the machine's load changes during the run
    base = (t_torch + t_torch2) / 2
    print(f"bare `import torch`: {base:.2f} s (runs: {t_torch:.2f}, {t_torch2:.2f})")
    print(f"`python -m engine info`: {t_info:.2f} s")
    print(f"info / import torch ratio {t_info / base:.2f} (limit 2.0)")
    return 0


def cmd_info(args) -> int:
    if args.bench:
        return _info_bench()
    s = _settings(args)
    out = {}
    if args.index:
        from .backbones import create_backbone
        from .search import open_engine

        eng = open_engine(args.index, settings=s,
                          backbone=create_backbone(s.backbone, s.device, settings=s) if args.backbone else None)
        out = eng.info()
    else:
        # answered without loading any model: what is asked for, what exists, what the machine has
        import torch

        from .backbones.factory import BACKBONES
        from .compose import COMPOSERS
        from .expand import EXPANDERS

        if args.load:
            from .backbones import create_backbone
            from .index.vectors import gpu_count

            out["backbone"] = create_backbone(s.backbone, s.device, settings=s).describe()
            out["faiss_gpus"] = gpu_count()
        else:
            out["backbone"] = {"requested": s.backbone, "device": s.device,
                               "loaded": False, "note": "add --load to load it and say which one is live and why"}
        out["cuda"] = torch.cuda.is_available()
        out["backbones"] = BACKBONES.names()
        out["composers"] = COMPOSERS.names()
        out["expanders"] = EXPANDERS.names()

        out["checkpoints"] = inventory(s.checkpoints, settings=s)  # every learned part on the search path, any backbone
    print(json.dumps(out, indent=2, default=str))
    return 0


def cmd_index(args) -> int:
    from .backbones import create_backbone
    from .index.build import index_source

    s = _settings(args)
    backbone = create_backbone(s.backbone, s.device, settings=s)
    if args.runner == "ray":
        from .index.ray_runner import build_index_ray

        opts = {"checkpoint_dir": search_path(s), "fingerprint": backbone.fingerprint,
                "memory_budget": s.index_memory_budget}
        idx = build_index_ray(args.source, args.out, backbone, settings=s, address=args.address,
                              index_type=args.index_type, batch_size=args.batch_size, workers=args.workers,
                              shard_size=args.shard_size, vector_options=opts, dba=args.dba, dba_k=args.dba_k)
    else:
        idx = index_source(args.source, args.out, backbone, index_type=args.index_type, batch_size=args.batch_size,
                           workers=args.workers, settings=s, dba=args.dba, dba_k=args.dba_k)
    stats = idx.stats()
    print(json.dumps(stats, indent=2))
    if idx.meta.get("skipped"):
        for sk in idx.meta["skipped"]:
            print(f"skipped {sk['path']}: {sk['reason']}", file=sys.stderr)
    return 0


def cmd_search(args) -> int:
    from .backbones import create_backbone
    from .search import open_engine, run

    image = gallery_reference(args.image)  # checked before anything loads: a bad id is one sentence
    s = _settings(args)
    eng = open_engine(args.index, settings=s, backbone=create_backbone(s.backbone, s.device, settings=s) if args.backbone else None,
                      index_type=args.index_type)
    req = SearchRequest.build(s.max_text_chars, image=image, text=args.text,
                              method=args.method, alpha=args.alpha, k=args.k, expand=args.expand, nqe=args.nqe or 0,
                              negative_text=args.negative, explain=args.explain, keep_reference=args.keep_reference)
    resp = run(eng, req)
    if args.json:
        print(json.dumps(resp.to_json(), indent=2))
    else:
        for n in resp.notices:
            print(f"note: {n}")
        if args.explain:
            from .export import format_explain

            print(format_explain(resp.to_json()))
        else:
            for r in resp.results:
                print(f"{r.rank:3d}  {r.score:.4f}  {r.path}  {r.caption}")
        print("timings (ms): " + ", ".join(f"{k}={v:.1f}" for k, v in resp.timings_ms.items()))
    return 0


def cmd_module(module: str, argv) -> int:
    mod = importlib.import_module(module)
    return int(mod.main(argv) or 0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine", description="Composed image search engine")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("info", help="backbone, device, index stats")
    _add_backbone(sp)
    sp.add_argument("--index", default=None, help="index folder to describe (`gallery`: the demo's own index)")
    sp.add_argument("--load", action="store_true", help="load the backbone (and FAISS) to say which one is live and why")
    sp.add_argument("--bench", action="store_true",
                    help="time `info` against a bare `import torch`, both in fresh processes")

    sp = sub.add_parser("index", help="index a folder or zip of images")
    sp.add_argument("source", help="folder or .zip of images; with --runner ray also a .txt list or .parquet/.csv of paths")
    sp.add_argument("--out", required=True, help="index folder")
    _add_backbone(sp)
    sp.add_argument("--index-type", default="auto", help="auto | flat | hnsw | ivf | ivfpq | ics-16/32/64/128")
    sp.add_argument("--batch-size", type=int, default=32)
    sp.add_argument("--workers", type=int, default=None)
    sp.add_argument("--dba", default=None, help="database-side augmentation variant: aqe | alpha-qe | lattqe")
    sp.add_argument("--dba-k", type=int, default=16, help="neighbours per gallery item for --dba")
    sp.add_argument("--runner", choices=("local", "ray"), default="local",
                    help="local (this machine) or ray (a Ray cluster; pip install -r requirements-scale.txt)")
    sp.add_argument("--address", default=None, help="--runner ray: cluster address (default: start a local one)")
    sp.add_argument("--shard-size", type=int, default=256, help="--runner ray: images per resumable shard")

    sp = sub.add_parser("search", help="search an index")
    sp.add_argument("--index", required=True, help="index folder (`gallery`: the demo's own index)")
    sp.add_argument("--image", default=None, help="reference image path, or gallery:ID")
    sp.add_argument("--text", default=None)
    sp.add_argument("--negative", default=None, help="negative text (sum method)")
    sp.add_argument("--method", default=None, help="image | text | sum | context-i2w | rtic (default: the engine's "
                    "default method, chosen on held-out-domain validation; `info` names it)")
    sp.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                    help=f"{limit_sentence('alpha')} (out of range: clamped, with a note)")
    sp.add_argument("--k", type=int, default=DEFAULT_K, help=f"{limit_sentence('k')} (out of range: clamped, with a note)")
    sp.add_argument("--expand", default="none", help="none | aqe | aqewd | alpha-qe | lattqe")
    sp.add_argument("--nqe", type=int, default=None, help="neighbours the expander uses (default: the value chosen "
                    "on validation for that expander, capped at 2%% of the gallery)")
    sp.add_argument("--index-type", default=None, help="override the index type at load time")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--explain", action="store_true", help="per-result image/text/composed similarity")
    sp.add_argument("--keep-reference", action="store_true",
                    help="keep the reference image among its own results (left out by default, as in CIRR)")
    _add_backbone(sp)

    for name, helptext in (("train", "train a learned part"),
                           ("prepare", "make every learned part available for a backbone"), ("eval", "evaluate"), ("bench", "benchmarks"),
                           ("compare", "run one query through every method"), ("loadtest", "load-test a server")):
        sp = sub.add_parser(name, help=helptext, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = [a for a in argv[:1] if a in ("-v", "--verbose")]
    rest = argv[len(verbose):]
    if rest and rest[0] in ("train", "eval", "bench", "compare", "loadtest", "prepare"):
        # these stages parse their own options
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s")
        argv = [*verbose, rest[0], "--", *rest[1:]]
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    if getattr(args, "rest", None) and args.rest[0] == "--":
        args.rest = args.rest[1:]
    try:
        if args.command == "train":
            known = trainers()
            if not args.rest or args.rest[0] not in known:
                print("usage: python -m engine train {" + ",".join(known) + "} [options]", file=sys.stderr)
                return 2
            return cmd_module(known[args.rest[0]][0], args.rest[1:])
        if args.command in ("eval", "bench", "compare", "loadtest", "prepare"):
            module = {"eval": "engine.eval.cli", "bench": "engine.bench", "compare": "engine.compare",
                      "loadtest": "engine.loadtest", "prepare": "engine.prepare"}[args.command]
            return cmd_module(module, args.rest)
        return {"info": cmd_info, "index": cmd_index, "search": cmd_search}[args.command](args)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = Path(getattr(args, "out", None) or exc.filename or ".")
        print(f"error: the disk holding {where.name or where} is full; nothing half-written was kept (finished "
              "work is reused on the next run): free some space and run the command again", file=sys.stderr)
        return 1
