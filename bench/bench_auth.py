"""What a bearer-token check costs: each verifier on its own, and a warm call over streamable HTTP
with no token, one static token, a tokens file and a JWT.

Run from the repository root:  .venv/bin/python bench/bench_auth.py [--checks N] [--calls N] [--json PATH]

The verifiers are timed in this process (`verify_token`, median of N checks). The calls go
through the real MCP client to a real server process (`serve --transport http`, the in-process
backend, so the sandbox adds as little as it can), after 10 warm-up calls; each server twice, in
turn, the samples pooled. About two minutes.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import jwt
from common import free_port, save, wait_for_port
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_sandbox.oauth import JwtVerifier
from mcp_sandbox.principals import StaticTokens, TokenTable

ISSUER = "https://issuer.bench"
RESOURCE = "http://127.0.0.1/mcp"
STATIC = "bench-token-0123456789abcdef"
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "auth.json"
WARMUP_CALLS = 10
ROUNDS = 2
SERVER_START_LIMIT_S = 60.0
CALL_PHASE_LIMIT_S = 120.0


def signer(algorithm: str) -> tuple[Any, dict[str, Any]]:
    """A private key and its public JWK."""
    key: Any = (
        ec.generate_private_key(ec.SECP256R1())
        if algorithm == "ES256"
        else rsa.generate_private_key(65537, 2048)
    )
    public = json.loads(jwt.algorithms.get_default_algorithms()[algorithm].to_jwk(key.public_key()))
    return key, {**public, "kid": algorithm, "alg": algorithm}


def token(key: Any, algorithm: str, subject: str = "alice") -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": subject, "aud": RESOURCE, "iat": now, "exp": now + 3600}
    return jwt.encode(claims, key, algorithm=algorithm, headers={"kid": algorithm})


def tokens_file(folder: Path, principals: int) -> Path:
    """A tokens file of `principals` principals, the last of them "alice" with STATIC."""
    table = {f"p{index}": f"token-{index}-0123456789abcdef" for index in range(principals - 1)}
    table["alice"] = "sha256:" + hashlib.sha256(STATIC.encode()).hexdigest()
    path = folder / f"tokens-{principals}.json"
    path.write_text(json.dumps(table))
    path.chmod(0o600)
    return path


class KeySetServer:
    """A JWKS on 127.0.0.1, for the verifier that fetches its keys."""

    def __init__(self, jwks: dict[str, Any]) -> None:
        body = json.dumps(jwks).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/jwks.json"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


async def median_us(check: Callable[[], Awaitable[object]], count: int) -> float:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        await check()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


async def verifier_costs(folder: Path, checks: int) -> dict[str, float]:
    rsa_key, rsa_jwk = signer("RS256")
    ec_key, ec_jwk = signer("ES256")
    jwks = {"keys": [rsa_jwk, ec_jwk]}
    (folder / "jwks.json").write_text(json.dumps(jwks))
    from_file = JwtVerifier(str(folder / "jwks.json"), ISSUER, RESOURCE)
    served = KeySetServer(jwks)
    try:
        from_url = JwtVerifier(served.url, ISSUER, RESOURCE)
        rs, es = token(rsa_key, "RS256"), token(ec_key, "ES256")
        forged = token(signer("RS256")[0], "RS256")
        single = StaticTokens(STATIC, None)
        tables = {n: StaticTokens(None, TokenTable(tokens_file(folder, n))) for n in (1, 100, 1000)}
        cases: dict[str, Callable[[], Awaitable[object]]] = {
            "static: MCP_SANDBOX_AUTH_TOKEN": lambda: single.verify_token(STATIC),
            **{
                f"static: tokens file, {n:,} principal{'s' * (n != 1)}": (
                    lambda table=table: table.verify_token(STATIC)
                )
                for n, table in tables.items()
            },
            "static: an unknown token, 1,000 principals": lambda: tables[1000].verify_token(
                "nobody-0123456789abcdef"
            ),
            "JWT RS256, JWKS file": lambda: from_file.verify_token(rs),
            "JWT ES256, JWKS file": lambda: from_file.verify_token(es),
            "JWT RS256, JWKS URL (kept)": lambda: from_url.verify_token(rs),
            "JWT RS256 of another key, refused": lambda: from_file.verify_token(forged),
        }
        for name, check in cases.items():
            # Each case runs once before it is timed, and does what its name says.
            refused = "unknown" in name or "refused" in name
            assert (await check() is None) == refused, name
        return {name: await median_us(check, checks) for name, check in cases.items()}
    finally:
        served.close()


async def call_latency(env: dict[str, str], bearer: str | None, calls: int) -> list[float]:
    """Warm `1 + 1` calls over streamable HTTP to a server started with `env`, in ms."""
    port = free_port()
    server = await anyio.open_process(
        [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", str(port)],
        env={
            **os.environ,
            "MCP_SANDBOX_BACKEND": "inprocess",
            "MCP_SANDBOX_POOL_SIZE": "1",
            "MCP_SANDBOX_LOG_LEVEL": "WARNING",
            **env,
        },
        stdout=subprocess.DEVNULL,
    )
    try:
        await wait_for_port(port, SERVER_START_LIMIT_S)
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        samples = []
        with anyio.fail_after(CALL_PHASE_LIMIT_S):
            async with (
                httpx.AsyncClient(headers=headers, timeout=30) as http,
                Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client,
            ):
                for index in range(WARMUP_CALLS + calls):
                    start = time.perf_counter()
                    result = await client.call_tool("execute_python", {"code": "1 + 1", "session_id": "s"})
                    if index >= WARMUP_CALLS:
                        samples.append(time.perf_counter() - start)
                    assert not result.is_error, result
        return [sample * 1e3 for sample in samples]
    finally:
        server.terminate()
        with anyio.fail_after(30):
            await server.wait()
        await server.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        costs = await verifier_costs(folder, args.checks)
        rsa_key, rsa_jwk = signer("RS256")
        (folder / "server-jwks.json").write_text(json.dumps({"keys": [rsa_jwk]}))
        oauth = {
            "MCP_SANDBOX_AUTH_JWKS": str(folder / "server-jwks.json"),
            "MCP_SANDBOX_AUTH_ISSUER": ISSUER,
            "MCP_SANDBOX_AUTH_RESOURCE_URL": RESOURCE,
        }
        servers: dict[str, tuple[dict[str, str], str | None]] = {
            "no token (loopback)": ({}, None),
            "MCP_SANDBOX_AUTH_TOKEN": ({"MCP_SANDBOX_AUTH_TOKEN": STATIC}, STATIC),
            "tokens file, 1,000 principals": (
                {"MCP_SANDBOX_AUTH_TOKENS_FILE": str(tokens_file(folder, 1000))},
                STATIC,
            ),
            "JWT RS256, JWKS file": (oauth, token(rsa_key, "RS256")),
        }
        # Two rounds, in turn, pooled: the first server of a run is slower, whichever it is.
        rounds = [
            {name: await call_latency(env, bearer, args.calls) for name, (env, bearer) in servers.items()}
            for _ in range(ROUNDS)
        ]
        pooled = {name: [sample for run in rounds for sample in run[name]] for name in servers}
        calls = {
            name: {
                "p50_ms": statistics.median(samples),
                "p99_ms": statistics.quantiles(samples, n=100, method="inclusive")[98],
            }
            for name, samples in pooled.items()
        }
    lines = [
        f"mcp-sandbox token checks — {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}, "
        f"{platform.machine()}, Python {platform.python_version()}",
        "",
        f"{'verify_token, median of ' + str(args.checks):<44} {'µs':>8}",
        *(f"{name:<44} {value:>8.1f}" for name, value in costs.items()),
        "",
        f"{f'warm call over streamable HTTP, {ROUNDS * args.calls} calls':<44} {'p50 ms':>8} {'p99 ms':>8}",
        *(f"{name:<44} {value['p50_ms']:>8.2f} {value['p99_ms']:>8.2f}" for name, value in calls.items()),
    ]
    save({"verify_token_us": costs, "warm_call_ms": calls}, args.json, "\n".join(lines))


if __name__ == "__main__":
    anyio.run(main)
