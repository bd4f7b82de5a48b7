"""Serve a demo in-process on a free loopback port, with app.py's options (``demo.launch.launch_options``)."""
from __future__ import annotations

from demo.launch import serve_in_process


def launch(demo, engine) -> str:
    return serve_in_process(demo, engine)
