"""model_text: each unusual fact of a result gets one line, and the usual ones none."""

from __future__ import annotations

from mcp_sandbox.protocol import cap_text
from mcp_sandbox.result import ExecutionResult, KeptOutput, OutputFile
from mcp_sandbox.text import CUT_LINES_SHOWN, model_text


def result(**fields: object) -> ExecutionResult:
    return ExecutionResult.model_validate({"status": "ok", "backend": "pyodide", **fields})


def test_a_restore_and_its_notes_are_said() -> None:
    text = model_text(
        result(result="2", session_restored=True, restored_from_call=3, notes=["an open file was not kept"])
    )
    assert text.splitlines() == [
        "Out: 2",
        "[session restored from its checkpoint after call 3: what later calls did is gone]",
        "[note: an open file was not kept]",
    ]


def test_a_loss_is_said() -> None:
    text = model_text(result(session_lost=True, notes=["the sandbox died before its first checkpoint"]))
    assert "[session lost: its variables are gone; it goes on fresh]" in text.splitlines()
    assert text.endswith("[note: the sandbox died before its first checkpoint]")


def test_files_figures_and_sandbox_outcomes() -> None:
    text = model_text(
        result(
            status="memory_limit",
            error="the program used more than 512 MB",
            files=[OutputFile(name="a.png", size=2048, mime_type="image/png", saved_to="/srv/out/a.png")],
            figures=2,
        )
    )
    assert text.splitlines() == [
        "MemoryLimit: the program used more than 512 MB",
        "[file output/a.png: 2,048 bytes, image/png, saved to /srv/out/a.png]",
        "[2 figures, as images]",
    ]


def test_a_cut_without_a_link_still_says_how_much_is_not_shown() -> None:
    whole = "".join(f"{n}\n" for n in range(1000))
    cut, _ = cap_text(whole, 200)
    lines = model_text(result(stdout=cut, truncated=True)).splitlines()
    marker = next(line for line in lines if "not shown" in line)
    shown = [line for line in lines if line != marker]
    hidden = int(marker.split("[")[1].split()[0].replace(",", ""))
    assert hidden == len(whole) - sum(len(line) + 1 for line in shown), "partial lines are counted as hidden"
    assert shown == [line for line in whole.splitlines() if line in shown], "whole lines, in order"


def test_a_cut_stream_reads_within_the_length_the_cut_left() -> None:
    link = "sandbox://kept/abcdefghijklmnop/stdout"
    lines = ["".join(f"line {n}\n" for n in range(count)) for count in (1000, 5000)]
    one_line = "x" * 100_000 + "\n"
    for whole in (*lines, one_line):
        cut, _ = cap_text(whole, 2000)
        kept = result(stdout=cut, truncated=True, stdout_uri=link)
        kept.artifacts.kept_output["stdout"] = KeptOutput(whole, len(whole))
        text = model_text(kept)
        assert len(text) <= len(cut) and link in text, (len(text), len(cut))
        marker = next(line for line in text.splitlines() if link in line)
        hidden = int(marker.split("... [")[1].split()[0].replace(",", ""))
        shown = [line for line in text.splitlines() if line != marker]
        # Every character is shown or counted: whole lines with their newline; one long line's part.
        shown_characters = (
            sum(len(line) + 1 for line in shown) if whole in lines else text.count("x") - marker.count("x")
        )
        assert hidden == len(whole) - shown_characters, (hidden, len(whole), shown_characters)
        if whole in lines:
            assert set(shown) <= set(whole.splitlines()), "no part of a line reads as a line"


def test_a_cut_stream_shows_its_first_and_last_lines_only() -> None:
    whole = "".join(f"{n}\n" for n in range(5000))
    cut, _ = cap_text(whole, 4000)
    lines = model_text(result(stdout=cut, truncated=True)).splitlines()
    marker = lines.index(next(line for line in lines if "not shown" in line))
    assert lines[:marker] == [str(n) for n in range(CUT_LINES_SHOWN)]
    assert lines[marker + 1 :] == [str(n) for n in range(5000 - CUT_LINES_SHOWN, 5000)]
    hidden = int(lines[marker].split("[")[1].split()[0].replace(",", ""))
    assert hidden == len(whole) - sum(len(line) + 1 for i, line in enumerate(lines) if i != marker)


def test_an_output_that_was_not_cut_keeps_every_line() -> None:
    whole = "".join(f"{n}\n" for n in range(1000))
    assert model_text(result(stdout=whole)) == whole.removesuffix("\n")


def test_a_cut_with_its_link_names_it_once() -> None:
    link = "sandbox://kept/abc/stdout"
    cut, _ = cap_text("x" * 500 + "\n" + "y" * 500 + "\n", 200)
    kept = result(stdout=cut, truncated=True, stdout_uri=link, notes=[f"stdout was cut; all at {link}"])
    kept.artifacts.kept_output["stdout"] = KeptOutput("x" * 500, 1002)
    text = model_text(kept)
    assert text.count(link) == 1 and "all 1,002" in text


def test_an_error_without_a_traceback_is_its_type() -> None:
    assert model_text(result(status="crash")) == "SandboxCrash"
    assert model_text(result(status="error", exception="ValueError")) == "ValueError"
