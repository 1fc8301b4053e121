"""Local tools: host Python callables that sandboxed code calls through the bridge.

They travel over the same channel as upstream tools, under the same per-call timeout and
per-execution call limit, and appear to the guest as `tools.local.<name>(...)`. Their signatures
come from `inspect`; a parameter with a default is optional, and one left out keeps that default.
"""

from __future__ import annotations

import functools
import inspect
import keyword
import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio
from pydantic_core import PydanticSerializationError, to_jsonable_python

from mcp_sandbox.bridge.catalog import JSON_TYPES, LOCAL_SERVER, ParamSpec, ToolSpec
from mcp_sandbox.protocol import MAX_TOOL_REPLY_CHARS, reply_error, reply_ok

logger = logging.getLogger(__name__)

#: Python annotations the guest's signatures can show; anything else shows as Any.
_ANNOTATIONS: dict[Any, str] = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    list: "list",
    dict: "dict",
    None: "None",
    type(None): "None",
}


def _annotation(annotation: Any) -> str:
    if isinstance(annotation, str):  # postponed annotations (`from __future__ import annotations`)
        return annotation if annotation in JSON_TYPES.values() else "Any"
    return _ANNOTATIONS.get(annotation, "Any")


def local_tool_spec(name: str, function: Callable[..., Any]) -> ToolSpec:
    """The guest's view of one host callable: `tools.local.<name>` with the callable's signature.

    *args and **kwargs are not offered to the guest: arguments cross as one JSON object.
    """
    params = [
        ParamSpec(
            name=p.name,
            py=p.name,
            annotation=_annotation(p.annotation),
            required=p.default is inspect.Parameter.empty,
        )
        for p in inspect.signature(function).parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    return ToolSpec(
        LOCAL_SERVER, LOCAL_SERVER, name, name, params, inspect.getdoc(function) or "", local=True
    )


class LocalTools:
    """The host callables sandboxed code may call, by name; nothing else is reachable."""

    def __init__(self, tools: Mapping[str, Callable[..., Any]], call_timeout: float) -> None:
        for name in tools:
            if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
                raise ValueError(f"local tool name {name!r} must be a Python identifier (and not a keyword)")
            if name.endswith("_async") and name.removesuffix("_async") in tools:
                raise ValueError(f"local tool {name!r} clashes with the async twin of {name[:-6]!r}")
            if not callable(tools[name]):
                raise TypeError(f"local tool {name!r} is not callable")
        self._functions = dict(tools)
        self.call_timeout = call_timeout
        self.specs = [local_tool_spec(name, function) for name, function in self._functions.items()]

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Call one local tool; the reply as JSON text. Never raises except on cancellation."""
        function = self._functions.get(name)
        if function is None:
            return reply_error(f"there is no local tool tools.{LOCAL_SERVER}.{name}")
        value: Any = None
        with anyio.move_on_after(self.call_timeout) as deadline:
            try:
                if inspect.iscoroutinefunction(function):
                    value = await function(**arguments)
                else:
                    # A thread keeps the event loop free; one that outlives its deadline is abandoned.
                    call = functools.partial(function, **arguments)
                    value = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
            except Exception as error:  # the tool's failure becomes the guest's ToolError
                logger.debug("local tool %s failed", name, exc_info=True)
                return reply_error(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
        if deadline.cancelled_caught:
            return reply_error(f"local tool {name} timed out after {self.call_timeout:g} s")
        try:
            reply = reply_ok(to_jsonable_python(value))
        except (PydanticSerializationError, TypeError, ValueError) as error:
            return reply_error(f"local tool {name} returned a value that is not JSON data: {error}")
        if len(reply) > MAX_TOOL_REPLY_CHARS:
            return reply_error(
                f"local tool {name} returned {len(reply):,} characters; the bridge passes at most "
                f"{MAX_TOOL_REPLY_CHARS:,}"
            )
        return reply
