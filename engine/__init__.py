"""Composed image search engine: backbones, composers, expanders, indexes and the search function.

Nothing in this package imports gradio; the demo in ``demo/`` is a thin layer over it.
"""

__version__ = "0.1.0"
