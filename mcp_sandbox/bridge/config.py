"""The upstream servers file, in the format Claude Desktop uses (`{"mcpServers": {...}}`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class StdioUpstream(BaseModel):
    """An upstream started as a child process and spoken to over stdio."""

    model_config = ConfigDict(extra="ignore")
    command: str = Field(min_length=1)
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None


class UrlUpstream(BaseModel):
    """An upstream reached over HTTP: streamable HTTP, or SSE when the URL ends in `/sse`."""

    model_config = ConfigDict(extra="ignore")
    url: Annotated[str, Field(pattern=r"^https?://")]
    headers: dict[str, str] = {}

    @property
    def is_sse(self) -> bool:
        return self.url.rstrip("/").endswith("/sse")


Upstream = StdioUpstream | UrlUpstream


class BridgeConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    servers: dict[str, Upstream] = Field(default_factory=dict, alias="mcpServers")


class BridgeConfigError(Exception):
    """The upstream servers file is missing or wrong; the message says where."""


def load_bridge_config(path: Path) -> BridgeConfig:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise BridgeConfigError(f"cannot read the bridge config {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise BridgeConfigError(f"the bridge config {path} is not JSON: {error}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("mcpServers"), dict):
        raise BridgeConfigError(f'the bridge config {path} needs an object {{"mcpServers": {{...}}}}')
    try:
        return BridgeConfig.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:3]))}: {e['msg']}" for e in error.errors())
        raise BridgeConfigError(
            f"the bridge config {path} has a bad server entry (each needs a `command` or an http(s) "
            f"`url`): {problems}"
        ) from None
