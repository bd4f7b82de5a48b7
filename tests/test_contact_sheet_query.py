"""The contact sheet shows what was asked (reference image and text) and stays small (#28 point 7)."""
import json

import numpy as np
from PIL import Image

from engine import export as ex
from engine.search import search


def test_contact_sheet_shows_the_reference_and_the_text_and_is_small(gallery_engine, tmp_path):
    from demo.handlers import with_query

    eng = gallery_engine
    ref = eng.index.image_path(7)
    data = with_query(search(eng, image=7, text="at night", k=12).to_json(), str(ref), "at night")
    path = ex.export_contact_sheet(data, eng.index.display_path, tmp_path / "sheet.png")
    assert path.stat().st_size < 500_000
    img = Image.open(path)
    assert json.loads(img.text["cis:query"]) == [f"Reference: {ref.name}", "Text: at night"]
    assert img.height == ex.sheet_size([12], 4, 192, query=True)[1]
    # the reference's thumbnail is drawn in the query row, centred in its square: that region is the picture
    src = Image.open(ref).convert("RGB")
    src.thumbnail((ex.QUERY_H, ex.QUERY_H))
    x0 = ex.MARGIN + (ex.QUERY_H - src.width) // 2
    y0 = ex.MARGIN + ex.TITLE_H + (ex.QUERY_H - src.height) // 2
    row = np.asarray(img.convert("RGB").crop((x0, y0, x0 + src.width, y0 + src.height)), np.float32)
    assert row.std() > 10 and abs(row.mean() - np.asarray(src, np.float32).mean()) < 25
    # a compare run of every method stays under the budget too (saved with fewer colours, then smaller)
    from engine.compare import compare

    big = compare(eng, image=7, text="red", k=12, lattqe=False).to_json()
    assert len(ex.contact_sheet_png(ex.contact_sheet(big, eng.index.display_path))) <= ex.MAX_PNG_BYTES
