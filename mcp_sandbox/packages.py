"""Pyodide packages for offline use: `mcp-sandbox fetch --packages numpy,pandas`.

The sandbox never has network, so packages from the Pyodide distribution are fetched once, here,
from the Pyodide CDN (or a mirror) into the packages folder, checked against the sha256 in
Pyodide's lock file, and loaded from that folder when sandboxed code imports them.
"""

from __future__ import annotations

import hashlib
import json
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK = 64 * 1024
DOWNLOAD_TIMEOUT = 60.0


def default_index_url(version: str) -> str:
    return f"https://cdn.jsdelivr.net/pyodide/v{version}/full/"


class PackageError(Exception):
    """A package is unknown, or could not be fetched or verified; the message says which."""


@dataclass(frozen=True)
class PackageFile:
    name: str
    file_name: str
    sha256: str


def _key(name: str) -> str:
    return name.lower().replace("_", "-")


def resolve(lock: dict[str, Any], names: list[str]) -> list[PackageFile]:
    """The packages asked for and everything they depend on, from Pyodide's lock file."""
    packages: dict[str, Any] = {_key(name): entry for name, entry in lock.get("packages", {}).items()}
    unknown = [name for name in names if _key(name) not in packages]
    if unknown:
        raise PackageError(
            f"not in the Pyodide distribution: {', '.join(unknown)}. Pure-Python wheels can be copied "
            "into the packages folder instead."
        )
    wanted: dict[str, PackageFile] = {}
    pending = [_key(name) for name in names]
    while pending:
        key = pending.pop()
        if key in wanted:
            continue
        entry = packages[key]
        wanted[key] = PackageFile(entry.get("name", key), entry["file_name"], entry["sha256"])
        pending.extend(
            _key(dependency) for dependency in entry.get("depends", []) if _key(dependency) in packages
        )
    return sorted(wanted.values(), key=lambda package: package.name)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


Progress = Callable[[PackageFile, int, int | None], None]


def download(package: PackageFile, folder: Path, index_url: str, progress: Progress) -> bool:
    """Fetch one package file into `folder`; False when a verified copy was already there."""
    target = folder / package.file_name
    if target.is_file() and _sha256(target) == package.sha256:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    done = 0
    try:
        with urllib.request.urlopen(index_url + package.file_name, timeout=DOWNLOAD_TIMEOUT) as response:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            with partial.open("wb") as handle:
                while block := response.read(CHUNK):
                    handle.write(block)
                    digest.update(block)
                    done += len(block)
                    progress(package, done, total)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise PackageError(f"could not fetch {package.file_name} from {index_url}: {error}") from None
    if digest.hexdigest() != package.sha256:
        partial.unlink(missing_ok=True)
        raise PackageError(f"{package.file_name} does not match the sha256 in Pyodide's lock file; not kept")
    partial.replace(target)
    return True


def progress_bar(package: PackageFile, done: int, total: int | None) -> None:
    """A one-line bar on stderr, redrawn in place on a terminal; a log gets only `fetch_packages`'
    line per file, not a redraw per 64 KB."""
    if not sys.stderr.isatty():
        return
    width = 30
    if total:
        filled = int(width * done / total)
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {done / total:4.0%} of {total / 1e6:.1f} MB"
    else:
        bar = f"{done / 1e6:.1f} MB"
    print(f"\r  {package.name:<24} {bar}", end="", file=sys.stderr, flush=True)


def fetch_packages(lock_file: Path, names: list[str], folder: Path, index_url: str) -> list[PackageFile]:
    """Fetch `names` and their dependencies into `folder`; the packages fetched."""
    lock = json.loads(lock_file.read_text(encoding="utf-8"))
    wanted = resolve(lock, names)
    print(f"  with their dependencies: {', '.join(package.name for package in wanted)}", file=sys.stderr)
    fetched = []
    for number, package in enumerate(wanted, 1):
        if download(package, folder, index_url, progress_bar):
            fetched.append(package)
            size = (folder / package.file_name).stat().st_size
            state = f"fetched, {size / 1e6:.1f} MB, sha256 checked"
        else:
            state = "already here"
        # Padded to cover the bar it replaces on a terminal.
        print(f"\r  {package.name:<24} {state} ({number}/{len(wanted)})".ljust(72), file=sys.stderr)
    return fetched
