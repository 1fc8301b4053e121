"""DSPy's own interpreter tests, unchanged, against SandboxInterpreter (README.md here says how)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from mcp_sandbox_dspy_plugin import DIFFERENT, DSPY_COMMIT, FILES, OUT_OF_SCOPE  # noqa: E402

CHECKOUT = os.environ.get("MCP_SANDBOX_DSPY_TESTS")
#: DSPy's own reasons to skip a test, which hold here too (a real LM, an API key).
DSPY_SKIPS = ("Requires actual LM", "need --", "LM_FOR_TEST")


def _checkout() -> Path:
    if not CHECKOUT:
        pytest.skip(
            "DSPy's tests are not on PyPI: clone https://github.com/stanfordnlp/dspy at "
            f"{DSPY_COMMIT[:12]} and set MCP_SANDBOX_DSPY_TESTS to it (tests/dspy_conformance/README.md)"
        )
    path = Path(CHECKOUT)
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert head.stdout.strip() == DSPY_COMMIT, f"{path} is not at DSPy commit {DSPY_COMMIT}"
    return path


def test_dspy_interpreter_tests_pass_on_sandbox_interpreter(tmp_path: Path) -> None:
    checkout = _checkout()
    report = tmp_path / "report.xml"
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE),
        # DSPy's tests look for deno on PATH; the environment's own is beside its Python.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM would fetch its price list from the internet
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "mcp_sandbox_dspy_plugin",
        "--deno",
        "--mcp-sandbox-whole-list",
    ]
    run = subprocess.run(
        [*command, "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *FILES],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    failed, skipped, passed = [], {}, 0
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = case.get("name", "").split("[")[0]
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            passed += 1
        elif outcome.tag == "skipped":
            skipped[name] = outcome.get("message", "")
        else:
            failed.append(f"{case.get('classname')}::{case.get('name')}: {outcome.get('message', '')[:300]}")
    assert not failed, "\n".join(failed)
    unexplained = {
        name: why
        for name, why in skipped.items()
        if name not in OUT_OF_SCOPE and name not in DIFFERENT and not any(s in why for s in DSPY_SKIPS)
    }
    assert not unexplained, unexplained
    # 365 pass at DSPY_COMMIT; far fewer means tests were skipped wholesale.
    assert passed >= 350, f"only {passed} of DSPy's tests ran and passed:\n{run.stdout[-2000:]}"
