"""The runner channel: the host's end of one sandbox's messages. A runner process's stdin and
stdout are its pipe (`RunnerPipe`), which may carry several sandboxes' messages: host messages go
out as protocol lines (sealed, to a runner whose sandboxes can read its stdin), runner messages
come in inside token envelopes, each to the channel of the sandbox it names, validated against
the protocol."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Protocol, overload

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import Field, TypeAdapter, ValidationError

from mcp_sandbox import protocol
from mcp_sandbox.backends.base import NotDone, SandboxDied
from mcp_sandbox.backends.watch import ProcessWatch
from mcp_sandbox.protocol import RunnerMessage

#: The requests a sandbox answers between runs, and the type of each one's answer.
BetweenRuns = protocol.RecycleMessage | protocol.CheckpointMessage | protocol.RestoreMessage
BetweenRunsAnswer = protocol.RecycledMessage | protocol.CheckpointedMessage | protocol.RestoredMessage
ANSWERS = {"recycle": "recycled", "checkpoint": "checkpointed", "restore": "restored"}
#: Messages of one sandbox that may wait to be read: a run's host reads them as they come.
ROUTE_BUFFER = 256
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


class Watch(Protocol):
    """What a channel asks of its sandbox's watch (watch.py): whether it lives, and why not."""

    @property
    def alive(self) -> bool: ...

    def reason(self) -> str: ...

    async def report(self) -> SandboxDied: ...


class Sealer:
    """Seals host lines for a runner whose sandboxes can read its stdin: they read only what they
    cannot open (`protocol.host_line_key`). Each line takes the next nonce, so seal in send order."""

    def __init__(self, token: str) -> None:
        self._aead = AESGCM(protocol.host_line_key(token))
        self._sent = 0

    def seal(self, line: bytes) -> bytes:
        self._sent += 1
        nonce = self._sent.to_bytes(protocol.HOST_LINE_NONCE_BYTES, "big")
        return base64.b64encode(nonce + self._aead.encrypt(nonce, line.rstrip(b"\n"), None)) + b"\n"


class RunnerPipe:
    """A runner process's stdin and stdout. Only lines in the envelope of the process's `token`
    are the runner's: anything else on stdout was written by sandboxed code, and is dropped. Each
    genuine message goes to the channel of the sandbox its envelope names (`enveloped`: the runner
    hosts several sandboxes, which can read its stdin: host lines name their sandbox, and are
    sealed; else it hosts one, number 0)."""

    def __init__(
        self, process: anyio.abc.Process, watch: ProcessWatch, token: str, max_line: int, *, enveloped: bool
    ) -> None:
        self._process = process
        self._watch = watch
        self._token = token
        self._max_line = max_line
        self._enveloped = enveloped
        self._sealer = Sealer(token) if enveloped else None
        self._routes: dict[
            int, tuple[MemoryObjectSendStream[RunnerMessage | Malformed], Callable[[str], None]]
        ] = {}
        self._stdin_lock = anyio.Lock()
        self._ended = False

    def open(
        self, sandbox: int, ended: Callable[[str], None]
    ) -> MemoryObjectReceiveStream[RunnerMessage | Malformed]:
        """Sandbox `sandbox`'s messages from now on; `ended` hears why, if the runner ends it."""
        send, receive = anyio.create_memory_object_stream[RunnerMessage | Malformed](ROUTE_BUFFER)
        if self._ended:
            send.close()
        else:
            self._routes[sandbox] = (send, ended)
        return receive

    def close(self, sandbox: int) -> None:
        """No more messages for `sandbox`: what waits for one hears of its end."""
        route = self._routes.pop(sandbox, None)
        if route is not None:
            route[0].close()

    async def write(self, message: protocol.HostMessage, sandbox: int) -> None:
        """Write one message for `sandbox` to the runner's stdin. Raises SandboxDied."""
        if self._process.stdin is None or not self._watch.alive:
            raise SandboxDied(self._watch.reason())
        line = protocol.encode(message, sandbox if self._enveloped else None)
        try:
            async with self._stdin_lock:
                await self._process.stdin.send(self._sealer.seal(line) if self._sealer else line)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            raise SandboxDied(self._watch.reason()) from None

    async def pump(self) -> None:
        """Feed the runner's messages from its stdout to their channels until the process ends."""
        assert self._process.stdout is not None
        reader = BufferedByteReceiveStream(self._process.stdout)
        try:
            while True:
                line = await reader.receive_until(b"\n", self._max_line)
                opened = protocol.open_runner_line(line, self._token)
                if opened is not None:  # else not from the runner: forged by sandboxed code
                    await self._deliver(*opened)
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
            self._ended = True
            for sandbox in list(self._routes):
                self.close(sandbox)

    async def _deliver(self, sandbox: int, raw: dict[str, Any]) -> None:
        route = self._routes.get(sandbox)
        if route is None:
            return  # a closed sandbox's last words
        message = parse(raw)
        if not isinstance(message, Malformed) and message["type"] == "ended":
            route[1](message["message"])
            self.close(sandbox)
            return
        # Never waits: one sandbox that is not read (a program's timer posting between runs) must
        # not hold up the others' messages. Progress is a sample and may be dropped; anything else
        # that does not fit ends this sandbox, which sent more than its host reads.
        try:
            route[0].send_nowait(message)
        except anyio.WouldBlock:
            if isinstance(message, Malformed) or message["type"] != "progress":
                route[1]("the sandbox sent more messages than its host could read")
                self.close(sandbox)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass


class RunnerChannel:
    """Messages to and from one sandbox of a runner process, over its pipe. When the sandbox is
    gone, sending or receiving raises its watch's SandboxDied."""

    def __init__(self, pipe: RunnerPipe, sandbox: int, watch: Watch, ended: Callable[[str], None]) -> None:
        self._pipe = pipe
        self._sandbox = sandbox
        self._watch = watch
        self._messages = pipe.open(sandbox, ended)

    async def send(self, message: protocol.HostMessage) -> None:
        """Write one message to the runner for this sandbox. Raises SandboxDied."""
        if not self._watch.alive:
            raise SandboxDied(self._watch.reason())
        await self._pipe.write(message, self._sandbox)

    async def send_tool_result(self, call: int, reply: str) -> None:
        """The reply to tool call (or describe) `call`, as a Deliver. Raises SandboxDied."""
        await self.send({"type": "tool_result", "call": call, "reply": reply})

    async def receive(self) -> RunnerMessage | Malformed:
        """The runner's next message for this sandbox. Raises SandboxDied once it is gone."""
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

    def close(self) -> None:
        """End `receive`: what waits for a message gets the watch's SandboxDied."""
        self._pipe.close(self._sandbox)


def parse(raw: dict[str, Any]) -> RunnerMessage | Malformed:
    """A runner message as the protocol describes it, or Malformed."""
    try:
        return RUNNER_MESSAGE.validate_python(raw)
    except ValidationError:
        return Malformed(raw.get("type"), raw.get("id"), raw.get("call"))
