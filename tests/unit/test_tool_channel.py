"""The guest's one ToolChannel, which all three runners use for bridged calls and progress."""

from __future__ import annotations

import asyncio
import json
import threading

from mcp_sandbox.bridge.catalog import tool_spec
from mcp_sandbox.guest import Interpreter, ToolChannel
from mcp_sandbox.protocol import ManifestTool, OutputLimits, reply_ok

NO_ARTIFACTS: OutputLimits = {"max_files": 0, "max_bytes": 0, "max_figures": 0}


class Host:
    """Answers each tool_call from another thread, as a runner's reader thread does."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []
        self.channel = ToolChannel(self.send)

    def send(self, payload: str) -> None:
        message = json.loads(payload)
        self.sent.append(message)
        if message["type"] == "tool_call":
            reply = reply_ok({"echo": json.loads(str(message["arguments"])), "tool": message["tool"]})
            threading.Timer(0.01, self.channel.deliver, (message["call"], reply)).start()


def test_a_blocking_call_waits_for_the_reply_from_another_thread() -> None:
    host = Host()
    reply = json.loads(host.channel.call_sync("calc", "add", '{"a": 1}'))
    assert reply == {"ok": True, "value": {"echo": {"a": 1}, "tool": "add"}}
    assert host.sent == [
        {"type": "tool_call", "call": 1, "server": "calc", "tool": "add", "arguments": '{"a": 1}'}
    ]


def test_async_calls_overlap_and_each_gets_its_own_reply() -> None:
    host = Host()

    async def both() -> list[str]:
        return list(
            await asyncio.gather(
                host.channel.call_async("calc", "one", '{"n": 1}'),
                host.channel.call_async("calc", "two", '{"n": 2}'),
            )
        )

    replies = [json.loads(reply)["value"] for reply in asyncio.run(both())]
    assert replies == [{"echo": {"n": 1}, "tool": "one"}, {"echo": {"n": 2}, "tool": "two"}]
    assert [message["call"] for message in host.sent] == [1, 2]


def test_a_runner_that_blocks_itself_is_used_instead_of_a_thread_event() -> None:
    sent: list[str] = []

    def block(call: int, message: str) -> str:  # Pyodide's Atomics.wait, in effect
        sent.append(message)
        return reply_ok(call)

    channel = ToolChannel(sent.append, block)
    assert json.loads(channel.call_sync("s", "t", "{}")) == {"ok": True, "value": 1}
    assert json.loads(sent[0])["type"] == "tool_call"


def test_progress_is_a_protocol_message_and_stray_replies_are_ignored() -> None:
    host = Host()
    host.channel.progress("50% done")
    host.channel.deliver(99, reply_ok(None))  # no such call: nothing happens
    assert host.sent == [{"type": "progress", "line": "50% done"}]


class DescribingHost(Host):
    """Answers each describe with the query it got, as the bridge answers with stubs."""

    def send(self, payload: str) -> None:
        message = json.loads(payload)
        self.sent.append(message)
        if message["type"] == "describe":
            reply = reply_ok(f"# stubs for {message['query']!r}, at most {message['limit']}")
            threading.Timer(0.01, self.channel.deliver, (message["call"], reply)).start()


def test_tools_describe_asks_the_host_over_the_channel_and_shows_the_text_as_code() -> None:
    host = DescribingHost()
    manifest: list[ManifestTool] = [{"server_py": "calc", "name_py": "add", "params": [], "doc": ""}]
    session = Interpreter(
        {"max_output_chars": 1000, "max_kept_output_chars": 0, "output": NO_ARTIFACTS}, host.channel
    )
    session.install_tools(json.dumps(manifest))
    outcome = session.run(
        "print(tools.describe('jira', limit=2))\n"
        "assert tools.describe(tools.calc.add_async) == tools.describe(tools.calc.add)\n"
        "tools.describe(tools.calc)"
    )
    assert isinstance(outcome, dict) and outcome["success"], outcome
    assert outcome["stdout"] == "# stubs for 'jira', at most 2\n"
    assert outcome["result"] == "# stubs for 'calc', at most 5"  # shown as code, not escaped
    queries = [(m["call"], m["query"]) for m in host.sent if m["type"] == "describe"]
    assert queries == [(1, "jira"), (2, "tools.calc.add"), (3, "tools.calc.add"), (4, "calc")]


def test_tools_describe_refuses_what_it_cannot_send() -> None:
    session = Interpreter(
        {"max_output_chars": 1000, "max_kept_output_chars": 0, "output": NO_ARTIFACTS},
        DescribingHost().channel,
    )
    for code, error_type in [
        ("tools.describe(42)", "TypeError"),
        ("tools.describe('x', limit='5')", "ValueError"),
    ]:
        outcome = session.run(code)
        assert isinstance(outcome, dict) and outcome["error_type"] == error_type, outcome


def test_tools_describe_without_a_bridge_says_so() -> None:
    outcome = Interpreter({"max_output_chars": 1000, "max_kept_output_chars": 0, "output": NO_ARTIFACTS}).run(
        "tools.describe('x')"
    )
    assert isinstance(outcome, dict) and outcome["error_type"] == "ToolError", outcome
    assert "no upstream MCP servers are configured" in str(outcome["error"])


def test_a_tool_whose_schema_takes_other_properties_sends_other_keywords_as_given() -> None:
    schema = {"type": "object", "properties": {"from": {"type": "string"}}, "additionalProperties": True}
    host = Host()
    session = Interpreter(
        {"max_output_chars": 1000, "max_kept_output_chars": 0, "output": NO_ARTIFACTS}, host.channel
    )
    session.install_tools(json.dumps([tool_spec("crm", "crm", "put", "put", "Store.", schema).manifest()]))
    outcome = session.run("tools.crm.put(from_='a', colour='red', **{'x-y': 1})")
    assert isinstance(outcome, dict) and outcome["success"], outcome
    assert json.loads(str(host.sent[0]["arguments"])) == {"from": "a", "colour": "red", "x-y": 1}
