"""`python -m engine info`: answered without loading a model; method status in plain words."""
import json
import subprocess
import sys

from engine import cli


def test_info_loads_no_model_unless_asked():
    code = ("import sys, runpy; sys.argv = ['engine', 'info']\n"
            "try:\n    runpy.run_module('engine', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('transformers', 'open_clip', 'faiss', 'sentence_transformers') if m in sys.modules]\n"
            "print('HEAVY=' + ','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.strip().splitlines()[-1] == "HEAVY="
    info = json.loads(out[: out.rindex("HEAVY=")])
    assert info["backbone"]["loaded"] is False
    assert {"image", "text", "sum", "rtic", "context-i2w"} <= set(info["composers"])
    assert "lattqe" in info["expanders"]


def test_info_index_says_available_or_why(gallery_engine, capsys):
    status = gallery_engine.method_status()
    assert status["image"] == "available" and status["text"] == "available"
    assert all(isinstance(v, str) and v for v in status.values())
    for name, reason in gallery_engine.methods().items():
        assert status[name] == (reason or "available")


def test_index_gallery_means_the_demo_index(gallery_index_dir, packaged, monkeypatch):
    from engine.config import Settings
    from engine.search import open_engine

    s = Settings()
    monkeypatch.setattr(Settings, "resolved_index_dir", lambda self: gallery_index_dir)
    eng = open_engine("gallery", backbone=packaged, settings=s)
    assert len(eng.index.items) > 0
    assert cli.build_parser().parse_args(["search", "--index", "gallery", "--text", "x"]).index == "gallery"


def test_explanation_reuses_the_composers_text_embedding(gallery_engine, monkeypatch):
    from engine.search import search

    calls = []
    real = gallery_engine.backbone.encode_texts
    monkeypatch.setattr(gallery_engine.backbone, "encode_texts", lambda texts, *a, **kw: calls.append(texts) or real(texts, *a, **kw))
    resp = search(gallery_engine, image=0, text="at night", method="sum", k=5, explain=True)
    assert calls == [["at night"]]                    # one encode: the composer's, reused by the explanation
    direct = real(["at night"]).embeddings[0].float().numpy()
    ids = [r.id for r in resp.results]
    g = gallery_engine.index.embeddings[ids].astype("float32")
    for r, v in zip(resp.results, g):
        assert abs(r.explain["text_similarity"] - float(v @ direct)) < 1e-5


def test_cli_leaves_the_reference_out_unless_kept(gallery_index_dir, capsys):
    assert cli.main(["search", "--index", str(gallery_index_dir), "--image", "gallery:3", "--method", "image",
                     "--k", "3", "--json", "--backbone", "packaged"]) == 0
    ids = [r["id"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert 3 not in ids and len(ids) == 3
    assert cli.main(["search", "--index", str(gallery_index_dir), "--image", "gallery:3", "--method", "image",
                     "--k", "3", "--json", "--keep-reference", "--backbone", "packaged"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["id"] == 3
