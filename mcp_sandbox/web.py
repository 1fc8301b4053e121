"""ASGI middleware for the HTTP transports: routing keys for instances behind a load balancer
(MCP_SANDBOX_STATELESS_HTTP). Bearer tokens are the MCP SDK's middleware, with principals.py's verifiers."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

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
