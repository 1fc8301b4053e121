"""A minimal MCP server over stdio whose one tool, `add`, answers in microseconds.

The SDK's own server spends about 2 ms per call, which would hide the bridge's cost; this one
speaks just enough of the protocol (initialize, tools/list, tools/call, ping) to serve as the
"fast upstream" of bench_bridge.py.
"""

from __future__ import annotations

import json
import sys

ADD = {
    "name": "add",
    "description": "Add two integers.",
    "inputSchema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
    "outputSchema": {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]},
}


def answer(message: dict) -> dict | None:
    method, params = message.get("method"), message.get("params") or {}
    if "id" not in message:
        return None  # a notification
    if method == "initialize":
        result: dict = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fast", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [ADD]}
    elif method == "tools/call":
        arguments = params.get("arguments") or {}
        total = {"sum": arguments["a"] + arguments["b"]}
        result = {"content": [{"type": "text", "text": json.dumps(total)}], "structuredContent": total}
    elif method == "ping":
        result = {}
    else:
        return {
            "jsonrpc": "2.0",
            "id": message["id"],
            "error": {"code": -32601, "message": "Method not found"},
        }
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            reply = answer(json.loads(line))
            if reply is not None:
                sys.stdout.write(json.dumps(reply) + "\n")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
