"""The server as the official MCP Inspector CLI (from the npm registry) sees it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

NPX = shutil.which("npx")
pytestmark = pytest.mark.skipif(NPX is None, reason="npx (Node.js) is not installed")

#: The first `npx -y` downloads the Inspector; later runs start from npm's cache.
DOWNLOAD_TIMEOUT = 240
SERVER_ENV = {
    "MCP_SANDBOX_BACKEND": "pyodide",
    "MCP_SANDBOX_POOL_SIZE": "1",
    "MCP_SANDBOX_LOG_LEVEL": "WARNING",
}


def inspector(*method: str) -> dict[str, Any]:
    """Run the Inspector CLI against `python -m mcp_sandbox` over stdio; its JSON answer."""
    assert NPX is not None
    env_options = [option for name, value in SERVER_ENV.items() for option in ("-e", f"{name}={value}")]
    server = [sys.executable, "-m", "mcp_sandbox"]
    done = subprocess.run(
        [NPX, "-y", "@modelcontextprotocol/inspector", "--cli", *env_options, *server, *method],
        capture_output=True,
        text=True,
        timeout=DOWNLOAD_TIMEOUT,
        # No prompt to install, and no update banner in the output.
        env={**os.environ, "npm_config_yes": "true", "npm_config_update_notifier": "false"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_tools_list_shows_execute_python_with_its_output_schema() -> None:
    tools = {tool["name"]: tool for tool in inspector("--method", "tools/list")["tools"]}
    execute = tools["execute_python"]
    assert "Pyodide" in execute["description"]
    assert execute["inputSchema"]["required"] == ["code"]
    output = execute["outputSchema"]
    assert {"success", "status", "exception", "stdout", "stderr", "result", "backend", "session_id"} <= set(
        output["properties"]
    )
    assert "reset_session" in tools


def test_tools_call_runs_code_in_pyodide() -> None:
    answer = inspector(
        "--method",
        "tools/call",
        "--tool-name",
        "execute_python",
        "--tool-arg",
        "code=import sys; print('hello'); (sys.platform, sum(range(10)))",
        "--tool-arg",
        "timeout=20",
    )
    assert answer["isError"] is False
    result = answer["structuredContent"]
    assert result["success"] is True, result
    assert (result["stdout"], result["result"], result["backend"]) == (
        "hello\n",
        "('emscripten', 45)",
        "pyodide",
    )
    assert answer["content"][0]["text"] == "hello\nOut: ('emscripten', 45)", "the text the model reads"
