"""Host files given to the sandbox, as DSPy gives them: each at /sandbox/<its name>.

`enable_read_paths` are copied in when the sandbox starts. `enable_write_paths` are copied in too
(made empty on the host first when missing), and with `sync_files` each change the code makes is
written back to the host after the execute() that made it. The sandbox never names a host path:
it sends a file's index, and the host writes only the paths it was given.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

from mcp_sandbox.integrations.dspy.errors import CodeInterpreterError

#: Base64 characters one tool reply carries (well under the bridge's reply cap).
PART_CHARS = 3_000_000
#: The largest file written back, as base64 (256 MiB of file).
MAX_FILE_CHARS = 4 * 256 * 2**20 // 3


@dataclass
class Mount:
    host: Path
    name: str
    writable: bool
    #: Base64 of the file as the sandbox will get it, cut into parts; filled by `load`.
    parts: list[str] = field(default_factory=list)


class Mounts:
    """The files an interpreter gives its sandbox, and the writes coming back."""

    def __init__(self, read: list[PathLike[str] | str], write: list[PathLike[str] | str], sync: bool) -> None:
        self.sync = sync
        self.files: list[Mount] = []
        names: dict[str, Mount] = {}
        for path, writable in [*((p, False) for p in read), *((p, True) for p in write)]:
            if not path:
                continue
            name = os.path.basename(os.fspath(path))
            host = Path(os.path.realpath(os.path.expanduser(os.fspath(path))))
            known = names.get(name)
            if known is not None:
                if known.host != host:
                    raise CodeInterpreterError("Mounted files must have unique basenames inside the sandbox.")
                known.writable = known.writable or writable
                continue
            names[name] = mount = Mount(host, name, writable)
            self.files.append(mount)
        self._incoming: dict[int, list[str]] = {}
        self._incoming_chars: dict[int, int] = {}

    def load(self) -> list[dict[str, object]]:
        """Read every file (creating a missing writable one); what the sandbox's runtime mounts.
        Raises FileNotFoundError for a missing read-only file, as DSPy does."""
        specs: list[dict[str, object]] = []
        for mount in self.files:
            if not mount.host.exists():
                if not mount.writable:
                    raise FileNotFoundError(f"Cannot mount non-existent file: {mount.host}")
                mount.host.touch()
            text = base64.b64encode(mount.host.read_bytes()).decode()
            mount.parts = [text[i : i + PART_CHARS] for i in range(0, len(text), PART_CHARS)] or [""]
            synced = mount.writable and self.sync
            specs.append({"name": mount.name, "parts": len(mount.parts), "sync": synced})
        return specs

    def part(self, index: int, part: int) -> str:
        if not (isinstance(index, int) and isinstance(part, int)):
            raise CodeInterpreterError("a file and its part are numbers")
        if not (0 <= index < len(self.files) and 0 <= part < len(self.files[index].parts)):
            raise CodeInterpreterError(f"there is no part {part} of file {index}")
        return self.files[index].parts[part]

    def begin(self) -> None:
        """Before each execute: parts a cut-off run left are dropped, never joined to the next run's."""
        self._incoming, self._incoming_chars = {}, {}

    def receive(self, index: int, part: str, last: bool) -> None:
        """A part of a writable file the code changed; the last one writes it to the host."""
        mount = self.files[index] if isinstance(index, int) and 0 <= index < len(self.files) else None
        if mount is None or not (mount.writable and self.sync):
            raise CodeInterpreterError(f"file {index!r} is not one the sandbox writes back")
        if not isinstance(part, str) or not part.isascii():
            raise CodeInterpreterError("a file's part must be base64 text")
        self._incoming.setdefault(index, []).append(part)
        self._incoming_chars[index] = self._incoming_chars.get(index, 0) + len(part)
        if self._incoming_chars[index] > MAX_FILE_CHARS:
            self.begin()
            raise CodeInterpreterError(
                f"{mount.name} is over {MAX_FILE_CHARS * 3 // 4:,} bytes: not written back"
            )
        if last:
            pieces = self._incoming.pop(index)
            del self._incoming_chars[index]
            mount.host.write_bytes(base64.b64decode("".join(pieces)))

    def loaded(self) -> None:
        """The sandbox has the files: their copies here are no longer needed."""
        for mount in self.files:
            mount.parts = []
