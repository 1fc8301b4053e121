"""KeptOutputs: the whole of cut outputs behind result links, their lifetimes and their cap."""

from __future__ import annotations

import pytest

from mcp_sandbox import kept as kept_module
from mcp_sandbox.kept import KeptOutputMissing, KeptOutputs
from mcp_sandbox.result import ExecutionResult, KeptOutput, OutputFile

LINES = "".join(f"line {n}\n" for n in range(1, 1001))


def cut_result(text: str = LINES, session_id: str | None = None, total: int | None = None) -> ExecutionResult:
    result = ExecutionResult(
        success=True, stdout=text[:50], truncated=True, backend="fake", session_id=session_id
    )
    result.artifacts.kept_output["stdout"] = KeptOutput(text, total or len(text))
    return result


def test_a_cut_stream_gets_a_link_that_reads_back_all_of_it_and_any_lines() -> None:
    kept = KeptOutputs(2**20, ttl=60, session_alive=lambda _: True)
    result = cut_result()
    kept.keep(result)
    assert result.stdout_uri is not None and result.stderr_uri is None
    assert any(result.stdout_uri in note and "all 8,893 characters" in note for note in result.notes), (
        result.notes
    )
    assert kept.read_uri(result.stdout_uri) == LINES
    assert kept.read_uri(result.stdout_uri + "?first=500&last=501") == "line 500\nline 501\n"
    assert kept.read_uri(result.stdout_uri + "?first=-2") == "line 999\nline 1000\n"
    assert kept.read_uri(result.stdout_uri + "?last=1") == "line 1\n"


def test_a_result_that_was_not_cut_gets_no_link() -> None:
    kept = KeptOutputs(2**20, ttl=60, session_alive=lambda _: True)
    result = ExecutionResult(success=True, stdout="short", backend="fake")
    kept.keep(result)
    assert result.stdout_uri is None and not result.notes


def test_a_partly_kept_stream_says_how_much_is_there() -> None:
    kept = KeptOutputs(2**20, ttl=60, session_alive=lambda _: True)
    result = cut_result(total=5_000_000)
    kept.keep(result)
    assert any("first 8,893 of 5,000,000 characters" in note for note in result.notes), result.notes


def test_bad_links_and_line_numbers_get_errors_that_say_what_is_wrong() -> None:
    kept = KeptOutputs(2**20, ttl=60, session_alive=lambda _: True)
    result = cut_result()
    kept.keep(result)
    assert result.stdout_uri is not None
    with pytest.raises(ValueError, match="numbered from 1"):
        kept.read_uri(result.stdout_uri + "?first=0")
    with pytest.raises(ValueError, match="whole number"):
        kept.read_uri(result.stdout_uri + "?first=ten")
    with pytest.raises(ValueError, match="not a kept-output link"):
        kept.read_uri("sandbox://elsewhere/x/stdout")
    with pytest.raises(KeptOutputMissing, match="mistyped"):
        kept.read_uri("sandbox://kept/nosuchcall/stdout")
    with pytest.raises(KeptOutputMissing, match="'stderr' of that call was not cut"):
        kept.read_uri(result.stdout_uri.replace("stdout", "stderr"))


def test_the_cap_drops_the_oldest_and_says_so_in_the_result_and_the_dead_link() -> None:
    kept = KeptOutputs(20_000, ttl=60, session_alive=lambda _: True)
    first, second, third = cut_result(), cut_result(), cut_result()
    for result in (first, second, third):
        kept.keep(result)
    assert any("1 earlier call(s) was dropped" in note for note in third.notes), third.notes
    assert first.stdout_uri is not None and third.stdout_uri is not None
    with pytest.raises(
        KeptOutputMissing, match="no longer kept: dropped to keep MCP_SANDBOX_MAX_KEPT_OUTPUT_MB"
    ):
        kept.read_uri(first.stdout_uri)
    assert kept.read_uri(third.stdout_uri) == LINES


def test_an_output_bigger_than_the_whole_cap_keeps_what_fits() -> None:
    kept = KeptOutputs(1000, ttl=60, session_alive=lambda _: True)
    result = cut_result()
    kept.keep(result)
    assert result.stdout_uri is not None
    assert kept.read_uri(result.stdout_uri) == LINES.encode()[:1000].decode()
    assert any("first 1,000 of 8,893" in note for note in result.notes), result.notes


def test_a_sessions_output_lives_with_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    alive = {"s"}
    kept = KeptOutputs(2**20, ttl=0.001, session_alive=lambda session_id: session_id in alive)
    result = cut_result(session_id="s")
    kept.keep(result)
    assert result.stdout_uri is not None
    assert any("while session 's' lives" in note for note in result.notes), result.notes
    monkeypatch.setattr(kept_module.time, "monotonic", lambda: 1e12)  # long past any ttl
    assert kept.read_uri(result.stdout_uri) == LINES
    alive.clear()
    with pytest.raises(KeptOutputMissing, match="session 's' ended"):
        kept.read_uri(result.stdout_uri)


def test_a_session_less_calls_output_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = KeptOutputs(2**20, ttl=60, session_alive=lambda _: True)
    result = cut_result()
    kept.keep(result)
    assert result.stdout_uri is not None
    assert any("for 60 s" in note for note in result.notes), result.notes
    now = kept_module.time.monotonic()
    monkeypatch.setattr(kept_module.time, "monotonic", lambda: now + 61)
    with pytest.raises(KeptOutputMissing, match="kept for 60 s"):
        kept.read_uri(result.stdout_uri)


def test_a_reset_session_forgets_its_output() -> None:
    kept = KeptOutputs(2**20, ttl=60, session_alive=lambda _: True)
    result = cut_result(session_id="s")
    kept.keep(result)
    kept.forget_session("s")
    assert result.stdout_uri is not None
    with pytest.raises(KeptOutputMissing, match="was reset"):
        kept.read_uri(result.stdout_uri)


def test_a_link_reads_only_for_its_principal_and_says_nothing_of_it_to_another() -> None:
    kept = KeptOutputs(2**20, ttl=60, session_alive=lambda _: True)
    result = cut_result(session_id="analysis")
    kept.keep(result, "alice", "alice/analysis")
    assert result.stdout_uri is not None
    assert kept.read_uri(result.stdout_uri, "alice") == LINES
    with pytest.raises(KeptOutputMissing, match="nothing is kept as"):
        kept.read_uri(result.stdout_uri, "bob")
    kept.forget_session("alice/analysis")
    with pytest.raises(KeptOutputMissing, match="session 'analysis' was reset"):
        kept.read_uri(result.stdout_uri, "alice")
    with pytest.raises(KeptOutputMissing, match="nothing is kept as"):
        kept.read_uri(result.stdout_uri, "bob")


def test_a_calls_files_are_kept_whole_for_their_principal_within_the_cap() -> None:
    kept = KeptOutputs(1000, ttl=60, session_alive=lambda _: True)
    result = ExecutionResult(success=True, backend="fake")
    for name, size in (("sub/a b.csv", 600), ("big.bin", 500)):
        result.files.append(OutputFile(name=name, size=size, mime_type="application/octet-stream"))
        result.artifacts.files[name] = bytes(size)
    kept.keep(result, "alice")
    small, big = result.files
    assert small.uri is not None and small.uri.endswith("/files/sub%2Fa%20b.csv")
    assert big.uri is None, "a file that does not fit is not kept in part"
    call, _, name = small.uri.removeprefix(kept_module.URI_PREFIX).partition("/files/")
    assert kept.read_file(call, name, "alice") == bytes(600)
    with pytest.raises(KeptOutputMissing, match="nothing is kept as"):
        kept.read_file(call, name, "bob")
    with pytest.raises(KeptOutputMissing, match=r"kept no file 'big\.bin'"):
        kept.read_file(call, "big.bin", "alice")
