"""Pyodide packages: lock files and their merging, dependency resolution, the real download code
and the default set's fetch against an index served on 127.0.0.1 (the Pyodide CDN is out of reach
here), and the notes a failed import gets."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_sandbox import packages as packages_module
from mcp_sandbox.backends.base import Backend, Executor, ExecutorHooks, failed_import
from mcp_sandbox.packages import (
    CACHED_INDEX_LOCK,
    DefaultPackages,
    FetchStopped,
    IndexUnreachable,
    Lock,
    PackageError,
    PackageFile,
    PackageSource,
    download,
    fetch_index_lock,
    host_import_note,
)
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.settings import Settings
from tests.package_index import PackageIndex, closed_port_url, serve_index


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def entry(name: str, *depends: str, file_name: str = "", imports: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "name": name,
        "file_name": file_name or f"{name}-1.0-py3-none-any.whl",
        "sha256": sha(file_name or name),
        "depends": list(depends),
        "imports": list(imports or (name,)),
    }


LOCK = Lock.parse(
    {
        "packages": {
            "pandas": entry("pandas", "numpy", "python-dateutil"),
            "numpy": entry("numpy"),
            "python-dateutil": entry("python-dateutil", "six", imports=("dateutil",)),
            "six": entry("six"),
            "lonely": entry("lonely"),
        }
    }
)


def test_resolve_follows_dependencies() -> None:
    names = [package.name for package in LOCK.resolve(["pandas"])]
    assert names == ["numpy", "pandas", "python-dateutil", "six"]
    assert [p.name for p in LOCK.resolve(["Python_Dateutil", "six"])] == ["python-dateutil", "six"]


def test_resolve_names_what_it_does_not_know() -> None:
    with pytest.raises(PackageError, match="not in the Pyodide distribution: nonesuch"):
        LOCK.resolve(["numpy", "nonesuch"])
    assert LOCK.closure(["numpy", "nonesuch"])[1] == ["nonesuch"]


def test_imports_map_to_their_package() -> None:
    assert LOCK.for_import("dateutil.parser") == LOCK.get("python-dateutil")
    assert LOCK.for_import("numpy.linalg") == LOCK.get("numpy")
    assert LOCK.for_import("nonesuch") is None


def test_an_entry_that_could_write_outside_the_folder_or_has_no_hash_is_left_out() -> None:
    parsed = Lock.parse(
        {
            "packages": {
                "up": entry("up", file_name="../up.whl"),
                "hidden": entry("hidden", file_name=".hidden.whl"),
                "nested": entry("nested", file_name="a/b.whl"),
                "nohash": {"name": "nohash", "file_name": "nohash.whl", "sha256": "abc"},
                "fine": entry("fine"),
            }
        }
    )
    assert list(parsed.packages) == ["fine"]
    assert Lock.parse("not a lock").packages == {} and Lock.parse({"packages": []}).packages == {}


def test_pyodides_own_entries_win_over_the_index() -> None:
    bundled = Lock.parse({"packages": {"numpy": entry("numpy")}})
    index = Lock.parse(
        {
            "packages": {
                "numpy": {**entry("numpy"), "file_name": "evil.whl", "sha256": sha("evil")},
                "extra": entry("extra"),
            }
        }
    )
    merged = bundled.over(index)
    assert merged.get("numpy") == bundled.get("numpy"), "a mirror cannot swap numpy"
    assert merged.get("extra") == index.get("extra"), "the index adds what Pyodide lacks"


WHEEL = b"pretend wheel bytes " * 5000


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PackageIndex]:
    (tmp_path / "index").mkdir()
    with serve_index(tmp_path / "index") as served:
        yield served


def test_download_verifies_and_reports_progress(tmp_path: Path, index: PackageIndex) -> None:
    (index.folder / "good.whl").write_bytes(WHEEL)
    package = PackageFile("good", "good.whl", hashlib.sha256(WHEEL).hexdigest())
    seen: list[tuple[int, int | None]] = []
    folder = tmp_path / "packages"
    assert download(package, folder, index.url, lambda _p, done, total: seen.append((done, total))) is True
    assert (folder / "good.whl").read_bytes() == WHEEL
    assert seen[-1] == (len(WHEEL), len(WHEEL)) and len(seen) > 1
    assert download(package, folder, index.url, lambda *_: None) is False, "a verified copy is kept"
    assert index.requests == ["/pyodide/good.whl"]


def test_a_file_that_does_not_match_its_hash_is_not_kept(tmp_path: Path, index: PackageIndex) -> None:
    (index.folder / "good.whl").write_bytes(WHEEL)
    folder = tmp_path / "packages"
    with pytest.raises(PackageError, match="does not match the sha256"):
        download(PackageFile("good", "good.whl", "0" * 64), folder, index.url, lambda *_: None)
    assert list(folder.iterdir()) == []


def test_a_missing_file_and_an_unreachable_index_are_clear_errors(
    tmp_path: Path, index: PackageIndex
) -> None:
    missing = PackageFile("missing", "missing.whl", "0" * 64)
    folder = tmp_path / "packages"
    with pytest.raises(PackageError, match=r"could not fetch missing\.whl .*404") as raised:
        download(missing, folder, index.url, lambda *_: None)
    assert not isinstance(raised.value, IndexUnreachable)
    with pytest.raises(IndexUnreachable, match=r"could not fetch missing\.whl"):
        download(missing, folder, closed_port_url(), lambda *_: None)
    assert list(folder.iterdir()) == []


def test_a_stopped_download_leaves_nothing(tmp_path: Path, index: PackageIndex) -> None:
    (index.folder / "good.whl").write_bytes(WHEEL)
    stop = threading.Event()
    stop.set()
    good = PackageFile("good", "good.whl", hashlib.sha256(WHEEL).hexdigest())
    folder = tmp_path / "packages"
    with pytest.raises(FetchStopped):
        download(good, folder, index.url, lambda *_: None, stop)
    assert list(folder.iterdir()) == []


def test_an_index_lock_that_is_not_one_is_refused(
    index: PackageIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    (index.folder / "pyodide-lock.json").write_text("{" * 10)
    with pytest.raises(PackageError, match="not a lock file"):
        fetch_index_lock(index.url)
    monkeypatch.setattr(packages_module, "MAX_LOCK_BYTES", 5)
    (index.folder / "pyodide-lock.json").write_text('{"packages": {}}')
    with pytest.raises(PackageError, match="over 0 MB"):
        fetch_index_lock(index.url)


def bundled_lock(index: PackageIndex, *names: str) -> Lock:
    """Pyodide's lock as the backend has it: here, the index's entries for `names`."""
    served = json.loads((index.folder / "pyodide-lock.json").read_text())
    return Lock.parse({"packages": {name: served["packages"][name] for name in names}})


def test_the_index_lock_is_fetched_only_when_something_is_missing(
    tmp_path: Path, index: PackageIndex
) -> None:
    index.add_wheel("alpha", "A = 1")
    index.add_wheel("beta", "B = 2", depends=("alpha",))
    folder = tmp_path / "packages"
    folder.mkdir()
    packages = DefaultPackages(PackageSource(Lock(), folder, index.url), ["beta"])
    packages.fetch(threading.Event())
    assert sorted(index.requests) == sorted(
        [
            "/pyodide/pyodide-lock.json",
            "/pyodide/alpha-1.0-py3-none-any.whl",
            "/pyodide/beta-1.0-py3-none-any.whl",
        ]
    )
    assert (folder / CACHED_INDEX_LOCK).is_file(), "kept, so later starts resolve offline"
    index.requests.clear()
    again = DefaultPackages(PackageSource(Lock(), folder, index.url), ["beta"])
    again.fetch(threading.Event())
    assert index.requests == [], "verified files already there: nothing fetched"
    assert (
        again.importable() == ["beta"]
        and again.import_note("beta") == "beta is in the packages folder now; run the import again"
    )


def test_a_mirror_cannot_swap_a_package_pyodide_names(tmp_path: Path, index: PackageIndex) -> None:
    index.add_wheel("numpyish", "X = 1")
    bundled = bundled_lock(index, "numpyish")
    index.add_wheel("numpyish", "X = 'swapped by the mirror'")  # the index's lock and file now agree
    folder = tmp_path / "packages"
    folder.mkdir()
    packages = DefaultPackages(PackageSource(bundled, folder, index.url), ["numpyish"])
    packages.fetch(threading.Event())
    assert list(folder.glob("*.whl")) == [], "refused: Pyodide's sha256 decides"
    note = packages.import_note("numpyish") or ""
    assert "numpyish could not be fetched" in note and "does not match the sha256" in note, note


def test_a_tampered_file_is_refused_and_logged(
    tmp_path: Path, index: PackageIndex, caplog: pytest.LogCaptureFixture
) -> None:
    index.add_wheel("good", "G = 1")
    index.add_wheel("bad", "B = 1", tampered=True)
    folder = tmp_path / "packages"
    folder.mkdir()
    packages = DefaultPackages(PackageSource(Lock(), folder, index.url), ["good", "bad"])
    with caplog.at_level(logging.WARNING, logger="mcp_sandbox.packages"):
        packages.fetch(threading.Event())
    assert [path.name for path in folder.glob("*.whl")] == ["good-1.0-py3-none-any.whl"]
    assert list(folder.glob("*.part")) == [] and list(folder.glob(".*.part")) == []
    refusals = [record.getMessage() for record in caplog.records]
    assert len(refusals) == 1 and "package bad refused" in refusals[0] and "sha256" in refusals[0], refusals
    assert packages.import_note("good") is not None and "could not be fetched" in (
        packages.import_note("bad") or ""
    )
    assert packages.importable() == ["good"]


def test_an_unreachable_index_is_one_warning_with_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bundled = Lock.parse({"packages": {"numpy": entry("numpy"), "pandas": entry("pandas", "numpy")}})
    folder = tmp_path / "packages"
    folder.mkdir()
    packages = DefaultPackages(PackageSource(bundled, folder, closed_port_url()), ["numpy", "pandas"])
    being_fetched = packages.import_note("pandas") or ""
    assert "being fetched" in being_fetched and "run the import again" in being_fetched
    with caplog.at_level(logging.INFO, logger="mcp_sandbox.packages"):
        packages.fetch(threading.Event())
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and caplog.records[0].levelname == "WARNING", lines
    assert "numpy, pandas" in lines[0] and "could not be reached" in lines[0]
    for fix in ("`mcp-sandbox fetch`", "MCP_SANDBOX_PACKAGE_INDEX_URL", "subprocess backend"):
        assert fix in lines[0], lines[0]
    note = packages.import_note("pandas.core") or ""
    assert note.startswith("pandas could not be fetched") and "`mcp-sandbox fetch --packages pandas`" in note
    assert packages.importable() == []


def test_a_package_never_asked_for_says_how_to_fetch_it(tmp_path: Path) -> None:
    packages = DefaultPackages(PackageSource(LOCK, tmp_path, closed_port_url()), [])
    note = packages.import_note("dateutil") or ""
    assert note.startswith("python-dateutil is in the Pyodide distribution but not in the packages folder")
    assert "`mcp-sandbox fetch --packages python-dateutil`" in note and "subprocess backend" in note
    assert packages.import_note("nonesuch") is None, "a module no lock knows gets no note"


def test_the_cpython_backends_name_pip_for_a_package_pyodide_has() -> None:
    pyodide = Lock.parse({"packages": {"scikit-learn": entry("scikit-learn", imports=("sklearn",))}})
    note = host_import_note("sklearn.linear_model", pyodide) or ""
    assert (
        "scikit-learn is not installed in the server's Python" in note
        and "-m pip install scikit-learn" in note
    )
    assert host_import_note("json", Lock.parse({"packages": {"json": entry("json")}})) is None, (
        "the host has it"
    )
    assert host_import_note("nonesuch", pyodide) is None


def failure(error_type: str, error: str) -> ExecutionResult:
    return ExecutionResult(status="error", exception=error_type, error=error, backend="pyodide")


def test_the_failed_import_is_read_from_the_traceback() -> None:
    traceback = (
        'Traceback (most recent call last):\n  File "<cell-1>", line 1\n'
        "ModuleNotFoundError: No module named 'pandas'"
    )
    assert failed_import(failure("ModuleNotFoundError", traceback)) == "pandas"
    assert failed_import(failure("ImportError", "ImportError: cannot import name 'x'")) is None
    assert failed_import(ExecutionResult(success=True, backend="pyodide")) is None


class NoteEveryImport(Backend):
    """A backend whose import note names the module, to see which failures reach it."""

    name = "fake"

    async def start(self, principal: str | None = None) -> Executor:
        raise NotImplementedError

    def summary(self) -> str:
        return ""

    def import_note(self, module: str) -> str | None:
        return f"note for {module}"


def test_only_a_missing_top_level_module_gets_a_note() -> None:
    backend = NoteEveryImport(Settings(), ExecutorHooks(tools=None))
    missing = "ModuleNotFoundError: No module named '{}'"
    assert backend.notes_for(failure("ModuleNotFoundError", missing.format("pandas"))) == ["note for pandas"]
    assert backend.notes_for(failure("ModuleNotFoundError", missing.format("pandas.nope"))) == []
    assert backend.notes_for(ExecutionResult(success=True, backend="fake")) == []
