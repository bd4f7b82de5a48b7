"""The first-search 403 (issue #16): two Gradio servers on one machine share Gradio's cache folder, and a
server that closes (a restart, a second copy of the app, the load test's own server) deletes every cached
copy it handed out, including those the other server's pages still show. Result thumbnails are therefore
served from the index's own thumbs folder (static paths), never from that cache."""
import json
from pathlib import Path
from urllib.parse import quote

import httpx


def _search(url: str) -> list:
    data = [None, "a photo of a cat", "text", 0.5, 6, False, "none", 64, True]
    r = httpx.post(f"{url}/gradio_api/call/search", json={"data": data}, timeout=60)
    r.raise_for_status()
    event = None
    with httpx.stream("GET", f"{url}/gradio_api/call/search/{r.json()['event_id']}", timeout=300) as s:
        for line in s.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "complete":
                return [item["image"]["path"] for item in json.loads(line.split(":", 1)[1])[0]]
    raise AssertionError(f"the search did not complete (last event {event})")


def test_thumbnails_survive_another_server_closing(gallery_engine, launch_demo):
    from demo.ui import build_demo

    thumbs = (Path(gallery_engine.index.folder) / "thumbs").resolve()
    first = build_demo(gallery_engine.settings, engine=gallery_engine)
    second = build_demo(gallery_engine.settings, engine=gallery_engine)
    url_a, url_b = launch_demo(first, gallery_engine), launch_demo(second, gallery_engine)
    try:
        paths_a, paths_b = _search(url_a), _search(url_b)
        assert paths_a == paths_b and len(paths_b) == 6
        assert all(Path(p).resolve().parent == thumbs for p in paths_b), paths_b  # the files themselves
        first.close()  # Gradio deletes the cached copies this server made when it closes
        for p in paths_b:
            assert httpx.get(f"{url_b}/gradio_api/file={quote(p)}", timeout=30).status_code == 200, p
    finally:
        first.close()
        second.close()
