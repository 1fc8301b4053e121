"""Fetching Pyodide packages for offline use: dependency resolution, and the real download code
against an HTTP server the test starts on 127.0.0.1 (the Pyodide CDN is out of reach here)."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.packages import PackageError, PackageFile, download, resolve

LOCK = {
    "packages": {
        "pandas": {
            "name": "pandas",
            "file_name": "pandas.whl",
            "sha256": "p",
            "depends": ["numpy", "python-dateutil"],
        },
        "numpy": {"name": "numpy", "file_name": "numpy.whl", "sha256": "n", "depends": []},
        "python-dateutil": {
            "name": "python-dateutil",
            "file_name": "du.whl",
            "sha256": "d",
            "depends": ["six"],
        },
        "six": {"name": "six", "file_name": "six.whl", "sha256": "s", "depends": []},
        "lonely": {"name": "lonely", "file_name": "lonely.whl", "sha256": "l"},
    }
}


def test_resolve_follows_dependencies() -> None:
    names = [package.name for package in resolve(LOCK, ["pandas"])]
    assert names == ["numpy", "pandas", "python-dateutil", "six"]
    assert [p.name for p in resolve(LOCK, ["Python_Dateutil", "six"])] == ["python-dateutil", "six"]


def test_resolve_names_what_it_does_not_know() -> None:
    with pytest.raises(PackageError, match="not in the Pyodide distribution: nonesuch"):
        resolve(LOCK, ["numpy", "nonesuch"])


WHEEL = b"pretend wheel bytes " * 5000


@pytest.fixture(scope="module")
def mirror() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/files/good.whl":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(WHEEL)))
            self.end_headers()
            self.wfile.write(WHEEL)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/files/"
    server.shutdown()
    thread.join(5)


def test_download_verifies_and_reports_progress(tmp_path: Path, mirror: str) -> None:
    package = PackageFile("good", "good.whl", hashlib.sha256(WHEEL).hexdigest())
    seen: list[tuple[int, int | None]] = []
    assert download(package, tmp_path, mirror, lambda _p, done, total: seen.append((done, total))) is True
    assert (tmp_path / "good.whl").read_bytes() == WHEEL
    assert seen[-1] == (len(WHEEL), len(WHEEL)) and len(seen) > 1
    assert download(package, tmp_path, mirror, lambda *_: None) is False, "a verified copy is kept"


def test_a_file_that_does_not_match_its_hash_is_not_kept(tmp_path: Path, mirror: str) -> None:
    package = PackageFile("good", "good.whl", "0" * 64)
    with pytest.raises(PackageError, match="does not match the sha256"):
        download(package, tmp_path, mirror, lambda *_: None)
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_file_is_a_clear_error(tmp_path: Path, mirror: str) -> None:
    with pytest.raises(PackageError, match=r"could not fetch missing\.whl"):
        download(PackageFile("missing", "missing.whl", "0" * 64), tmp_path, mirror, lambda *_: None)
    assert list(tmp_path.iterdir()) == []
