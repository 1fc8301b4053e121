"""Local tools (bridge/local.py), which carry DSPy's tools: signatures, calls, errors, limits."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

import pytest

from mcp_sandbox.bridge.catalog import LOCAL_SERVER
from mcp_sandbox.bridge.config import BridgeConfig, StdioUpstream
from mcp_sandbox.bridge.local import LocalTools, local_tool_spec
from mcp_sandbox.bridge.upstreams import ToolBridge


def search(query: str, k: int = 3, *rest: Any, exact: bool | None = None, **extra: Any) -> list[str]:
    """Find things."""
    return [query] * k


@dataclasses.dataclass
class Point:
    x: int
    y: int


def test_spec_comes_from_the_signature() -> None:
    spec = local_tool_spec("search", search)
    assert (spec.server_py, spec.name_py, spec.local) == (LOCAL_SERVER, "search", True)
    # *rest and **extra cannot cross as one JSON object, so the guest does not offer them.
    assert [(p.py, p.annotation, p.required) for p in spec.params] == [
        ("query", "str", True),
        ("k", "int", False),
        ("exact", "Any", False),
    ]
    assert spec.doc.startswith("Find things.") and "Runs on the host" in spec.doc
    assert spec.signature == "tools.local.search(query: str, k: int = None, exact: Any = None)"


@pytest.mark.parametrize("name", ["1x", "has space", "class", ""])
def test_names_must_be_identifiers(name: str) -> None:
    with pytest.raises(ValueError, match="identifier"):
        LocalTools({name: search}, call_timeout=1)


def test_a_name_cannot_shadow_an_async_twin() -> None:
    with pytest.raises(ValueError, match="async twin"):
        LocalTools({"search": search, "search_async": search}, call_timeout=1)


async def call(tools: LocalTools, name: str, **arguments: Any) -> dict[str, Any]:
    reply: dict[str, Any] = json.loads(await tools.call(name, arguments))
    return reply


async def test_sync_async_and_converted_values(anyio_backend: str) -> None:
    caller = threading.get_ident()
    threads: list[int] = []

    def where(**_: Any) -> Point:
        threads.append(threading.get_ident())
        return Point(1, 2)

    async def double(n: int) -> int:
        return n * 2

    tools = LocalTools({"search": search, "where": where, "double": double}, call_timeout=5)
    assert await call(tools, "search", query="q") == {"ok": True, "value": ["q", "q", "q"]}
    assert await call(tools, "double", n=21) == {"ok": True, "value": 42}
    # A dataclass comes back as JSON data; a sync tool ran off the event loop's thread.
    assert await call(tools, "where") == {"ok": True, "value": {"x": 1, "y": 2}}
    assert threads and threads[0] != caller


async def test_errors_become_replies(anyio_backend: str) -> None:
    def fails(message: str) -> None:
        raise ValueError(message)

    def opaque() -> object:
        return object()

    tools = LocalTools({"fails": fails, "opaque": opaque, "search": search}, call_timeout=5)
    assert await call(tools, "fails", message="no luck") == {"ok": False, "error": "ValueError: no luck"}
    assert "not JSON data" in (await call(tools, "opaque"))["error"]
    assert "there is no local tool" in (await call(tools, "missing"))["error"]
    assert "unexpected keyword" in (await call(tools, "fails", nope=1))["error"]


async def test_a_slow_tool_times_out(anyio_backend: str) -> None:
    tools = LocalTools({"slow": lambda: time.sleep(3)}, call_timeout=0.3)
    started = time.monotonic()
    reply = await call(tools, "slow")
    assert reply == {"ok": False, "error": "local tool slow timed out after 0.3 s"}
    assert time.monotonic() - started < 2


async def test_bridge_routes_local_calls_and_reserves_the_name(anyio_backend: str) -> None:
    config = BridgeConfig(servers={"local": StdioUpstream(command="true")})
    bridge = ToolBridge(config, call_timeout=5, local=LocalTools({"search": search}, call_timeout=5))
    assert list(bridge.connections) == ["local_2"]  # the upstream named `local` steps aside
    assert [(s.server_py, s.name_py) for s in bridge.specs] == [("local", "search")]
    version = bridge.version
    bridge.set_local_tools(LocalTools({"other": search}, call_timeout=5))
    assert (
        bridge.version > version
        and "other" in bridge.manifest_json
        and '"search"' not in bridge.manifest_json
    )
    reply = json.loads(await bridge.call("local", "other", {"query": "x", "k": 1}))
    assert reply == {"ok": True, "value": ["x"]}
    with pytest.raises(RuntimeError, match="without local tools"):
        ToolBridge(BridgeConfig(), call_timeout=5).set_local_tools(LocalTools({}, call_timeout=5))
