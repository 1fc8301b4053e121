"""`Check`: what `mcp-sandbox doctor` says of one thing, with its fix. Below the backends, so each
backend's own checks (its registry entry's) can make them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warning", "failed"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
