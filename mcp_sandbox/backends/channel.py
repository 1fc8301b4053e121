"""The runner channel: the host's end of a sandbox process's stdin and stdout. Host messages go
out as protocol lines; runner messages come in inside token envelopes, each validated against
the protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, overload

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import Field, TypeAdapter, ValidationError

from mcp_sandbox import protocol
from mcp_sandbox.backends.base import NotDone, SandboxDied
from mcp_sandbox.backends.watch import ProcessWatch
from mcp_sandbox.protocol import RunnerMessage

#: The requests a sandbox answers between runs, and the type of each one's answer.
BetweenRuns = protocol.RecycleMessage | protocol.CheckpointMessage | protocol.RestoreMessage
BetweenRunsAnswer = protocol.RecycledMessage | protocol.CheckpointedMessage | protocol.RestoredMessage
ANSWERS = {"recycle": "recycled", "checkpoint": "checkpointed", "restore": "restored"}
#: Validates what a runner sends (refusing any field the protocol does not name).
RUNNER_MESSAGE: TypeAdapter[RunnerMessage] = TypeAdapter(
    Annotated[RunnerMessage, Field(discriminator="type")]
)


@dataclass(frozen=True)
class Malformed:
    """A genuine runner line whose message does not match the protocol."""

    kind: object
    id: object
    call: object = None


class RunnerChannel:
    """Messages to and from one runner. Only lines in the envelope of the session's `token` are
    the runner's: anything else on stdout was written by the sandboxed program, and is dropped.
    When the process is gone, sending or receiving raises the watch's SandboxDied."""

    def __init__(self, process: anyio.abc.Process, watch: ProcessWatch, token: str, max_line: int) -> None:
        self._process = process
        self._watch = watch
        self._token = token
        self._max_line = max_line
        self._send_messages: MemoryObjectSendStream[RunnerMessage | Malformed]
        self._messages: MemoryObjectReceiveStream[RunnerMessage | Malformed]
        self._send_messages, self._messages = anyio.create_memory_object_stream[RunnerMessage | Malformed](16)
        self._stdin_lock = anyio.Lock()

    async def send(self, message: protocol.HostMessage) -> None:
        """Write one message to the runner's stdin. Raises SandboxDied."""
        if self._process.stdin is None or not self._watch.alive:
            raise SandboxDied(self._watch.reason())
        try:
            async with self._stdin_lock:
                await self._process.stdin.send(protocol.encode(message))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            raise SandboxDied(self._watch.reason()) from None

    async def send_tool_result(self, call: int, reply: str) -> None:
        """The reply to tool call (or describe) `call`, as a Deliver. Raises SandboxDied."""
        await self.send({"type": "tool_result", "call": call, "reply": reply})

    async def receive(self) -> RunnerMessage | Malformed:
        """The runner's next message. Raises SandboxDied once the process is gone."""
        try:
            return await self._messages.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise await self._watch.report() from None

    @overload
    async def ask(
        self, request: protocol.RecycleMessage, timeout: float
    ) -> protocol.RecycledMessage | NotDone: ...
    @overload
    async def ask(
        self, request: protocol.CheckpointMessage, timeout: float
    ) -> protocol.CheckpointedMessage | NotDone: ...
    @overload
    async def ask(
        self, request: protocol.RestoreMessage, timeout: float
    ) -> protocol.RestoredMessage | NotDone: ...
    async def ask(self, request: BetweenRuns, timeout: float) -> BetweenRunsAnswer | NotDone:
        """Send a request between runs and wait for its answer (the message of type
        `ANSWERS[request type]` with the request's `id`), or say why there is none."""
        answer = ANSWERS[request["type"]]
        try:
            await self.send(request)
            with anyio.fail_after(timeout):
                while True:
                    message = await self.receive()
                    if isinstance(message, Malformed) or message["type"] != answer:
                        continue
                    if message["id"] == request["id"]:  # type: ignore[typeddict-item]
                        return message  # type: ignore[return-value]
        except SandboxDied as error:
            return NotDone(f"the sandbox died: {error}")
        except TimeoutError:
            return NotDone(f"the sandbox did not answer within {timeout:g} s")

    def drain(self) -> None:
        """Drop what arrived between runs: a program may leave a timer that forges messages."""
        while True:
            try:
                self._messages.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return

    async def pump(self) -> None:
        """Feed the runner's messages from its stdout to `receive` until the process ends."""
        assert self._process.stdout is not None
        reader = BufferedByteReceiveStream(self._process.stdout)
        try:
            while True:
                line = await reader.receive_until(b"\n", self._max_line)
                raw = protocol.open_envelope(line, self._token)
                if raw is None:
                    continue  # not from the runner: forged by the sandbox
                await self._send_messages.send(parse(raw))
        except anyio.DelimiterNotFound:
            self._watch.fail("the sandbox wrote a line longer than the protocol allows")
        except (
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
        ):
            pass
        finally:
            self._send_messages.close()

    def close(self) -> None:
        """End `receive`: what waits for a message gets the watch's SandboxDied."""
        self._send_messages.close()


def parse(raw: dict[str, Any]) -> RunnerMessage | Malformed:
    """A runner message as the protocol describes it, or Malformed."""
    try:
        return RUNNER_MESSAGE.validate_python(raw)
    except ValidationError:
        return Malformed(raw.get("type"), raw.get("id"), raw.get("call"))
