"""Code mode's cost to an agent: the tokens an agent reads to use an upstream's tools
directly, against through mcp-sandbox (its tool listing plus one search answer).

Run from the repository root:  .venv/bin/python bench/bench_tokens.py [--json PATH]

Real servers over stdio, through the real MCP client: `tests/upstreams/many_server.py` with 10,
100 and 1,000 tools (5 parameters each, one-sentence descriptions), listed directly; then an
mcp-sandbox server bridging it (the default backend, pyodide), listed, and asked
`search_tools("create a jira item")`. Tokens are characters / 4 of what a client hands a model:
the `tools/list` result's tools as compact JSON (as the wire carries them), and a tool
answer's text content. About 30 seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parents[1]
COUNTS = (10, 100, 1000)
QUERY = "create a jira item"
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "tokens.json"


def tokens(text: str) -> float:
    return len(text) / 4


def listing_text(tools: list[Any]) -> str:
    """The tools as the wire carries them: compact JSON, empty fields left out."""
    listed = [tool.model_dump(by_alias=True, exclude_none=True, mode="json") for tool in tools]
    return json.dumps(listed, separators=(",", ":"), ensure_ascii=False)


def upstream(count: int) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "tests.upstreams.many_server", str(count)], cwd=str(REPO)
    )


async def direct(count: int) -> float:
    async with Client(upstream(count)) as client:
        return tokens(listing_text((await client.list_tools()).tools))


async def code_mode(count: int, folder: Path) -> dict[str, float]:
    config = folder / f"bridge-{count}.json"
    server = upstream(count)
    entry = {"command": server.command, "args": server.args, "cwd": server.cwd}
    config.write_text(json.dumps({"mcpServers": {"many": entry}}))
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox"],
        env={
            "MCP_SANDBOX_BACKEND": "pyodide",
            "MCP_SANDBOX_POOL_SIZE": "1",
            "MCP_SANDBOX_LOG_LEVEL": "ERROR",
            "MCP_SANDBOX_BRIDGE_CONFIG": str(config),
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
        },
        cwd=str(REPO),
    )
    async with Client(params) as client:
        listing = tokens(listing_text((await client.list_tools()).tools))
        answer = await client.call_tool("search_tools", {"query": QUERY})
        text = "".join(getattr(block, "text", "") for block in answer.content)
        first = (answer.structured_content or {}).get("tools", [{}])[0].get("signature", "")
    return {"listing": listing, "search": tokens(text), "first_hit": first}


async def main(json_path: Path) -> None:
    rows: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for count in COUNTS:
            print(f"{count} tools ...", file=sys.stderr)
            sandbox = await code_mode(count, Path(folder))
            rows[count] = {"direct": await direct(count), **sandbox}
    print(f"tokens (characters / 4), one search answer for {QUERY!r}\n")
    print(
        f"{'tools':>6} {'direct':>10} {'listing':>9} {'search':>8} {'code mode':>10} {'share':>7}  first hit"
    )
    for count, row in rows.items():
        total = row["listing"] + row["search"]
        row["share"] = total / row["direct"]
        print(
            f"{count:>6} {row['direct']:>10,.0f} {row['listing']:>9,.0f} {row['search']:>8,.0f} "
            f"{total:>10,.0f} {row['share']:>7.1%}  {row['first_hit']}"
        )
    report = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "rows": rows}
    await anyio.Path(json_path.parent).mkdir(parents=True, exist_ok=True)
    await anyio.Path(json_path).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    anyio.run(main, parser.parse_args().json)
