"""Every message that crosses a process or language boundary, and every size cap they share.

Standard library only: this module is also loaded inside every sandbox (the runners install it
as `mcp_sandbox.protocol` before the guest runtime), and the Deno runner's TypeScript types and
constants are generated from it (`backends/pyodide/protocol.ts`, checked by the tests).

Host <-> runner. One JSON object per line: host -> runner on the runner's stdin, runner -> host
on its stdout. Every runner line is an envelope ``{"token": <str>, "msg": <RunnerMessage>}``
(``envelope_prefix``); the token is a random secret the host sends in ``init`` (to the Deno
runner, in its environment instead, ``RUNNER_TOKEN_ENV``: its sandboxes can read its stdin). In
the Deno runner only the main thread knows it, and sandboxed code never runs there, so a line the
sandbox prints itself carries no valid token and is dropped. (The CPython worker keeps the
token in the sandbox's own process: a program there can forge its own results, as the README's
security table says.) The Deno runner hosts several sandboxes, each a worker: its host lines
are ``HostEnvelope``s naming one, and its own envelopes end with ``"sandbox": <int>``. Each of
its host lines is sealed, since any of its sandboxes can read its stdin: the line is base64 of a
12-byte nonce (a counter the host raises with every line), then the AES-256-GCM ciphertext and
tag of the envelope's JSON under ``host_line_key(token)``. The runner drops a line that does not
open. Closing the runner's stdin asks it to exit.

    host -> runner                          runner -> host
    init         once, first                ready      the sandbox can run programs
    run          run a program              result     run ``id`` ended (a GuestOutcome)
    interrupt    stop run ``id``            crashed    the runtime failed during run ``id``
    jit_warm_up  spend idle time on the JIT fatal      the runner cannot go on
    tool_result  answer tool_call ``call``  progress   the latest line the program printed
                 (or describe ``call``)     tool_call  code calls tools.<server>.<tool>
                                            describe   code calls tools.describe(...)
    close        (Pyodide) end this sandbox ended     (Pyodide) this sandbox is gone

Runner <-> worker (Pyodide only). The Deno runner's main thread (runner.ts) owns stdin/stdout
and hosts Pyodide in a less-permitted Worker (worker.ts). On the worker's own channel the main
thread sends ``WorkerAhead`` (to a worker started ahead) and ``WorkerInit``, which hands over a
private ``MessagePort`` (``control``) that only the worker's own module holds. Everything else
goes over that port: ``ControlRequest`` one way (``WorkerData``, the host's ``run``,
``jit_warm_up`` and ``tool_result`` as they came, and recycle, checkpoint, restore, kill);
``WorkerPost`` (whose ``json`` is a RunnerMessage the main thread forwards), ``ControlAnswer``
and the worker's hand-overs the other. Sandboxed code can listen to, post on and dispatch to the
worker's own channel, so the main thread never reads it and the worker reads it only until its
init: nothing sent there later is the runner's.

A blocking tool call uses shared memory: the worker posts the tool_call with ``syncCall`` set, then
sleeps in ``Atomics.wait(syncState, SYNC_STATE, SYNC_WAITING)``; the main thread writes the
reply's UTF-8 bytes into ``syncData`` (grown to fit, at most SYNC_REPLY_MAX_BYTES), their length
into ``syncState[SYNC_LENGTH]``, and sets ``syncState[SYNC_STATE]`` to SYNC_REPLY_READY, or to
SYNC_INTERRUPTED when the run is interrupted.

Stopping a run uses shared memory too: ``signals`` (an Int32Array of two). The main thread writes
INTERRUPT_SIGNAL into ``signals[SIGNAL_INTERRUPT]`` (Pyodide's interrupt buffer: KeyboardInterrupt
in the running Python code) and, for a ``kill``, 1 into ``signals[SIGNAL_KILL]`` (the worker's
runtime throws at its next check, ending the program); it then notifies both, waking a sleeping
program. A program ended that way, or by os._exit, leaves the worker to go back to its clean
point (``WorkerRecycledCrash``). A worker that cannot, or that ends during a run, is replaced by a
new one, made from the compiled module the first worker handed over on its private channel
(``WorkerModule``).
"""

from __future__ import annotations

import difflib
import hashlib
import hmac
import json
from typing import Any, Literal, NewType, NotRequired

try:  # pydantic validates these on the host, and before Python 3.12 it needs this TypedDict
    from typing_extensions import TypedDict
except ImportError:  # inside a sandbox: the standard library's serves
    from typing import TypedDict

# Types that exist only on the JavaScript side (shared memory handed to the Pyodide worker).
Uint8Array = NewType("Uint8Array", object)
MessagePort = NewType("MessagePort", object)
Int32Array = NewType("Int32Array", object)
WasmModule = NewType("WasmModule", object)
SharedArrayBuffer = NewType("SharedArrayBuffer", object)

# --- Size caps and constants (each has this one value, in Python and in TypeScript) ---

#: Largest reply to a bridged tool call, in characters of JSON text.
MAX_TOOL_REPLY_CHARS = 8 * 1024 * 1024
#: The shared buffer a blocking tool call's reply travels in: 4 UTF-8 bytes per character, at most.
SYNC_REPLY_MAX_BYTES = 4 * MAX_TOOL_REPLY_CHARS + 65_536
#: The shared buffer's first size; it grows to fit a larger reply.
SYNC_DATA_INITIAL_BYTES = 65_536
#: Slots of ``syncState`` (an Int32Array of two).
SYNC_STATE, SYNC_LENGTH = 0, 1
#: Values of ``syncState[SYNC_STATE]``.
SYNC_WAITING, SYNC_REPLY_READY, SYNC_INTERRUPTED = 0, 1, 2
#: What the runner writes into Pyodide's interrupt buffer: SIGINT, raising KeyboardInterrupt.
INTERRUPT_SIGNAL = 2
#: Slots of ``signals`` (an Int32Array of two): Pyodide's interrupt buffer, and the kill flag.
SIGNAL_INTERRUPT, SIGNAL_KILL = 0, 1
#: Seconds a killed program's worker gets to end and be replaced before its process is killed.
KILL_WAIT = 1.0
#: The JIT warm-up runs only after this long without a message from the host.
JIT_WARM_UP_IDLE_MS = 250
#: Rounds of the JIT warm-up a Pyodide sandbox runs before ``ready``.
JIT_WARM_UP_ROUNDS_AT_START = 3
#: A progress line is at most this long, and sent at most every PROGRESS_EVERY_S seconds.
MAX_PROGRESS_LINE_CHARS = 200
PROGRESS_EVERY_S = 0.5
#: The guest runtime's modules (mcp_sandbox/guest/), in the order a runner loads them after this
#: one: each imports only the protocol and those before it. The last, the package, is the runtime.
GUEST_MODULES = (
    "mcp_sandbox.guest.capture",
    "mcp_sandbox.guest.program",
    "mcp_sandbox.guest.tools",
    "mcp_sandbox.guest.artifacts",
    "mcp_sandbox.guest.tables",
    "mcp_sandbox.guest.interpreter",
    "mcp_sandbox.guest.checkpoint",
    "mcp_sandbox.guest.readonly",
    "mcp_sandbox.guest.pyodide_worker",
    "mcp_sandbox.guest",
)
GUEST_RUNTIME_MODULE = GUEST_MODULES[-1]
#: Files a program writes here (relative to its working directory) come back with the result.
OUTPUT_DIR = "output"
#: The sandbox's read-only copy of the host's data folder (relative to its working directory).
DATA_DIR = "data"
#: Where a CPython worker writes and reads checkpoint files (relative to its working directory).
CHECKPOINT_FOLDER = ".checkpoints"
#: (Pyodide) The environment variable that gives the Deno runner its token, which only its main
#: thread may read. Never sent on its stdin: node:fs and process.stdin let any of its sandboxes read
#: that, and a token read there would let one forge lines as any other sandbox of the process.
RUNNER_TOKEN_ENV = "MCP_SANDBOX_RUNNER_TOKEN"
#: (Pyodide) What the key of the Deno runner's sealed host lines is made from, with its token.
HOST_LINE_KEY_LABEL = "mcp-sandbox host lines\n"
#: (Pyodide) Bytes of a sealed host line's nonce and of its tag.
HOST_LINE_NONCE_BYTES, HOST_LINE_TAG_BYTES = 12, 16
#: A program that leaves more files than this in output/ is not scanned further.
MAX_SCANNED_FILES = 10_000
#: Longest output file path a guest may report.
MAX_OUTPUT_PATH_CHARS = 1024
#: Notes a guest may attach to one outcome, each at most MAX_NOTE_CHARS.
MAX_NOTES, MAX_NOTE_CHARS = 10, 500
#: Of the DataFrames and Series a run shows (display() and its final value), what is sent as data for
#: a notebook view: this many tables, each this many rows (head and tail) and columns, and of a
#: cell, a label or a type this many characters.
MAX_TABLES, MAX_TABLE_ROWS, MAX_TABLE_COLUMNS, MAX_CELL_CHARS = 8, 100, 50, 100
#: Room for the truncation marker when a guest caps a text field itself.
MARKER_SLACK = 100
TRUNCATION_MARKER = "\n... [{cut:,} characters truncated] ...\n"


def max_line_bytes(max_output_chars: int, max_artifact_bytes: int = 0, max_kept_output_chars: int = 0) -> int:
    """Longest genuine runner line: four capped text fields and two kept streams, each char at
    most six JSON bytes, plus figures and output files sent inline as base64 (4 characters for
    every 3 bytes)."""
    chars = 4 * (max_output_chars + 200) + 2 * max_kept_output_chars
    return 6 * chars + (max_artifact_bytes * 4) // 3 + 65_536


def cap_text(text: str, limit: int) -> tuple[str, bool]:
    """`text` within `limit` characters, keeping the first half and the last half around a
    marker that says how much was cut; and whether anything was cut."""
    head_limit, tail_limit = limit - limit // 2, limit // 2
    if len(text) <= head_limit + tail_limit:
        return text, False
    head, tail = text[:head_limit], text[len(text) - tail_limit :] if tail_limit else ""
    return head + TRUNCATION_MARKER.format(cut=len(text) - len(head) - len(tail)) + tail, True


def closest_hint(name: str, names: list[str]) -> str:
    """A hint naming the few closest of `names` to a misspelt `name` (never all of them: there may
    be hundreds), worded alike in the guest's errors and the host's check before a run."""
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    if close:
        return "; did you mean " + " or ".join(repr(n) for n in close) + "?"
    if len(names) <= 10:
        return "; it has: " + ", ".join(names)
    return f"; it has {len(names)} (search_tools finds them by words)"


# --- What a run hands back ---


class OutputLimits(TypedDict):
    """What one run may hand back besides text."""

    max_files: int
    max_bytes: int
    max_figures: int


class GuestLimits(TypedDict):
    """A sandbox's limits, fixed when it starts."""

    max_output_chars: int
    #: How much of a cut stdout or stderr is kept whole for the host (0: none), from its start.
    max_kept_output_chars: int
    output: OutputLimits


class GuestFile(TypedDict):
    """A file the program wrote to output/: ``path`` relative to output/; ``data`` (base64) when
    the host cannot read the sandbox's disk."""

    path: str
    size: int
    data: NotRequired[str]


class KeptText(TypedDict):
    """A cut stream's text from its start, up to max_kept_output_chars, and how many characters
    were written in all."""

    text: str
    total: int


class GuestTable(TypedDict):
    """A DataFrame or Series a run showed, as data: ``source`` is display (``printed``: the span of
    stdout its text took, in characters as Python counts them, when stdout was not cut) or value
    (the final value); ``positions``: the row numbers, in the whole table, of the rows sent."""

    kind: Literal["DataFrame", "Series"]
    source: Literal["display", "value"]
    shape: list[int]
    columns: list[str]
    dtypes: list[str]
    index_name: str | None
    index: list[str]
    rows: list[list[int | float | str | bool | None]]
    positions: list[int]
    printed: list[int] | None


class GuestOutcome(TypedDict):
    """What the sandbox reports about one run. Untrusted: the host validates it."""

    success: bool
    stdout: str
    stderr: str
    result: str | None
    error_type: str | None
    error: str | None
    truncated: bool
    files: NotRequired[list[GuestFile]]
    figures: NotRequired[list[str]]
    notes: NotRequired[list[str]]
    tables: NotRequired[list[GuestTable]]
    #: Only for a stream that was cut.
    kept_stdout: NotRequired[KeptText]
    kept_stderr: NotRequired[KeptText]


# --- Replies to bridged tool calls (JSON text in tool_result.reply) ---


class ToolContentItem(TypedDict):
    """One block of a tool's result that is not plain data. `data`: base64 bytes (an image,
    audio, a binary resource); `text`: a text block's or a text resource's text; `uri`: a
    resource's or a link's address."""

    kind: Literal["text", "image", "audio", "resource", "resource_link"]
    mime_type: NotRequired[str | None]
    data: NotRequired[str]
    text: NotRequired[str]
    uri: NotRequired[str]


class ToolReplyOk(TypedDict):
    ok: Literal[True]
    value: Any
    #: Instead of `value` when the result holds images or resources: its blocks, in order.
    content: NotRequired[list[ToolContentItem]]


class ToolReplyError(TypedDict):
    ok: Literal[False]
    error: str


class ToolReplyInterrupted(TypedDict):
    """Only inside the sandbox: the run was interrupted while the call waited."""

    ok: Literal[False]
    interrupted: Literal[True]


ToolReply = ToolReplyOk | ToolReplyError | ToolReplyInterrupted


def reply_ok(value: Any, content: list[ToolContentItem] | None = None) -> str:
    reply = ToolReplyOk(ok=True, value=value)
    if content is not None:
        reply["content"] = content
    return json.dumps(reply, ensure_ascii=False)


def reply_error(message: str) -> str:
    return json.dumps(ToolReplyError(ok=False, error=message), ensure_ascii=False)


REPLY_INTERRUPTED = json.dumps(ToolReplyInterrupted(ok=False, interrupted=True))

# --- The tool manifest (RunMessage.tools, JSON text): a list of ManifestTool ---


class ManifestParam(TypedDict):
    """One parameter of a tool: ``name`` as the upstream's schema spells it, ``py`` its Python
    name, ``annotation`` the type its signature shows (``"str | int"``)."""

    name: str
    py: str
    annotation: str
    required: bool


class ManifestTool(TypedDict):
    """One tool, as the guest builds ``tools.<server_py>.<name_py>`` and its ``_async`` twin:
    ``doc`` is their docstring; ``other_keywords``, only when the input schema takes properties it
    does not list, names the ``**`` parameter that takes them (sent as given)."""

    server_py: str
    name_py: str
    params: list[ManifestParam]
    doc: str
    other_keywords: NotRequired[str]


# --- Host -> runner ---


class InitMessage(TypedDict):
    """First line, once. ``guest_modules``: (module name, Python source) pairs the runner loads
    in order (this module, then GUEST_MODULES); none for a Pyodide sandbox that starts from a
    memory snapshot, which holds them all (its file's name is made from their sources). The host
    folders the sandbox reads: Pyodide, data/, packages, the memory snapshot to start from;
    ``allow_net``: hosts it may reach."""

    type: Literal["init"]
    #: The CPython worker's; the Deno runner gets none (``RUNNER_TOKEN_ENV``).
    token: NotRequired[str]
    guest_modules: list[tuple[str, str]]
    limits: GuestLimits
    pyodide_dir: NotRequired[str]
    data_dir: NotRequired[str]
    packages_dir: NotRequired[str]
    allow_net: NotRequired[str]
    snapshot: NotRequired[str]
    #: (Pyodide) V8's code cache of Pyodide's runtime script, made for the runner's V8 flags, and
    #: its sha256 (V8 itself finds no damage in a cache's body).
    code_cache: NotRequired[str]
    code_cache_sha256: NotRequired[str]
    #: The one folder the runner writes, for checkpoint files; the sandbox never reaches it.
    checkpoint_dir: NotRequired[str]
    #: (Pyodide) packages of the packages folder to load and import before the clean point.
    preload: NotRequired[list[str]]
    #: (Pyodide) the most WebAssembly memory the interpreter may grow to, in bytes: past it an
    #: allocation fails with MemoryError, and the sandbox goes on.
    memory_max_bytes: NotRequired[int]


class RunMessage(TypedDict):
    """Run a program in the sandbox's interpreter. ``tools`` (the tool manifest: JSON text, a
    list of ManifestTool) replaces the guest's `tools` first; sent only when the catalog changed."""

    type: Literal["run"]
    id: int
    code: str
    tools: NotRequired[str]


class InterruptMessage(TypedDict):
    """Raise KeyboardInterrupt in run ``id`` if it is still running (ignored otherwise)."""

    type: Literal["interrupt"]
    id: int


class KillMessage(TypedDict):
    """(Pyodide) Run ``id`` ignored its interrupt: end it at the interpreter's next check, and
    replace the worker (answered by ``crashed`` with ``renewed``, then ``ready``)."""

    type: Literal["kill"]
    id: int


class JitWarmUpMessage(TypedDict):
    """(Pyodide) Spend idle time running a sample program ``rounds`` times so V8 compiles the
    interpreter's hot code: one round at a time, after JIT_WARM_UP_IDLE_MS without a message."""

    type: Literal["jit_warm_up"]
    rounds: int


class ToolResultMessage(TypedDict):
    """The answer to tool_call number ``call``: ``reply`` is a ToolReply as JSON text."""

    type: Literal["tool_result"]
    call: int
    reply: str


class RecycleMessage(TypedDict):
    """(Pyodide) Put the sandbox back into its clean state in place, between runs, so it can serve
    another caller; answered by ``recycled`` with the same ``id``."""

    type: Literal["recycle"]
    id: int


class CheckpointMessage(TypedDict):
    """Between runs, write the interpreter's state to ``file`` (a bare name): in the init's
    ``checkpoint_dir`` (Pyodide), or in CHECKPOINT_FOLDER of the working directory (CPython);
    answered by ``checkpointed`` with the same ``id``."""

    type: Literal["checkpoint"]
    id: int
    file: str


class CloseMessage(TypedDict):
    """(Pyodide) This sandbox is done: its worker is ended, and nothing more is sent for it. The
    runner's other sandboxes go on; closing stdin ends the process."""

    type: Literal["close"]


class RestoreMessage(TypedDict):
    """Put the checkpoint in ``file`` (where ``checkpoint`` writes it; the runner deletes it)
    into this sandbox, which must not have run a program since it started or was recycled;
    answered by ``restored``. A sandbox whose restore failed must not be used again."""

    type: Literal["restore"]
    id: int
    file: str


HostMessage = (
    InitMessage
    | RunMessage
    | InterruptMessage
    | KillMessage
    | JitWarmUpMessage
    | ToolResultMessage
    | RecycleMessage
    | CheckpointMessage
    | RestoreMessage
    | CloseMessage
)

# --- Runner -> host ---


class ReadyMessage(TypedDict):
    """The sandbox is loaded; runs may be sent. ``pyodide`` is null on CPython."""

    type: Literal["ready"]
    python: str
    pyodide: str | None
    load_ms: int
    #: (Pyodide) preloads that failed, each with why: the sandbox serves without them.
    preload_failed: NotRequired[list[str]]
    #: (Pyodide) the steps of ``load_ms`` in order, each with its milliseconds (the debug log's).
    phases: NotRequired[list[tuple[str, int]]]
    #: (Pyodide) what became of the code cache of Pyodide's runtime script (script.ts): V8 took it,
    #: refused it (another V8, other flags), or it was not the file the host made (missing, damaged).
    code_cache: NotRequired[Literal["used", "refused", "damaged"]]
    #: (Pyodide) how it read the memory snapshot: its pages not all zero only (a process's first
    #: worker found them, in the same file), or the whole file.
    snapshot_read: NotRequired[Literal["pages", "whole"]]


class ResultMessage(TypedDict):
    type: Literal["result"]
    id: int
    outcome: GuestOutcome


class CrashedMessage(TypedDict):
    """The runtime itself failed during run ``id``, or was killed; its state is gone. The
    sandbox is unusable unless ``renewed``: the runner is replacing its worker with a new one in
    the same process, as clean as a new sandbox, whose ``ready`` (or ``fatal``) follows; or,
    with ``recycled`` too, the worker put itself back to its clean point (as a ``recycle`` does),
    and serves again at once, with no ``ready``."""

    type: Literal["crashed"]
    id: int | None
    message: str
    renewed: NotRequired[bool]
    recycled: NotRequired[bool]


class FatalMessage(TypedDict):
    """The runner cannot go on (Pyodide failed to load)."""

    type: Literal["fatal"]
    message: str


class EndedMessage(TypedDict):
    """(Pyodide) The sandbox is gone for good (its worker ended between runs, or could not be
    replaced), for ``message``'s reason; the runner's other sandboxes go on."""

    type: Literal["ended"]
    message: str


class ProgressMessage(TypedDict):
    """The latest line the program printed (for progress reports)."""

    type: Literal["progress"]
    line: str


class ToolCallMessage(TypedDict):
    """Sandboxed code calls tools.<server>.<tool>; ``arguments`` is JSON text; ``call`` numbers
    the calls of one sandbox. Answered by tool_result, possibly out of order."""

    type: Literal["tool_call"]
    call: int
    server: str
    tool: str
    arguments: str


class DescribeMessage(TypedDict):
    """Sandboxed code calls tools.describe(``query``): the Python stubs of the tools it names (a
    server, a tool, or words to search for, the best ``limit``). Numbered with the tool calls,
    counted with them, and answered the same way: a tool_result whose value is the stub text."""

    type: Literal["describe"]
    call: int
    query: str
    limit: int


class RecycledMessage(TypedDict):
    """The answer to recycle ``id``: ``clean``, or why the sandbox cannot be recycled (``reason``;
    the host then replaces it). ``ms``: what the reset took."""

    type: Literal["recycled"]
    id: int
    clean: bool
    reason: str | None
    ms: float


class CheckpointedMessage(TypedDict):
    """The answer to checkpoint ``id``: ``saved`` (``bytes`` written), or why not (``reason``,
    written for the caller: what they can do about it). ``lost``: what a restore will not bring
    back (open files, pending timers)."""

    type: Literal["checkpointed"]
    id: int
    saved: bool
    reason: str | None
    lost: list[str]
    bytes: int
    ms: float


class RestoredMessage(TypedDict):
    """The answer to restore ``id``: ``restored``, or why not (``reason``)."""

    type: Literal["restored"]
    id: int
    restored: bool
    reason: str | None
    ms: float


RunnerMessage = (
    ReadyMessage
    | ResultMessage
    | CrashedMessage
    | FatalMessage
    | EndedMessage
    | ProgressMessage
    | ToolCallMessage
    | DescribeMessage
    | RecycledMessage
    | CheckpointedMessage
    | RestoredMessage
)


class HostEnvelope(TypedDict):
    """(Pyodide) A host line to a runner that hosts several sandboxes: ``msg`` is for sandbox
    number ``sandbox``, whose first message is its ``init``."""

    sandbox: int
    msg: HostMessage


def encode(message: HostMessage, sandbox: int | None = None) -> bytes:
    """One host line: the message itself, or, for a runner of several sandboxes, its envelope."""
    line: HostMessage | HostEnvelope = message if sandbox is None else {"sandbox": sandbox, "msg": message}
    return json.dumps(line, ensure_ascii=False).encode() + b"\n"


def host_line_key(token: str) -> bytes:
    """(Pyodide) The AES-256 key of the host lines to the Deno runner whose token is ``token``."""
    return hashlib.sha256((HOST_LINE_KEY_LABEL + token).encode()).digest()


def envelope_prefix(token: str) -> str:
    """What every genuine runner line starts with; the message's JSON and ``}`` follow."""
    return '{"token":' + json.dumps(token) + ',"msg":'


def open_envelope(line: bytes, token: str) -> dict[str, Any] | None:
    """The (not yet validated) message inside a runner line, or None when the line is not genuine."""
    opened = open_runner_line(line, token)
    return None if opened is None else opened[1]


def open_runner_line(line: bytes, token: str) -> tuple[int, dict[str, Any]] | None:
    """The sandbox a genuine runner line is from (its envelope's ``sandbox``, after ``msg``; 0
    where a runner hosts one) and its (not yet validated) message; None when it is not genuine."""
    if not line.startswith(envelope_prefix(token).encode()):
        return None  # forged: not parsed at all
    try:
        envelope = json.loads(line)
    except (ValueError, RecursionError):  # a line nested thousands deep must not reach the host's stack
        return None
    if not isinstance(envelope, dict):
        return None
    sent_token = envelope.get("token")
    message = envelope.get("msg")
    if not isinstance(sent_token, str) or not isinstance(message, dict):
        return None
    if not hmac.compare_digest(sent_token.encode(), token.encode()):
        return None
    sandbox = envelope.get("sandbox", 0)
    if not isinstance(sandbox, int) or isinstance(sandbox, bool):
        return None
    return sandbox, message


# --- The CPython worker's command line ---


class Confinement(TypedDict):
    """What a worker confining itself (tier landlock) may reach: it adds its working directory
    to ``read_write``; ``seccomp`` is the filter (base64 of a struct sock_filter array)."""

    read_only: list[str]
    read_write: list[str]
    seccomp: str


class ProcessLimits(TypedDict):
    """What the CPython worker does to itself before anything else (JSON, its one argument):
    resource limits; as root, become ``uid`` (and drop every capability); with ``confine``,
    Landlock and seccomp."""

    memory_mb: int
    cpu_seconds: int
    open_files: int
    file_mb: int
    processes: int
    uid: int | None
    #: With ``uid``: keep CAP_DAC_READ_SEARCH (a Python other users cannot read, outside bubblewrap).
    read_anything: bool
    confine: Confinement | None


# --- Runner <-> worker (Pyodide) ---


class SnapshotPages(TypedDict):
    """A memory snapshot file as Pyodide wrote it: ``header`` (its first bytes: magic, build id and
    JSON), then ``memoryBytes`` of memory, of which the runs in ``copied`` ([start, end) offsets)
    are not all zero and the pages in ``zero`` are. A worker started after the process's first
    reached its clean point reads only those runs from the file, straight into its memory, if the
    file is still the one read
    (``identity``: its device, inode, size and birth time, else change time; one made again is
    another file, with other contents in the same layout or not)."""

    identity: str
    header: Uint8Array
    memoryBytes: int
    copied: Int32Array
    zero: Int32Array


class WorkerCleanMemory(TypedDict):
    """Sent once on the private channel, at the clean point, by a worker given no clean memory:
    its own, in shared memory, for the main thread to give every later worker (WorkerInit).
    ``fingerprint``: what the clean point holds outside that memory (stack pointer, table
    lengths, packages), which an adopter's must match."""

    cleanMemory: Uint8Array
    fingerprint: str
    #: the clean memory's runs ([start, end) offsets) not all zero, and its pages all zero: every
    #: adopter resets against them, and need not read the 24 MB again to find them.
    copied: Int32Array
    zero: Int32Array
    #: where the memory snapshot's pages not all zero are, found as this worker restored it whole.
    snapshot: NotRequired[SnapshotPages]


class WorkerInit(TypedDict):
    type: Literal["init"]
    guest_modules: list[tuple[str, str]]
    limits: GuestLimits
    signals: Int32Array
    syncState: Int32Array
    syncData: SharedArrayBuffer
    #: The private channel for ControlRequest and ControlAnswer (transferred, never on globalThis).
    control: MessagePort
    packagesDir: NotRequired[str]
    snapshot: NotRequired[str]
    preload: NotRequired[list[str]]
    memoryMaxBytes: NotRequired[int]
    #: Pyodide's compiled WebAssembly, from the first worker (WorkerModule): a replacement
    #: instantiates it instead of compiling the binary again.
    module: NotRequired[WasmModule]
    #: The process's clean memory, shared: a worker whose clean point has the same fingerprint and
    #: whose memory differs from it in a few pages only (its start's timestamps) adopts it.
    clean: NotRequired[WorkerCleanMemory]
    #: Pyodide's runtime script and its code cache, as WorkerAhead gives them: absent for a worker
    #: started ahead, which had them in its WorkerAhead.
    script: NotRequired[str]
    codeCache: NotRequired[Uint8Array]
    codeCacheDamaged: NotRequired[bool]
    #: The worker was started ahead, before this sandbox needed it (runner.ts): its start, and its
    #: ``load_ms``, count from this message.
    spare: NotRequired[bool]


class WorkerAhead(TypedDict):
    """What every sandbox's worker starts from, sent to a worker started ahead as it is made
    (runner.ts): it runs Pyodide's runtime script then, before any sandbox waits for it."""

    type: Literal["ahead"]
    #: Pyodide's runtime script as rewrites.ts makes it (pyodideScript), once per runner process.
    script: str
    #: V8's code cache of Pyodide's runtime script (script.ts), read from InitMessage.code_cache;
    #: ``codeCacheDamaged`` when that file is not the one the host made, and none is given.
    codeCache: NotRequired[Uint8Array]
    codeCacheDamaged: NotRequired[bool]


class DataFile(TypedDict):
    path: str
    bytes: Uint8Array


class WorkerData(TypedDict):
    """The host's data folder as it changed: files to (re)write under data/, paths removed."""

    type: Literal["data"]
    files: list[DataFile]
    removed: list[str]


class WorkerRecycle(TypedDict):
    """Recycle ``id`` (a ControlRequest); the answer's ``json`` is a WorkerRecycled."""

    type: Literal["recycle"]
    id: int


class WorkerRecycled(TypedDict):
    """The worker's answer (the ``json`` of its ControlAnswer): ``dataLost``: a program changed
    data/, which the worker emptied, so the main thread sends all of it again."""

    type: Literal["recycled"]
    id: int
    clean: bool
    reason: str | None
    ms: float
    dataLost: bool


class WorkerCheckpoint(TypedDict):
    """Checkpoint ``id`` (a ControlRequest); the answer's ``json`` is the CheckpointedMessage
    and, when saved, its ``blob`` the checkpoint."""

    type: Literal["checkpoint"]
    id: int


class WorkerRestore(TypedDict):
    """Restore ``id`` from ``blob`` (a ControlRequest); the answer's ``json`` is the
    RestoredMessage."""

    type: Literal["restore"]
    id: int
    blob: Uint8Array


class WorkerKill(TypedDict):
    """Kill run ``id`` (a ControlRequest, handled at once, never answered): a worker that gets it
    is idle, its program parked in an await, so it ends the run with a ``crashed``."""

    type: Literal["kill"]
    id: int


ControlRequest = (
    WorkerRecycle
    | WorkerCheckpoint
    | WorkerRestore
    | WorkerKill
    | WorkerData
    | RunMessage
    | JitWarmUpMessage
    | ToolResultMessage
)


class ControlAnswer(TypedDict):
    """The worker's answer to the recycle, checkpoint or restore in progress (one at a time)."""

    json: str
    blob: NotRequired[Uint8Array]


class WorkerRecycledCrash(TypedDict):
    """Sent unasked on the private channel when the program of run ``id`` ended the interpreter
    where it stood (os._exit, or the kill flag) and the worker went back to its clean point, so
    that only the worker's own module can say the sandbox is clean. ``message``: what ended it;
    ``dataLost`` as in WorkerRecycled. (Had it not been clean, the worker posts the crash as it
    ends, and is replaced.)"""

    crashed: int
    message: str
    dataLost: bool


class WorkerModule(TypedDict):
    """Sent once on the private channel, before ``ready``: the compiled Pyodide module, kept by
    the main thread to start a replacement worker from."""

    module: WasmModule


class WorkerWarmedUp(TypedDict):
    """Sent on the private channel when a JIT warm-up ran all its rounds: what V8 compiled is the
    module's code, which every worker of the process runs, so the main thread asks no other."""

    warmedUp: Literal[True]


#: What the worker reads on its own channel, only until its init.
WorkerMessage = WorkerInit | WorkerAhead


class WorkerPost(TypedDict):
    """Worker -> main thread, on the private channel (ControlRequest's): what sandboxed code posts
    with the worker's own postMessage is never read. ``json`` is a RunnerMessage; ``id`` is set
    only on the message that ends run ``id`` (its result, or a crash); ``exiting``: the worker is
    gone after this one; ``syncCall``: the tool_call in ``json`` blocks on the shared-memory
    reply."""

    id: int | None
    json: str
    exiting: bool
    syncCall: NotRequired[int]


#: Runner messages a worker may post between results; anything else without a run id is dropped.
PASSING_KINDS = ("progress", "tool_call", "describe", "ready", "fatal")


# pydantic, validating on the host, refuses a field the protocol does not name: a runner and a
# host that drift apart fail loudly instead of passing data nobody reads.
for _message in [
    value for value in list(globals().values()) if isinstance(value, type) and dict in value.__mro__
]:
    _message.__pydantic_config__ = {"extra": "forbid"}  # type: ignore[attr-defined]
