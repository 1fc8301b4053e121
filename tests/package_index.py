"""A package index in the Pyodide CDN's layout (`pyodide-lock.json` and the package files beside
it), served over HTTP on 127.0.0.1 from a thread, counting the requests it answers, so fetching
is tested for real while the CDN is out of reach."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.wheels import build_wheel

#: Seconds a held-back file waits to be released before it is refused (a test that forgot).
RELEASE_LIMIT = 60.0


@dataclass
class PackageIndex:
    folder: Path
    url: str = ""
    #: The paths asked for, in order (a thread appends; read them after the fact).
    requests: list[str] = field(default_factory=list)
    #: Package files are held back until this is set (set from the start): a test clears it to
    #: catch the server while it fetches.
    release: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.release.set()

    def add_wheel(
        self, name: str, source: str, *, tampered: bool = False, depends: tuple[str, ...] = ()
    ) -> Path:
        """A wheel `name` whose module runs `source`, in the lock with its sha256; `tampered`: the
        file served differs from the one the lock's sha256 is of."""
        wheel = build_wheel(self.folder, name, source)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if tampered:
            build_wheel(self.folder, name, source + "\nTAMPERED = True\n")
        lock_path = self.folder / "pyodide-lock.json"
        lock = json.loads(lock_path.read_text()) if lock_path.exists() else {"info": {}, "packages": {}}
        lock["packages"][name] = {
            "name": name,
            "version": "1.0",
            "file_name": wheel.name,
            "sha256": digest,
            "depends": list(depends),
            "imports": [name],
            "install_dir": "site",
            "package_type": "package",
        }
        lock_path.write_text(json.dumps(lock))
        return wheel


@contextmanager
def serve_index(folder: Path) -> Iterator[PackageIndex]:
    """Serve `folder` at http://127.0.0.1:<port>/pyodide/ (only there: other paths are 404)."""
    index = PackageIndex(folder)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            index.requests.append(self.path)
            name = self.path.removeprefix("/pyodide/")
            path = folder / name
            if not self.path.startswith("/pyodide/") or "/" in name or not path.is_file():
                self.send_error(404)
                return
            if name != "pyodide-lock.json" and not index.release.wait(RELEASE_LIMIT):
                self.send_error(503)
                return
            body = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    index.url = f"http://127.0.0.1:{server.server_address[1]}/pyodide/"
    try:
        yield index
    finally:
        index.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def closed_port_url() -> str:
    """An index URL on 127.0.0.1 where nothing listens: connections are refused at once."""
    with http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler) as server:
        port = server.server_address[1]
    return f"http://127.0.0.1:{port}/pyodide/"
