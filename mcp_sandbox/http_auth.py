"""Bearer-token authentication for the HTTP and SSE transports (MCP_SANDBOX_AUTH_TOKEN)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNAUTHORIZED = b'{"error": "unauthorized: send Authorization: Bearer <MCP_SANDBOX_AUTH_TOKEN>"}'


class BearerAuth:
    """ASGI middleware: every HTTP request needs `Authorization: Bearer <token>`, else 401."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = b""
            for name, value in scope.get("headers", []):
                if name == b"authorization":
                    given = value
            # compare_digest: the time taken says nothing about how much of the token was right.
            if not hmac.compare_digest(given, self._expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": UNAUTHORIZED})
                return
        await self._app(scope, receive, send)
