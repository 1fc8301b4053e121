"""What an operator sees of a real server process over streamable HTTP: /metrics counting a known
mix of calls (read with prometheus-client's own parser), /healthz and /readyz (503 when
sandboxes cannot start), and JSON log lines carrying the session and call ids. The subprocess
backend serves: what is counted is the same on every backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from prometheus_client.parser import text_string_to_metric_families

from mcp_sandbox.version import __version__
from tests.helpers import as_caller, call, free_port, http_server, server_env, stop_process, wait_for_port

pytestmark = pytest.mark.anyio

TOKEN = "an-observability-test-token"
#: Calls a minute the sole principal may make: the mix's seventh counted call is refused.
PER_MINUTE = 6
#: What a result says of how its run ended.
FIELDS = ("status", "exception", "error_type")


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, its labels) -> value, as Prometheus parses the exposition."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def by_label(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> dict[Any, float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


async def test_metrics_count_a_known_mix_of_calls_by_outcome_without_a_token() -> None:
    env = {
        "MCP_SANDBOX_BACKEND": "subprocess",
        "MCP_SANDBOX_AUTH_TOKEN": TOKEN,
        "MCP_SANDBOX_PRINCIPAL_CALLS_PER_MINUTE": str(PER_MINUTE),
    }
    async with http_server("http", **env) as (port, _), httpx.AsyncClient() as web:
        base = f"http://127.0.0.1:{port}"
        async with as_caller(port, TOKEN) as client:
            assert (await call(client, "1 + 1"))["result"] == "2"
            assert (await call(client, "x = 2", session_id="kept"))["success"]
            assert (await call(client, "x", session_id="kept"))["result"] == "2"
            failed = await call(client, "1 / 0")
            assert (failed["status"], failed["exception"]) == ("error", "ZeroDivisionError"), failed
            # The program's own exception named Timeout is an error, counted as one.
            own = await call(client, "class Timeout(Exception): pass\nraise Timeout()")
            assert [own[name] for name in FIELDS] == ["error", "Timeout", "Timeout"], own
            timed_out = await call(client, "while True: pass", timeout=0.5)
            assert [timed_out[name] for name in FIELDS] == ["timeout", None, "Timeout"], timed_out
            bad_id = await client.call_tool("execute_python", {"code": "1", "session_id": "no spaces"})
            assert bad_id.is_error  # InvalidRequest: not counted against the minute's calls
            over = await client.call_tool("execute_python", {"code": "1"})
            assert over.is_error and "MCP_SANDBOX_PRINCIPAL_CALLS_PER_MINUTE" in str(over.content)
        # No token for the operator's endpoints; the MCP endpoint still wants one.
        assert (await web.post(f"{base}/mcp", json={})).status_code == 401
        assert (await web.get(f"{base}/healthz")).json() == {"status": "ok"}
        ready = await web.get(f"{base}/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        response = await web.get(f"{base}/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = scrape(response.text)
    calls = by_label(samples, "mcp_sandbox_calls_total")
    expected = {"ok": 3, "error": 2, "timeout": 1, "refused": 2}
    assert calls == {(("backend", "subprocess"), ("outcome", outcome)): n for outcome, n in expected.items()}
    assert by_label(samples, "mcp_sandbox_call_duration_seconds_count") == calls
    assert by_label(samples, "mcp_sandbox_refusals_total") == {
        (("kind", "InvalidRequest"), ("setting", "")): 1,
        (("kind", "PrincipalLimitReached"), ("setting", "MCP_SANDBOX_PRINCIPAL_CALLS_PER_MINUTE")): 1,
    }
    assert samples["mcp_sandbox_sessions", (("state", "live"),)] == 1
    assert samples["mcp_sandbox_sandbox_wait_seconds_count", ()] >= 4  # 3 without a session, 1 for "kept"
    assert samples["mcp_sandbox_build_info", (("backend", "subprocess"), ("version", __version__))] == 1
    assert not by_label(samples, "mcp_sandbox_sandboxes_lost_total"), "the timeout stopped at its interrupt"


async def test_readyz_says_why_when_sandboxes_cannot_start() -> None:
    # Sandboxes that cannot start in a millisecond: the server is up (healthz), not ready.
    env = {"MCP_SANDBOX_BACKEND": "subprocess", "MCP_SANDBOX_START_TIMEOUT": "0.001"}
    async with http_server("http", **env) as (port, _), httpx.AsyncClient() as web:
        base = f"http://127.0.0.1:{port}"
        assert (await web.get(f"{base}/healthz")).status_code == 200
        with anyio.fail_after(30):  # the first starts fail, then the pool says so
            while "fail to start" not in (ready := await web.get(f"{base}/readyz")).text:
                assert (
                    ready.status_code == 503 and ready.json()["reason"] == "the first sandboxes are starting"
                )
                await anyio.sleep(0.1)
        assert ready.status_code == 503 and ready.json()["status"] == "not ready"
        failures = scrape((await web.get(f"{base}/metrics")).text)
        assert failures["mcp_sandbox_sandbox_start_failures_total", ()] >= 2


async def test_metrics_can_be_turned_off() -> None:
    async with (
        http_server("http", MCP_SANDBOX_BACKEND="subprocess", MCP_SANDBOX_METRICS="false") as (port, _),
        httpx.AsyncClient() as web,
    ):
        assert (await web.get(f"http://127.0.0.1:{port}/metrics")).status_code == 404
        assert (await web.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200


async def test_json_logs_carry_the_session_and_call_ids(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "stderr.log"
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", str(port)]
    env = server_env(
        MCP_SANDBOX_BACKEND="subprocess",
        MCP_SANDBOX_POOL_SIZE="1",
        MCP_SANDBOX_LOG_FORMAT="json",
        MCP_SANDBOX_LOG_LEVEL="DEBUG",
    )
    with log.open("wb") as stderr:
        process = await anyio.open_process(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            await wait_for_port(port, process)
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                assert (await call(client, "1", session_id="logged-session"))["success"]
        finally:
            await stop_process(process)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    (ended,) = [line for line in lines if line["message"].startswith("call ended")]
    assert ended["session_id"] == "logged-session" and len(ended["call_id"]) == 12
    assert any(line["logger"].startswith("uvicorn") for line in lines), "uvicorn's lines are JSON too"
