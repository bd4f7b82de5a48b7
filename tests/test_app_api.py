"""The named Gradio API endpoint `search`, called through gradio_client against a launched app."""
import json

import pytest


def test_search_endpoint_through_gradio_client(app_server, gallery_engine, gallery_labels):
    from gradio_client import Client, handle_file

    client = Client(app_server, verbose=False)
    assert "/search" in client.view_api(return_format="dict")["named_endpoints"]
    gallery, explanation, raw, = client.predict(None, "a photo of a cat", "text", 0.5, 4, False, "none", 64,
                                                api_name="/search")
    data = json.loads(raw)
    assert len(gallery) == 4 and len(data["results"]) == 4
    from engine.search import search

    direct = search(gallery_engine, text="a photo of a cat", method="text", k=4)   # the engine's own answer
    assert [r["id"] for r in data["results"]] == [r.id for r in direct.results]
    assert "cat" in gallery_labels[data["results"][0]["path"]]
    assert [r["rank"] for r in data["results"]] == [1, 2, 3, 4]
    assert "Timings" in explanation
    # the one contract (engine.query): k out of range is clamped and said, as on every other route
    from engine.query import K_MAX, limit_sentence

    _, _, raw = client.predict(None, "a photo of a cat", "text", 0.5, 100000, False, "none", 0, api_name="/search")
    assert json.loads(raw)["notices"][0] == f"{limit_sentence('k')}; 100000 was changed to {K_MAX}."

    ref = str(gallery_engine.index.image_path(7))
    # a gallery photo as the reference is left out of its own results by default (8 arguments, as before) ...
    gallery, _, raw = client.predict(handle_file(ref), "", "image", 0.5, 3, False, "none", 64, api_name="/search")
    ids = [r["id"] for r in json.loads(raw)["results"]]
    assert 7 not in ids and len(ids) == len(gallery) == 3
    # ... and kept when the 9th argument (leave the reference out) is False: image-only finds it first
    _, _, raw = client.predict(handle_file(ref), "", "image", 0.5, 3, False, "none", 64, False, api_name="/search")
    assert json.loads(raw)["results"][0]["id"] == 7
    # compare mode follows the same switch
    import re

    shown = lambda html: {int(i) for i in re.findall(r'data-id="(\d+)"', html)}  # noqa: E731
    html, _ = client.predict(handle_file(ref), "", 0.5, 3, False, 64, api_name="/compare")
    assert shown(html) and 7 not in shown(html)
    html, _ = client.predict(handle_file(ref), "", 0.5, 3, False, 64, False, api_name="/compare")
    assert 7 in shown(html)


def test_api_errors_are_clear_and_server_survives(app_server):
    from gradio_client import Client

    client = Client(app_server, verbose=False)
    with pytest.raises(Exception, match="give a reference image"):
        client.predict(None, "   ", "sum", 0.5, 3, False, "none", 64, api_name="/search")
    gallery, _, _ = client.predict(None, "a red apple", "text", 0.5, 2, False, "none", 64, api_name="/search")
    assert len(gallery) == 2


def test_upload_tab_builds_a_compact_ics_index(app_server, gallery_engine, tmp_path, monkeypatch):
    """The upload tab's index menu offers the shipped ICS checkpoints; an ics-64 gallery stores 8 bytes
    of codes per image and still finds the reference photo first (Hamming short-list, then re-rank)."""
    import zipfile
    from pathlib import Path

    from gradio_client import Client, handle_file

    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    photos = sorted((Path(__file__).resolve().parents[1] / "assets" / "gallery").rglob("*.jpg"))[:12]
    with zipfile.ZipFile(tmp_path / "p.zip", "w") as z:
        for i, p in enumerate(photos):
            z.write(p, f"p{i:02d}.jpg")
    from engine.errors import InputError
    from engine.service import build_session_engine

    with pytest.raises(InputError, match="not available"):
        build_session_engine(tmp_path / "p.zip", gallery_engine, index_type="ics-12")
    client = Client(app_server, verbose=False)
    with pytest.raises(Exception, match="not in the list of choices"):
        client.predict(handle_file(str(tmp_path / "p.zip")), "ics-12", api_name="/index_zip")
    status = client.predict(handle_file(str(tmp_path / "p.zip")), "ics-64", api_name="/index_zip")
    assert "**12**" in status and "`ics-64`" in status and "8 bytes per image" in status
    _, _, raw = client.predict(handle_file(str(photos[5])), "", "image", 0.5, 3, False, "none", 64, False,
                               api_name="/search_own")
    assert json.loads(raw)["results"][0]["path"] == "p05.jpg"
