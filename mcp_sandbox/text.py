"""What the model reads of a result: what a person at a REPL would see, and one short line for each
thing that is not the usual. The structured content keeps every field for programs."""

from __future__ import annotations

import re

from mcp_sandbox.protocol import TRUNCATION_MARKER
from mcp_sandbox.result import SANDBOX_NAMES, ExecutionResult

#: What a result that printed, returned and said nothing reads as.
NOTHING = "(no output)"
#: The marker the guest puts where it cut a stream (protocol.cap_text), with the count it says.
_CUT = re.compile(re.escape(TRUNCATION_MARKER).replace(re.escape("{cut:,}"), r"([\d,]+)"))
#: Lines of a traceback that repeat what its frames say: the header, and the markers under a line.
_TRACEBACK_NOISE = re.compile(r"^(Traceback \(most recent call last\):|\s*[~^]+\s*)$")
#: Of a stream cut at the source, the lines shown from each end: the rest is one read away.
CUT_LINES_SHOWN = 50


def model_text(result: ExecutionResult) -> str:
    """The result as lines: stdout, stderr under a marker, the error or the final value, then a
    bracketed line for each unusual fact (a restore or a loss, files, figures, notes; a cut
    output's link is in its marker)."""
    parts = [*_output(result), *_ending(result), *_unusual(result)]
    return "\n".join(parts) if parts else NOTHING


def _output(result: ExecutionResult) -> list[str]:
    parts = []
    if result.stdout:
        parts.append(_stream(result, "stdout", result.stdout, result.stdout_uri))
    if result.stderr:
        parts += ["[stderr]", _stream(result, "stderr", result.stderr, result.stderr_uri)]
    return parts


def _stream(result: ExecutionResult, name: str, text: str, link: str | None) -> str:
    """A stream as its lines. One cut at the source shows whole lines around one marker that says
    how much is not shown and where all of it is, all within the length the cut left."""
    found = _CUT.search(text) if result.truncated else None
    if found is None:
        return text.removesuffix("\n")
    head, tail = text[: found.start()], text[found.end() :]
    # The cut fell inside a line at each end: the partial lines go with it.
    end = head.rfind("\n")  # the newline that ends the last whole line stays, as the line break
    whole_head, partial = (head[:end], len(head) - end - 1) if end >= 0 else (head, 0)
    whole_tail = tail[tail.find("\n") + 1 :] if "\n" in tail else tail
    hidden = int(found.group(1).replace(",", "")) + partial + len(tail) - len(whole_tail)
    kept = result.artifacts.kept_output.get(name)
    where = f"; all {kept.total:,}: {link} (?first=N&last=M reads lines)" if link and kept else ""
    heads = whole_head.split("\n") if whole_head else []
    tails = whole_tail.removesuffix("\n").split("\n") if whole_tail.strip("\n") else []
    hidden += _keep_lines(heads, tails, CUT_LINES_SHOWN)
    # The marker's own length, with as many digits as it may come to, is within the budget too.
    longest = f"... [{hidden + len(text):,} characters not shown{where}] ..."
    hidden += _fit(heads, tails, len(text) - len(longest) - 1)
    marker = f"... [{hidden:,} characters not shown{where}] ..."
    return "\n".join([*heads, marker, *tails])


def _keep_lines(heads: list[str], tails: list[str], each: int) -> int:
    """Keep the first `each` of `heads` and the last `each` of `tails`; returns the characters
    dropped with their line breaks."""
    dropped = heads[each:] + tails[: max(len(tails) - each, 0)]
    del heads[each:], tails[: max(len(tails) - each, 0)]
    return sum(len(line) + 1 for line in dropped)


def _fit(heads: list[str], tails: list[str], budget: int) -> int:
    """Take from the inner ends of `heads` and `tails`, the larger side first, until both fit in
    `budget` characters with their line breaks: whole lines, or only the inner part of a side's
    last line, so no partial line reads as a line of its own. Returns how many characters were
    taken."""
    sizes = [sum(len(line) + 1 for line in heads), sum(len(line) + 1 for line in tails)]
    taken = 0
    while (over := sum(sizes) - budget) > 0 and (heads or tails):
        index = 0 if heads and (sizes[0] >= sizes[1] or not tails) else 1
        side, inner = (heads, -1) if index == 0 else (tails, 0)
        line = side[inner]
        if len(line) > over and len(side) == 1:
            side[inner] = line[:-over] if index == 0 else line[over:]
            cut = over
        else:
            side.pop(inner)
            cut = len(line) + 1
        sizes[index] -= cut
        taken += cut
    return taken


def _ending(result: ExecutionResult) -> list[str]:
    """The error (its type, message and the program's frames), or the final value."""
    if (name := SANDBOX_NAMES.get(result.status)) is not None:  # its error is a sentence, not a traceback
        return [f"{name}: {result.error}" if result.error else name]
    if result.exception is not None:
        return [traceback_text(result.error)] if result.error else [result.exception]
    if result.result is None:
        return []
    # A value of several lines (a table) starts on its own line, so its columns stay aligned.
    return [f"Out:\n{result.result}" if "\n" in result.result else f"Out: {result.result}"]


def _unusual(result: ExecutionResult) -> list[str]:
    lines = []
    if result.session_restored:
        lines.append(
            f"[session restored from its checkpoint after call {result.restored_from_call}: "
            "what later calls did is gone]"
        )
    if result.session_lost:
        lines.append("[session lost: its variables are gone; it goes on fresh]")
    for file in result.files:
        where = f", saved to {file.saved_to}" if file.saved_to else ""
        lines.append(f"[file output/{file.name}: {file.size:,} bytes, {file.mime_type}{where}]")
    if result.figures:
        lines.append(
            f"[{result.figures} figures, as images]" if result.figures > 1 else "[1 figure, as an image]"
        )
    # A note about a cut output's link (kept.py) is said by the marker in the output already.
    links = [link for link in (result.stdout_uri, result.stderr_uri) if link]
    lines += [f"[note: {note}]" for note in result.notes if not any(link in note for link in links)]
    return lines


def traceback_text(error: str) -> str:
    """A traceback without its header and the ~^ markers under its lines: the frames, their lines
    and the exception stay."""
    return "\n".join(line for line in error.splitlines() if not _TRACEBACK_NOISE.match(line))
