"""A test's own OAuth issuer: a key pair, its JSON Web Key Set, and signed JWT access tokens."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

ISSUER = "https://issuer.test"
RESOURCE = "http://127.0.0.1/mcp"


class Issuer:
    """Signs tokens with its own key (RS256 by default, ES256 with `curve=True`), under `kid`."""

    def __init__(self, kid: str = "test-key", *, curve: bool = False, issuer: str = ISSUER) -> None:
        self.kid = kid
        self.issuer = issuer
        self.algorithm = "ES256" if curve else "RS256"
        self._key: Any = (
            ec.generate_private_key(ec.SECP256R1()) if curve else rsa.generate_private_key(65537, 2048)
        )

    def jwk(self) -> dict[str, Any]:
        public = json.loads(
            jwt.algorithms.get_default_algorithms()[self.algorithm].to_jwk(self._key.public_key())
        )
        return {**public, "kid": self.kid, "use": "sig", "alg": self.algorithm}

    def token(self, subject: str, *, audience: str = RESOURCE, lifetime_s: float = 600, **claims: Any) -> str:
        now = int(time.time())
        payload = {
            "iss": self.issuer,
            "sub": subject,
            "aud": audience,
            "iat": now,
            "exp": int(now + lifetime_s),
        }
        payload.update(claims)
        return jwt.encode(
            {k: v for k, v in payload.items() if v is not None},
            self._key,
            algorithm=self.algorithm,
            headers={"kid": self.kid},
        )


def write_jwks(path: Path, *issuers: Issuer) -> Path:
    path.write_text(json.dumps({"keys": [issuer.jwk() for issuer in issuers]}), encoding="utf-8")
    return path


@contextmanager
def jwks_url(*issuers: Issuer) -> Iterator[tuple[str, list[str]]]:
    """A JWKS served over HTTP on 127.0.0.1: its URL, and the paths fetched so far."""
    body = json.dumps({"keys": [issuer.jwk() for issuer in issuers]}).encode()
    fetched: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetched.append(self.path)
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json", fetched
    finally:
        server.shutdown()
        server.server_close()
