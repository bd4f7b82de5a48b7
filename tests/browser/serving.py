"""Serve a demo in-process on a free loopback port."""
from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(demo, engine) -> str:
    from demo.ui import CSS, HEAD, allowed_paths

    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                allowed_paths=allowed_paths(engine), css=CSS, head=HEAD)  # as app.py launches it
    return f"http://127.0.0.1:{port}/"
