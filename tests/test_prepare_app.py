"""CIS_PREPARE=on: the app prepares Context-I2W for the tiny backbone in the background while serving."""
import json
import time



def test_app_prepares_context_i2w_in_background(tmp_path, monkeypatch, tiny, small_gallery, launch_demo):
    import requests
    from gradio_client import Client, handle_file

    from demo.ui import build_demo
    from engine import background
    from engine.config import Settings
    from engine.index.build import index_source
    from engine.search import open_engine

    (tmp_path / "empty").mkdir()
    # the Settings app.py would build from CIS_PREPARE=on, CIS_PREPARE_PARTS, ..., passed in (no environment patch)
    s = Settings(backbone="tiny:tiny-vit-a", device="cpu", prepare="on", prepare_parts="context-i2w",
                 prepare_budget_min=1.0, prepared_dir=str(tmp_path / "prepared"),
                 checkpoints=str(tmp_path / "empty"), checkpoints_given=str(tmp_path / "empty"))
    index_source(small_gallery, tmp_path / "idx", tiny, settings=s)
    engine = open_engine(tmp_path / "idx", backbone=tiny, settings=s)
    assert "context-i2w" in engine.unavailable
    demo = build_demo(s, engine=engine)
    try:
        url = launch_demo(demo, engine)
        config = requests.get(f"{url}/config", timeout=30).json()
        shown = [c["props"].get("value", "") for c in config["components"]
                 if c.get("props", {}).get("elem_id") == "prepare-status"]
        assert len(shown) == 1 and "**Context-I2W**: preparing" in shown[0]
        client = Client(url, verbose=False)
        ref = handle_file(str(engine.index.image_path(0)))
        # searches keep working while the mapper trains
        _, _, raw = client.predict(ref, "in red", "sum", 0.5, 3, False, "none", 8, api_name="/search")
        assert len(json.loads(raw)["results"]) == 3
        bg = background.start_for(engine)
        deadline = time.time() + 600
        while bg.status.state.get("context-i2w") not in ("available", "failed") and time.time() < deadline:
            time.sleep(2)
        assert bg.status.state["context-i2w"] == "available", bg.status.error
        assert "**Context-I2W**: available" in bg.markdown()
        assert list((tmp_path / "prepared").glob("context_i2w-*.safetensors"))
        _, _, raw = client.predict(ref, "in red", "context-i2w", 0.5, 3, False, "none", 8, api_name="/search")
        data = json.loads(raw)
        assert len(data["results"]) == 3 and data["method"] == "context-i2w"
    finally:
        demo.close()
