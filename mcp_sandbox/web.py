"""ASGI middleware for the HTTP transports: routing keys for instances behind a load balancer
(MCP_SANDBOX_STATELESS_HTTP), and JSON-RPC's error for a body that is not one message. Bearer tokens
are the MCP SDK's middleware, with principals.py's verifiers."""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from mcp.types import INVALID_REQUEST, jsonrpc_message_adapter
from pydantic import ValidationError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SESSION_HEADER = b"mcp-session-id"


class RoutingSessionId:
    """ASGI middleware for a stateless streamable HTTP server: a response to a request that
    carries no Mcp-Session-Id gets a new random one. A client sends it back with every later
    request (the MCP spec says it must), so a load balancer that hashes on it sends one client to
    one instance, and to another when that one is gone. No instance keeps anything under it:
    every instance answers every request, and sessions move through the shared state folder."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or any(name == SESSION_HEADER for name, _ in scope.get("headers", [])):
            await self._app(scope, receive, send)
            return
        routing_key = secrets.token_hex(16).encode()

        async def send_with_key(message: Message) -> None:
            if message["type"] == "http.response.start" and 200 <= message["status"] < 300:
                headers = [(n, v) for n, v in message.get("headers", []) if n.lower() != SESSION_HEADER]
                message = {**message, "headers": [*headers, (SESSION_HEADER, routing_key)]}
            await send(message)

        await self._app(scope, receive, send_with_key)


#: What a POST whose body is JSON but not one JSON-RPC message is answered.
INVALID_REQUEST_BODY = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": INVALID_REQUEST,
            "message": "Invalid Request: the body must be one JSON-RPC request, notification or response "
            "object (batches are not supported)",
        },
    }
).encode()


class OneMessagePerPost:
    """ASGI middleware for streamable HTTP: a POST whose body is valid JSON but not one JSON-RPC
    message (a batch, a bare value, an object that is no request, notification or response) is
    answered -32600 (Invalid Request), as JSON-RPC says, where the SDK's 2025-11-25 transport
    answers -32602 (Invalid params). The SDK still answers first, so a request without a good
    token is refused as such (401); only its 400 is rewritten. Anything else goes on as it came."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        body, disconnected = await _read_body(receive)
        answer = send if disconnected or _one_message(body) else _as_invalid_request(send)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            if disconnected:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": body, "more_body": False}

        await self._app(scope, replay, answer)


def _as_invalid_request(send: Send) -> Send:
    """`send`, with a 400 response's body replaced by INVALID_REQUEST_BODY."""
    rewriting = False

    async def rewrite(message: Message) -> None:
        nonlocal rewriting
        if message["type"] == "http.response.start" and message["status"] == 400:
            rewriting = True
            headers = [(n, v) for n, v in message.get("headers", []) if n.lower() != b"content-length"]
            length = (b"content-length", str(len(INVALID_REQUEST_BODY)).encode())
            message = {**message, "headers": [*headers, length]}
        elif message["type"] == "http.response.body" and rewriting:
            if message.get("more_body", False):
                return  # the SDK's own error text, dropped
            message = {"type": "http.response.body", "body": INVALID_REQUEST_BODY}
        await send(message)

    return rewrite


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The whole request body, and whether the client went away before it ended."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _one_message(body: bytes) -> bool:
    """Whether `body` is one JSON-RPC message, or not JSON at all (the SDK's parse error says so)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return True
    try:
        jsonrpc_message_adapter.validate_python(parsed, by_name=False)
    except ValidationError:
        return False
    return True
