"""Values crossing into the sandbox, converted as DSPy's PythonInterpreter converts them.

Variables become JSON data: tuples lists, sets sorted lists, pydantic models their JSON dump,
datetimes and enums their JSON form, NaN and infinity themselves. A tool's result reaches the
code as DSPy's does: a string as it is, None as '', JSON data as data (dataclasses, namedtuples
and models as dicts), anything else (NaN included) as its str().
"""

from __future__ import annotations

import dataclasses
import json
import keyword
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from mcp_sandbox.integrations.dspy.errors import CodeInterpreterError

#: Names the interpreter itself defines in the session; variables and tools may not take them.
RESERVED_NAMES = frozenset({"SUBMIT", "tools", "ToolError"})
INTERNAL_PREFIX = "_mcp_sandbox"


def check_name(name: object, what: str) -> str:
    """`name` if code can use it as a global, else CodeInterpreterError ("Invalid variable name")."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise CodeInterpreterError(f"Invalid {what} name: {name!r} is not a Python identifier")
    if name in RESERVED_NAMES or name.startswith(INTERNAL_PREFIX):
        raise CodeInterpreterError(f"Invalid {what} name: {name!r} is reserved by the sandbox")
    return name


def _dump_model(value: BaseModel) -> Any:
    try:
        return value.model_dump(mode="json")
    except PydanticSerializationError as error:
        raise CodeInterpreterError(f"Unable to serialize {type(value).__name__} as JSON: {error}") from None


def variable_json(value: Any) -> str:
    """A variable as JSON text; CodeInterpreterError for a value that is not data."""
    return json.dumps(_as_data(value))


def _as_data(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, BaseModel):
        return _as_data(_dump_model(value))
    if isinstance(value, dict):
        return {_key(k): _as_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_data(item) for item in value]
    if isinstance(value, (set, frozenset)):
        try:
            items = sorted(value)
        except TypeError:
            items = list(value)
        return [_as_data(item) for item in items]
    try:
        coerced = to_jsonable_python(value)
    except PydanticSerializationError:
        raise CodeInterpreterError(f"Unsupported value type: {type(value).__name__}") from None
    return _as_data(coerced)


def _key(key: Any) -> Any:
    data = _as_data(key)
    if isinstance(data, (str, int, float, bool)) or data is None:
        return data
    raise CodeInterpreterError(f"Unsupported value type: a dict key of type {type(key).__name__}")


def tool_result(value: Any) -> Any:
    """What code sees of a tool's return value (DSPy's rules, see the module's docstring)."""
    value = _jsonable(value)
    if value is None or isinstance(value, str):
        return "" if value is None else value
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value


def _jsonable(value: Any) -> Any:
    """Models, dataclasses and namedtuples as dicts, all the way down; other values as JSON would
    write them where it can, else unchanged."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, BaseModel):
        return _jsonable(_dump_model(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            return _jsonable(dataclasses.asdict(value))
        except Exception:  # noqa: BLE001 - a field that cannot be copied: the value falls back to str()
            return value
    if isinstance(value, tuple) and hasattr(value, "_fields") and hasattr(value, "_asdict"):
        return _jsonable(value._asdict())
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    try:
        return to_jsonable_python(value)
    except PydanticSerializationError:
        return value
