"""An upstream with many realistic tools: 10 services x 10 actions at 100 tools, more
services past that; 5 parameters each, a one-sentence description, and JSON answered as text, as
most real MCP servers answer.

`python -m tests.upstreams.many_server [COUNT]` serves COUNT tools (100) over stdio. With
MANY_SERVER_CALL_LOG set, each call appends its arguments to that file (a test sees what arrived).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

SERVICES = [
    "jira", "github", "slack", "gmail", "calendar", "drive", "notion", "salesforce", "zendesk", "stripe",
]  # fmt: skip
#: action name -> what it does, for its description.
ACTIONS = {
    "create_item": "Create a new {thing} in {service}.",
    "get_item": "Fetch one {thing} from {service} by its id.",
    "update_item": "Change the fields of an existing {thing} in {service}.",
    "delete_item": "Delete a {thing} from {service} for good.",
    "list_items": "List the {thing}s in {service}, newest first.",
    "search_items": "Search {service} for {thing}s matching a text query.",
    "comment_item": "Add a comment to a {thing} in {service}.",
    "assign_item": "Assign a {thing} in {service} to a person.",
    "archive_item": "Archive a {thing} in {service} so it no longer shows in lists.",
    "export_items": "Export {service} {thing}s as CSV for a report.",
}
THINGS = {
    "jira": "issue", "github": "pull request", "slack": "message", "gmail": "email", "calendar": "event",
    "drive": "file", "notion": "page", "salesforce": "lead", "zendesk": "ticket", "stripe": "invoice",
}  # fmt: skip


def tool_names(count: int) -> list[tuple[str, str]]:
    """(name, description) of the first `count` tools: every action of a service, then the next
    service; past the ten services, numbered copies of them (`jira2_create_item`)."""
    tools = []
    round_number = 0
    while len(tools) < count:
        for service in SERVICES:
            label = service if round_number == 0 else f"{service}{round_number + 1}"
            for action, text in ACTIONS.items():
                tools.append((f"{label}_{action}", text.format(thing=THINGS[service], service=label)))
        round_number += 1
    return tools[:count]


def answer(
    query: Annotated[str, Field(description="What the item is about, in words.")],
    limit: Annotated[int, Field(description="How many items to return at most.")] = 10,
    cursor: Annotated[str | None, Field(description="Where the previous page ended.")] = None,
    fields: Annotated[list[str] | None, Field(description="Which fields to include.")] = None,
    dry_run: Annotated[bool, Field(description="Check the request without doing it.")] = False,
) -> str:
    arguments = {"query": query, "limit": limit, "cursor": cursor, "fields": fields, "dry_run": dry_run}
    log = os.environ.get("MANY_SERVER_CALL_LOG")
    if log:
        with open(log, "a") as calls:
            calls.write(json.dumps(arguments) + "\n")
    return json.dumps(arguments)


def build(count: int) -> MCPServer:
    app = MCPServer("many")
    for name, description in tool_names(count):
        app.add_tool(answer, name=name, description=description, structured_output=False)
    return app


if __name__ == "__main__":
    build(int(sys.argv[1]) if len(sys.argv) > 1 else 100).run("stdio")
