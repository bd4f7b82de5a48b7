"""The page's default method is the engine's (engine.defaults, the same for the CLI and the JSON API), and its
line says how it was chosen."""
import html
import json


def test_the_page_offers_the_engines_default_method_and_says_how_it_was_chosen(gallery_engine):
    """The page's default is engine.default_method (chosen on held-out-domain validation by engine.defaults, the
    same for the CLI and the JSON API), never a method picked by the page itself; its line says how."""
    from demo.formatting import default_method_note
    from engine.labels import method_label as method_label_of

    method = gallery_engine.default_method
    assert method in gallery_engine.composers
    line = html.unescape(default_method_note(gallery_engine))  # as rendered
    assert line.startswith(f"Method in use: **{method_label_of(method)}**. Why: ")
    assert "\n" not in line and len(line) < 200  # one plain sentence; the figures are in "About this engine"
    json.dumps(gallery_engine.info()["default_method"])  # plain data for `engine info`
