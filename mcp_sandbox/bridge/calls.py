"""The bridged tool calls of one execution, whichever backend carries them."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from mcp_sandbox.bridge.upstreams import ToolBridge, reply_error

logger = logging.getLogger(__name__)

#: Delivers reply (JSON text) for call number `call` to the sandbox.
Deliver = Callable[[int, str], Awaitable[None]]

#: A reply that cannot reach a sandbox in this long is dropped: the sandbox is stuck or gone.
DELIVER_LIMIT = 2.0


class ToolCalls:
    """Starts each bridged call of an execution in its own task, enforcing the per-execution
    limit; `cancel_all` ends the pending ones when the execution ends, and each still gets a reply."""

    def __init__(self, bridge: ToolBridge | None, task_group: anyio.abc.TaskGroup, max_calls: int) -> None:
        self._bridge = bridge
        self._task_group = task_group
        self._max_calls = max_calls
        self._scopes: set[anyio.CancelScope] = set()
        self.count = 0

    def start(self, call: int, server: str, tool: str, arguments: str, deliver: Deliver) -> None:
        self.count += 1
        over_limit = self.count > self._max_calls
        self._task_group.start_soon(self._serve, call, server, tool, arguments, deliver, over_limit)

    async def _serve(
        self, call: int, server: str, tool: str, arguments: str, deliver: Deliver, over_limit: bool
    ) -> None:
        reply = reply_error("the execution ended (finished or timed out) before this tool call returned")
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        with scope:
            reply = await self._reply(server, tool, arguments, over_limit)
        self._scopes.discard(scope)
        with anyio.move_on_after(DELIVER_LIMIT, shield=True):
            try:
                await deliver(call, reply)
            except Exception as error:  # noqa: BLE001 - the sandbox died; its run reports that
                logger.debug("could not deliver tool reply %d: %s", call, error)

    async def _reply(self, server: str, tool: str, arguments: str, over_limit: bool) -> str:
        if self._bridge is None or not self._bridge.has_tools:
            return reply_error("no upstream MCP servers are configured (MCP_SANDBOX_BRIDGE_CONFIG)")
        if over_limit:
            return reply_error(
                f"this execution made more than {self._max_calls} tool calls (MCP_SANDBOX_BRIDGE_MAX_CALLS)"
            )
        try:
            decoded = json.loads(arguments)
        except (TypeError, ValueError):
            return reply_error("the tool call's arguments were not JSON")
        return await self._bridge.call(str(server), str(tool), decoded)

    def cancel_all(self) -> None:
        for scope in self._scopes:
            scope.cancel()
