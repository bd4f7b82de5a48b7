"""Issue #27, checkpoint downloads (engine/fetch.py) against a real HTTP server on loopback: the budget
ends a slow download in one sentence, a redirect to another host is refused, and no ``.part`` file is left
after an error, after SIGTERM, or by an earlier process that was killed."""
import hashlib
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.errors import InputError
from engine.fetch import fetch_verified

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = os.urandom(256 * 1024)
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/ok.bin":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)
        elif self.path == "/slow.bin":  # 64 kB a quarter-second: 1 s for the whole file
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD) * 40))
            self.end_headers()
            try:
                for _ in range(40 * 4):
                    self.wfile.write(PAYLOAD[: 64 * 1024])
                    self.wfile.flush()
                    time.sleep(0.25)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif self.path == "/same-host":
            self.send_response(302)
            self.send_header("Location", "/ok.bin")
            self.end_headers()
        elif self.path == "/other-host":
            port = self.server.server_address[1]
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{port}/ok.bin")  # same machine, another host name
            self.end_headers()
        else:
            self.send_error(404)


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def parts(folder: Path) -> list:
    return [p.name for p in folder.iterdir() if ".part" in p.name] if folder.exists() else []


def test_download_and_same_host_redirect(server, tmp_path):
    got = fetch_verified(f"{server}/ok.bin", SHA, quiet=True, cache=tmp_path)
    assert got.read_bytes() == PAYLOAD
    again = fetch_verified(f"{server}/same-host", SHA, quiet=True, cache=tmp_path / "b")
    assert again.read_bytes() == PAYLOAD


def test_redirect_to_another_host_is_refused(server, tmp_path):
    with pytest.raises(InputError, match="redirects to another host \\(localhost\\)"):
        fetch_verified(f"{server}/other-host", SHA, quiet=True, cache=tmp_path)
    assert parts(tmp_path) == [] and not any(tmp_path.iterdir())


def test_budget_ends_a_slow_download_in_one_sentence(server, tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="did not finish within the budget") as err:
        fetch_verified(f"{server}/slow.bin", SHA, quiet=True, cache=tmp_path, deadline=time.perf_counter() + 1.0)
    assert time.perf_counter() - t0 < 5
    assert "\n" not in str(err.value)
    assert parts(tmp_path) == []
    with pytest.raises(InputError, match="no time is left"):
        fetch_verified(f"{server}/ok.bin", SHA, quiet=True, cache=tmp_path, deadline=time.perf_counter() - 1)


def test_sigterm_leaves_no_part_file(server, tmp_path):
    code = ("import sys; from engine.fetch import fetch_verified; "
            f"fetch_verified({server + '/slow.bin'!r}, {SHA!r}, quiet=True, cache=sys.argv[1])")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not parts(tmp_path) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert parts(tmp_path), "the download did not start"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert parts(tmp_path) == []
    assert b"Traceback" not in proc.stderr.read()


def test_part_file_of_a_killed_process_is_removed_by_the_next_download(server, tmp_path):
    final = f"{SHA[:16]}-ok.bin"
    stale = tmp_path / f".{final}.part-{2 ** 22 + 12345}"  # no such process
    tmp_path.mkdir(exist_ok=True)
    stale.write_bytes(b"half")
    got = fetch_verified(f"{server}/ok.bin", SHA, quiet=True, cache=tmp_path)
    assert got.name == final and not stale.exists() and parts(tmp_path) == []
