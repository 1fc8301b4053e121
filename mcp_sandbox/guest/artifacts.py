"""What a run hands back besides text: the figures it left open and the files it wrote to output/,
within the count and byte caps."""

from __future__ import annotations

import io
import os
import stat
import sys
import warnings
from binascii import b2a_base64

from mcp_sandbox.protocol import MAX_SCANNED_FILES, OUTPUT_DIR, GuestFile

# Under the Agg backend plt.show() only warns; figures are captured when the program ends.
warnings.filterwarnings("ignore", message=".*non-interactive.*", category=UserWarning)


def scan_output() -> dict[str, tuple[int, int]]:
    """Regular files under output/ (not following links): relative path -> (size, mtime)."""
    found: dict[str, tuple[int, int]] = {}
    if not os.path.isdir(OUTPUT_DIR):
        return found
    for root, _dirs, names in os.walk(OUTPUT_DIR):
        for name in names:
            if len(found) >= MAX_SCANNED_FILES:
                return found
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found[os.path.relpath(path, OUTPUT_DIR)] = (info.st_size, info.st_mtime_ns)
    return found


def collect_figures(limit: int, budget: int, notes: list[str]) -> tuple[list[str], int]:
    """The open matplotlib figures as base64 PNGs (then closed), within the count and byte caps."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return [], budget
    figures: list[str] = []
    try:
        numbers = list(pyplot.get_fignums())
        for number in numbers[:limit]:
            buffer = io.BytesIO()
            pyplot.figure(number).savefig(buffer, format="png", dpi=100)
            image = buffer.getvalue()
            if len(image) > budget:
                notes.append(f"figure {number} left out: over the output size cap")
                continue
            budget -= len(image)
            figures.append(b2a_base64(image, newline=False).decode("ascii"))
        if len(numbers) > limit:
            notes.append(f"{len(numbers) - limit} figures left out: at most {limit} per call")
    except Exception as error:  # noqa: BLE001 - a broken figure must not lose the run's result
        notes.append(f"figures could not be saved: {type(error).__name__}: {error}")
    finally:
        pyplot.close("all")
    return figures, budget


def collect_files(
    before: dict[str, tuple[int, int]],
    after: dict[str, tuple[int, int]],
    limit: int,
    budget: int,
    inline: bool,
    notes: list[str],
) -> list[GuestFile]:
    """The files in output/ that this run created or changed, within the count and byte caps."""
    changed = sorted(path for path, signature in after.items() if before.get(path) != signature)
    files: list[GuestFile] = []
    for path in changed[:limit]:
        size = after[path][0]
        if size > budget:
            notes.append(f"output/{path} ({size:,} bytes) left out: over the output size cap")
            continue
        entry: GuestFile = {"path": path, "size": size}
        if inline:
            try:
                with open(os.path.join(OUTPUT_DIR, path), "rb") as handle:
                    data = handle.read(budget + 1)
            except OSError as error:
                notes.append(f"output/{path} could not be read: {error}")
                continue
            if len(data) > budget:
                notes.append(f"output/{path} left out: over the output size cap")
                continue
            entry["size"] = len(data)
            entry["data"] = b2a_base64(data, newline=False).decode("ascii")
        budget -= entry["size"]
        files.append(entry)
    if len(changed) > limit:
        notes.append(f"{len(changed) - limit} files in output/ left out: at most {limit} per call")
    return files
