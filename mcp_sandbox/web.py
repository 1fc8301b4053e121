"""ASGI middleware for the HTTP transports: bearer tokens (MCP_SANDBOX_AUTH_TOKEN, a tokens file) and routing
keys for instances behind a load balancer (MCP_SANDBOX_STATELESS_HTTP)."""

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

UNAUTHORIZED = b'{"error": "unauthorized: send Authorization: Bearer <token>"}'
BEARER = b"bearer "

#: Whose token this is (a principal, principals.SOLE for the one token), or None: not a caller's.
TokenLookup = Callable[[str], "str | None"]


class BearerAuth:
    """ASGI middleware: every HTTP request needs `Authorization: Bearer <token>` of a known
    caller, else 401. The caller's principal goes on the request's state (`principal`)."""

    def __init__(self, app: ASGIApp, lookup: TokenLookup) -> None:
        self._app = app
        self._lookup = lookup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = b""
            for name, value in scope.get("headers", []):
                if name == b"authorization":
                    given = value
            principal = None
            if given[: len(BEARER)].lower() == BEARER:
                principal = self._lookup(given[len(BEARER) :].decode("latin-1"))
            if principal is None:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": UNAUTHORIZED})
                return
            scope["state"] = {**scope.get("state", {}), "principal": principal}
        await self._app(scope, receive, send)


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
