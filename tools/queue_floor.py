#!/usr/bin/env python3
"""What Gradio's queue alone serves on this machine: the load test against an endpoint with the app's
``/search`` signature (9 inputs; a gallery of 12 static thumbnails, the explanation, the results JSON and the
ids as outputs) whose handler computes nothing and returns one precomputed real response.

Its requests/s is the ceiling the real app cannot pass however fast a search is; compare it with
``python -m engine loadtest`` run at the same time of day (docs/deploy.md, *Which route for which client*).
The server runs in this process, so the printed generator CPU is the server's and the clients' together.

``--no-queue`` registers the event with ``queue=False`` and calls it at ``POST /gradio_api/run/search`` (one
request, no event stream): what Gradio serves without its queue, with the same pre- and post-processing.

Usage: ``python tools/queue_floor.py [--clients 20] [--duration 20] [--warmup 5] [--concurrency 2] [--no-queue]``
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--no-queue", action="store_true", help="queue=False, called at /gradio_api/run/search")
    args = p.parse_args(argv)

    import gradio as gr

    from demo.formatting import explanation_markdown, gallery_items
    from demo.launch import serve_in_process
    from demo.ui import allowed_paths
    from engine import images
    from engine.config import Settings
    from engine.loadtest import gallery_images, run_load
    from engine.search import search
    from engine.service import load_default_engine

    settings = Settings()
    images.configure(settings)  # the decode budget app.py sets
    engine = load_default_engine(settings)
    r = search(engine, image=0, text="at night", k=12, explain=True, exclude_reference=True)  # gallery item 0
    reply = (gallery_items(engine, r), explanation_markdown(r), json.dumps(r.to_json(), indent=2),
             [x.id for x in r.results])
    gr.set_static_paths(allowed_paths(engine))
    with gr.Blocks(analytics_enabled=False) as demo:
        inputs = [gr.Image(type="filepath"), gr.Textbox(), gr.Textbox(), gr.Number(), gr.Number(), gr.Checkbox(),
                  gr.Textbox(), gr.Number(), gr.Checkbox()]
        outputs = [gr.Gallery(), gr.Markdown(), gr.Code(language="json"), gr.State([])]
        if args.no_queue:
            gr.Button().click(lambda *a: reply, inputs, outputs, api_name="search", queue=False)
        else:
            gr.Button().click(lambda *a: reply, inputs, outputs, api_name="search",
                              concurrency_limit=args.concurrency)
    demo.queue(max_size=64, status_update_rate="auto", api_open=False)
    url = serve_in_process(demo, engine, settings)  # the app's server options (demo/launch.py), a stripped page
    try:
        if args.no_queue:
            run_without_queue(url, args.clients, args.duration, args.warmup)
        else:
            run_load(url, args.clients, args.duration, os.getpid(),
                     gallery_images(settings.gallery), ["sum", "image", "text"], warmup=args.warmup)
    finally:
        demo.close()
    return 0


def run_without_queue(url: str, clients: int, duration: float, warmup: float) -> None:
    """``clients`` threads POST the text query to ``/gradio_api/run/search`` in a loop; prints the figures."""
    import threading
    import time

    from engine.loadtest import ApiClient, load_average, percentile

    t0 = time.perf_counter()
    start, end = t0 + warmup, t0 + warmup + duration
    lat, errors, lock = [], [], threading.Lock()

    def loop():
        client = ApiClient(url)
        while time.perf_counter() < end:
            t = time.perf_counter()
            try:
                out = client.post_json("/gradio_api/run/search",
                                       {"data": [None, "at night", "text", 0.5, 12, False, "none", 64, True]})
                if not out["data"][2]:
                    raise RuntimeError("empty reply")
                done = time.perf_counter()
                if start <= done <= end:
                    with lock:
                        lat.append((done - t) * 1e3)
            except Exception as exc:  # noqa: BLE001 - every failure counts
                with lock:
                    errors.append(repr(exc)[:200])
        client.close()

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    for th in threads:
        th.start()
    time.sleep(max(0.0, start - time.perf_counter()))
    cpu0, loads = time.process_time(), [load_average()]
    for th in threads:
        th.join()
    loads.append(load_average())
    print(f"route              POST /gradio_api/run/search (queue=False)\nclients            {clients}")
    print(f"requests           {len(lat)} in the measured window ({len(lat) / duration:.2f} requests/s)")
    print(f"errors             {len(errors)}")
    print(f"latency (ms)       p50 {percentile(lat, 50):.1f}  p95 {percentile(lat, 95):.1f}")
    print(f"server + clients   {(time.process_time() - cpu0) / duration:.2f} cores (one process)")
    print(f"load average       {' -> '.join(loads)}")


if __name__ == "__main__":
    sys.exit(main())
