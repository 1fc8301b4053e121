"""Pyodide packages: the default set fetched at start, `mcp-sandbox fetch`, and what a failed
import should be told.

The sandbox never has network, so packages of the Pyodide distribution are fetched here, on the
host, from a package index in the Pyodide CDN's layout (`<index>/pyodide-lock.json` and
`<index>/<file_name>`) into the packages folder, each checked against its sha256, and loaded from
that folder when sandboxed code imports them. Pyodide's own lock file, which came with Pyodide
through npm's integrity check, has the last word on every package it names: an index (a mirror)
only adds packages, it cannot swap one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CHUNK = 64 * 1024
#: Seconds to wait for an index's lock file: an unreachable index is said at once, not in a minute.
LOCK_TIMEOUT = 10.0
#: Seconds a package file's connection may stay silent before the fetch gives up.
DOWNLOAD_TIMEOUT = 30.0
LOCK_NAME = "pyodide-lock.json"
#: Pyodide's lock file is well under 1 MB; an index that sends more is not sending one.
MAX_LOCK_BYTES = 16 * 2**20
#: The index's lock file as last fetched, kept in the packages folder so later starts resolve
#: offline; hidden, so it is never mistaken for a package.
CACHED_INDEX_LOCK = ".index-lock.json"
#: What users expect to import where a scientific Python is expected.
COMMON_PACKAGES = ("numpy", "pandas", "matplotlib")
#: A package file's name: no folders, nothing hidden, so no lock entry can write outside the folder.
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
SHA256 = re.compile(r"[0-9a-f]{64}")


def default_index_url(version: str) -> str:
    return f"https://cdn.jsdelivr.net/pyodide/v{version}/full/"


class PackageError(Exception):
    """A package is unknown, or could not be fetched or verified; the message says which."""


class IndexUnreachable(PackageError):
    """The package index did not answer at all (no name, no route, no connection, a timeout)."""


class FetchStopped(PackageError):
    """The server is stopping; the fetch was abandoned and left nothing behind."""


def package_key(name: str) -> str:
    return name.lower().replace("_", "-")


@dataclass(frozen=True)
class PackageFile:
    name: str
    file_name: str
    sha256: str
    depends: tuple[str, ...] = ()
    #: The top-level modules it provides (`dateutil` for python-dateutil).
    imports: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return package_key(self.name)


@dataclass(frozen=True)
class Lock:
    """A lock file's packages (Pyodide's, an index's, or one merged over the other), by key."""

    packages: Mapping[str, PackageFile] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Any) -> Lock:
        """The usable entries of a lock file's JSON; an entry with an unsafe file name or without
        a sha256 is left out (an index is not trusted to name files)."""
        entries = data.get("packages") if isinstance(data, dict) else None
        packages: dict[str, PackageFile] = {}
        for key, entry in (entries if isinstance(entries, dict) else {}).items():
            if not isinstance(entry, dict):
                continue
            file_name, sha256 = entry.get("file_name"), entry.get("sha256")
            if not (isinstance(file_name, str) and FILE_NAME.fullmatch(file_name)):
                continue
            if not (isinstance(sha256, str) and SHA256.fullmatch(sha256)):
                continue
            name = entry["name"] if isinstance(entry.get("name"), str) else str(key)
            package = PackageFile(
                name, file_name, sha256, _strings(entry.get("depends")), _strings(entry.get("imports"))
            )
            packages[package.key] = package
        return cls(packages)

    @classmethod
    def read(cls, path: Path) -> Lock:
        """A lock file on disk; an empty lock when it is missing or not JSON."""
        try:
            return cls.parse(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return cls()

    def over(self, other: Lock) -> Lock:
        """This lock's entries, and `other`'s for packages this one does not name."""
        return Lock({**other.packages, **self.packages})

    def get(self, name: str) -> PackageFile | None:
        return self.packages.get(package_key(name))

    def for_import(self, module: str) -> PackageFile | None:
        """The package that provides top-level module `module` (its own name when the lock does
        not say otherwise)."""
        top = module.split(".")[0]
        for package in self.packages.values():
            if top in package.imports:
                return package
        return self.get(top)

    def closure(self, names: Iterable[str]) -> tuple[list[PackageFile], list[str]]:
        """The packages `names` need, dependencies included, sorted; and the names it does not know."""
        unknown = [name for name in names if self.get(name) is None]
        wanted: dict[str, PackageFile] = {}
        pending = [package_key(name) for name in names if self.get(name) is not None]
        while pending:
            key = pending.pop()
            if key in wanted or key not in self.packages:
                continue
            wanted[key] = self.packages[key]
            pending.extend(package_key(dependency) for dependency in wanted[key].depends)
        return sorted(wanted.values(), key=lambda package: package.key), unknown

    def resolve(self, names: list[str]) -> list[PackageFile]:
        """The packages asked for and everything they depend on. Raises PackageError for a name
        it does not know."""
        wanted, unknown = self.closure(names)
        if unknown:
            raise PackageError(
                f"not in the Pyodide distribution: {', '.join(unknown)}. Pure-Python wheels can be "
                "copied into the packages folder instead."
            )
        return wanted

    def top_level(self, keys: Iterable[str]) -> list[str]:
        """The names among `keys` that no other of them depends on (pandas, not its numpy)."""
        chosen = set(keys)
        needed = {
            package_key(dependency)
            for key in chosen
            if (package := self.packages.get(key)) is not None
            for dependency in package.depends
        }
        return sorted(self.packages[key].name if key in self.packages else key for key in chosen - needed)


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(item for item in value if isinstance(item, str)) if isinstance(value, list) else ()


def cached_pyodide_lock(cache_dir: Path) -> Lock:
    """Pyodide's own lock file, where a pyodide backend has fetched Pyodide into the Deno cache
    (any version: it says which packages Pyodide has); an empty lock where none has."""
    found = sorted((cache_dir / "deno" / "npm").glob(f"*/pyodide/*/{LOCK_NAME}"))
    return Lock.read(found[-1]) if found else Lock()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def is_verified(package: PackageFile, folder: Path) -> bool:
    """The package's file is in `folder` with the sha256 its lock gives."""
    try:
        return sha256_of(folder / package.file_name) == package.sha256
    except OSError:
        return False


def fetch_index_lock(index_url: str, timeout: float = LOCK_TIMEOUT) -> tuple[Lock, bytes]:
    """The index's lock file, parsed and as fetched. Raises IndexUnreachable when the index does not
    answer, PackageError when it answers without a usable lock file."""
    url = index_url + LOCK_NAME
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read(MAX_LOCK_BYTES + 1)
    except urllib.error.HTTPError as error:
        raise PackageError(
            f"the package index has no lock file: {url} answered {error.code} {error.reason}"
        ) from None
    except (OSError, ValueError) as error:
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        raise IndexUnreachable(f"the package index {index_url} could not be reached ({reason})") from None
    if len(body) > MAX_LOCK_BYTES:
        raise PackageError(f"the package index's {url} is over {MAX_LOCK_BYTES // 2**20} MB: not a lock file")
    try:
        return Lock.parse(json.loads(body)), body
    except ValueError:
        raise PackageError(f"the package index's {url} is not a lock file (not JSON)") from None


Progress = Callable[[PackageFile, int, int | None], None]


def download(
    package: PackageFile,
    folder: Path,
    index_url: str,
    progress: Progress,
    stop: threading.Event | None = None,
) -> bool:
    """Fetch one package file into `folder`; False when a verified copy was already there. A file
    that does not match its sha256 is not kept. Raises PackageError (IndexUnreachable when the
    index does not answer, FetchStopped when `stop` is set meanwhile)."""
    target = folder / package.file_name
    if is_verified(package, folder):
        return False
    folder.mkdir(parents=True, exist_ok=True)
    # Its own name, so two servers sharing the folder never write into one file.
    partial = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.part")
    digest = hashlib.sha256()
    done = 0
    try:
        with urllib.request.urlopen(index_url + package.file_name, timeout=DOWNLOAD_TIMEOUT) as response:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            with partial.open("wb") as handle:
                while block := response.read(CHUNK):
                    if stop is not None and stop.is_set():
                        raise FetchStopped(f"{package.file_name}: the server is stopping")
                    handle.write(block)
                    digest.update(block)
                    done += len(block)
                    progress(package, done, total)
    except urllib.error.HTTPError as error:
        partial.unlink(missing_ok=True)
        raise PackageError(
            f"could not fetch {package.file_name} from {index_url}: {error.code} {error.reason}"
        ) from None
    except OSError as error:
        partial.unlink(missing_ok=True)
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        raise IndexUnreachable(f"could not fetch {package.file_name} from {index_url}: {reason}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != package.sha256:
        partial.unlink(missing_ok=True)
        raise PackageError(
            f"{package.file_name} from {index_url} does not match the sha256 in the lock file "
            f"(got {digest.hexdigest()[:12]}..., expected {package.sha256[:12]}...); not kept"
        )
    partial.replace(target)
    return True


class PackageSource:
    """Where packages come from: Pyodide's own lock file, the index's over-ruled by it, and the
    folder they are fetched into. Used from one thread at a time."""

    def __init__(self, bundled: Lock, folder: Path, index_url: str) -> None:
        self.bundled = bundled
        self.folder = folder
        self.index_url = index_url
        # Pyodide's entries win: a mirror cannot swap a package Pyodide names (its file or hash).
        self.lock = bundled.over(Lock.read(folder / CACHED_INDEX_LOCK))

    def refresh(self) -> None:
        """Fetch the index's lock file and merge it under Pyodide's. Raises PackageError."""
        index, body = fetch_index_lock(self.index_url)
        self.lock = self.bundled.over(index)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            partial = self.folder / f"{CACHED_INDEX_LOCK}.{os.getpid()}.part"
            partial.write_bytes(body)
            partial.replace(self.folder / CACHED_INDEX_LOCK)
        except OSError as error:  # only later starts are slower: they fetch it again
            logger.debug("could not keep the index's lock file: %s", error)

    def missing(self, names: list[str]) -> tuple[list[PackageFile], list[str]]:
        """What fetching `names` needs by the locks at hand, without the network: the packages not
        verified in the folder, and the names no lock knows."""
        wanted, unknown = self.lock.closure(names)
        return [package for package in wanted if not is_verified(package, self.folder)], unknown

    def plan(self, names: list[str]) -> tuple[list[PackageFile], list[str]]:
        """`missing`, after fetching the index's lock file only when something is. Raises
        PackageError when that fails."""
        missing, unknown = self.missing(names)
        if not missing and not unknown:
            return [], []
        self.refresh()
        return self.missing(names)


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


def fetch_packages(source: PackageSource, names: list[str]) -> list[PackageFile]:
    """`mcp-sandbox fetch`: fetch `names` and their dependencies, saying so on stderr; the packages
    fetched. Raises PackageError for an unknown name, an unreachable index, or files refused."""
    try:
        missing, unknown = source.plan(names)
    except IndexUnreachable as error:
        raise IndexUnreachable(
            f"{error}: run this where the Pyodide CDN is reachable, or give a mirror (--index-url, "
            "MCP_SANDBOX_PACKAGE_INDEX_URL)"
        ) from None
    if unknown:
        source.lock.resolve(unknown)  # raises, naming them
    wanted = source.lock.resolve(names)
    print(f"  with their dependencies: {', '.join(package.name for package in wanted)}", file=sys.stderr)
    fetched, failed = [], []
    for number, package in enumerate(wanted, 1):
        try:
            if package in missing and download(package, source.folder, source.index_url, progress_bar):
                fetched.append(package)
                size = (source.folder / package.file_name).stat().st_size
                state = f"fetched, {size / 1e6:.1f} MB, sha256 checked"
            else:
                state = "already here"
        except PackageError as error:
            failed.append(package.name)
            state = f"NOT FETCHED: {error}"
        # Padded to cover the bar it replaces on a terminal.
        print(f"\r  {package.name:<24} {state} ({number}/{len(wanted)})".ljust(72), file=sys.stderr)
    if failed:
        raise PackageError(f"{len(failed)} of {len(wanted)} package files not fetched: {', '.join(failed)}")
    return fetched


#: What fixes a package that could not be fetched, in every note and log line that says so.
FETCH_FIX = (
    "run `mcp-sandbox fetch` where the Pyodide CDN is reachable, set MCP_SANDBOX_PACKAGE_INDEX_URL to "
    "a mirror, or use the subprocess backend (MCP_SANDBOX_BACKEND=subprocess), which imports the host's "
    "packages"
)


class DefaultPackages:
    """The default package set of one pyodide backend: fetched into the packages folder in the
    background at start (`fetch`, blocking, in a thread), and what a failed import of a package
    should be told while that runs, after it failed, or when the package was never asked for."""

    def __init__(self, source: PackageSource, names: list[str]) -> None:
        self.source = source
        self.names = names
        wanted, unknown = source.lock.closure(names)
        self._guard = threading.Lock()
        #: Packages (by key) not settled yet: until the fetch has been through them, "being fetched".
        self._pending = {package.key for package in wanted} | {package_key(name) for name in unknown}
        #: Packages (by key) that could not be fetched, and why.
        self._failed: dict[str, str] = {}

    def fetch(self, stop: threading.Event) -> None:
        """Fetch what is missing, logging what could not be. Raises FetchStopped when `stop` is set."""
        source = self.source
        missing, unknown = source.missing(self.names)
        self._expect(missing, unknown)
        if missing or unknown:
            try:
                source.refresh()
            except PackageError as error:
                logger.warning(
                    "packages %s are not in %s and could not be fetched: %s; fix: %s",
                    ", ".join(self._affected(missing, unknown)),
                    source.folder,
                    error,
                    FETCH_FIX,
                )
                self._settle(set(self._pending), str(error))
                return
            missing, unknown = source.missing(self.names)
            self._expect(missing, unknown)
        if unknown:
            logger.warning(
                "MCP_SANDBOX_DEFAULT_PACKAGES: %s is in neither Pyodide's lock file nor the index's (%s)",
                ", ".join(unknown),
                source.index_url,
            )
            self._settle({package_key(name) for name in unknown}, "it is in no lock file")
        if missing:
            logger.info("fetching %s into %s", ", ".join(package.name for package in missing), source.folder)
        for package in missing:
            try:
                download(package, source.folder, source.index_url, lambda *_: None, stop)
            except FetchStopped:
                raise
            except IndexUnreachable as error:
                rest = [other for other in missing if other.key in self._pending]
                logger.warning(
                    "packages %s could not be fetched: %s; fix: %s",
                    ", ".join(other.name for other in rest),
                    error,
                    FETCH_FIX,
                )
                self._settle({other.key for other in rest}, str(error))
                return
            except PackageError as error:
                logger.warning("package %s refused: %s", package.name, error)
                self._settle({package.key}, str(error))
                continue
            self._settle({package.key}, None)
        if missing and not self._failed:
            logger.info("packages %s are in %s, sha256 checked", ", ".join(self.names), source.folder)

    def _affected(self, missing: list[PackageFile], unknown: list[str]) -> list[str]:
        """The default set's names that `missing` packages or `unknown` names leave without an import."""
        keys = {package.key for package in missing}
        lock = self.source.lock
        return [
            name
            for name in self.names
            if name in unknown or any(package.key in keys for package in lock.closure([name])[0])
        ]

    def _expect(self, missing: list[PackageFile], unknown: list[str]) -> None:
        with self._guard:
            self._pending = {package.key for package in missing} | {package_key(name) for name in unknown}

    def _settle(self, keys: set[str], failure: str | None) -> None:
        with self._guard:
            self._pending -= keys
            if failure is not None:
                self._failed.update(dict.fromkeys(keys, failure))

    def importable(self) -> list[str]:
        """What imports of the packages folder can find: the default set (unless it failed), then
        the other packages there that none of them depends on (pandas, not its numpy)."""
        lock = self.source.lock
        by_file = {package.file_name: package.key for package in lock.packages.values()}
        try:
            files = [entry.name for entry in self.source.folder.iterdir() if entry.suffix == ".whl"]
        except OSError:
            files = []
        chosen = {package_key(name) for name in self.names}
        present = {by_file.get(name, package_key(name.split("-")[0])) for name in files}
        with self._guard:
            failed = set(self._failed)
        others = [name for name in lock.top_level(chosen | present) if package_key(name) not in chosen]
        return [name for name in [*self.names, *others] if package_key(name) not in failed]

    def import_note(self, module: str) -> str | None:
        """What to tell a program whose `import module` failed: None when no lock knows it."""
        package = self.source.lock.for_import(module)
        if package is None:
            # A default package no lock knows, because the index's could not be had.
            top = module.split(".")[0]
            with self._guard:
                failure = self._failed.get(package_key(top))
            return (
                f"{top} could not be fetched into the packages folder ({failure}); {_fix(top)}"
                if failure
                else None
            )
        needed, _ = self.source.lock.closure([package.name])
        with self._guard:
            failures = [self._failed[other.key] for other in needed if other.key in self._failed]
            pending = any(other.key in self._pending for other in needed)
        name = package.name
        if failures:
            return f"{name} could not be fetched into the packages folder ({failures[0]}); {_fix(name)}"
        if pending:
            return (
                f"{name} is being fetched into the packages folder in the background (the server's first "
                "start); run the import again in a minute"
            )
        if all((self.source.folder / other.file_name).is_file() for other in needed):
            return f"{name} is in the packages folder now; run the import again"
        return (
            f"{name} is in the Pyodide distribution but not in the packages folder: `mcp-sandbox fetch "
            f"--packages {name}` fetches it (MCP_SANDBOX_DEFAULT_PACKAGES names packages fetched at "
            "start), or use the subprocess backend (MCP_SANDBOX_BACKEND=subprocess), which imports the "
            "host's packages"
        )


def _fix(name: str) -> str:
    return FETCH_FIX.replace("`mcp-sandbox fetch`", f"`mcp-sandbox fetch --packages {name}`")


def host_import_note(module: str, pyodide_lock: Lock) -> str | None:
    """What to tell a program on a CPython backend whose `import module` failed: for a package
    Pyodide has (or a common one) that the server's Python lacks, how to get it; else None."""
    top = module.split(".")[0]
    package = pyodide_lock.for_import(top)
    name = package.name if package is not None else top if top in COMMON_PACKAGES else None
    if name is None or importlib.util.find_spec(top) is not None:
        return None
    return (
        f"{name} is not installed in the server's Python: `{sys.executable} -m pip install {name}` adds "
        f"it; or use the pyodide backend (MCP_SANDBOX_BACKEND=pyodide), with `mcp-sandbox fetch --packages "
        f"{name}` unless it is in MCP_SANDBOX_DEFAULT_PACKAGES"
    )


def host_importable() -> str:
    """The CPython backends' sentence on imports, for the tool description."""
    found = [name for name in COMMON_PACKAGES if importlib.util.find_spec(name) is not None]
    among = f" ({', '.join(found)} among them)" if found else ""
    return f"Imports: the standard library and the server's installed packages{among}."
