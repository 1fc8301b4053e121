"""The strict policy's AST check, case by case."""

from __future__ import annotations

import pytest

from mcp_sandbox.policy import policy_violation


@pytest.mark.parametrize(
    "code",
    [
        "import os",
        "import os.path",
        "import numpy, sys",
        "from importlib import import_module",
        "from . import sibling",
        "__import__('os')",
        "b = __builtins__",
        "exec('1')",
        "run = exec",
        "compile('1', 'f', 'exec')",
        "getattr(object, 'x')",
        "vars()",
        "globals()",
        "breakpoint()",
        "input()",
        "f.__globals__",
        "f.__code__",
        "type(x).__mro__",
        "x.__dict__",
        "x.__reduce_ex__(2)",
        "g.gi_frame.f_back",
        "tb.tb_frame",
        "def f():\n    return open('x')",
        "class A:\n    y = __loader__",
    ],
)
def test_rejected(code: str) -> None:
    reason = policy_violation(code)
    assert reason is not None and reason.startswith("Rejected by the strict code policy")


@pytest.mark.parametrize(
    "code",
    [
        "import numpy as np\nimport pandas as pd\nnp.arange(3)",
        "from collections import Counter\nCounter('abc')",
        "import matplotlib.pyplot as plt",
        "import scipy.stats",
        "class P:\n"
        "    def __init__(self, x):\n        self.x = x\n    def __repr__(self):\n        return ''",
        "class B(A):\n    def __init__(self):\n        super().__init__()",
        "np.__version__",
        "print(__name__)",
        "def broken(:",  # left to the sandbox, which reports the SyntaxError
    ],
)
def test_allowed(code: str) -> None:
    assert policy_violation(code) is None


def test_reason_names_the_line_and_the_allowlist() -> None:
    reason = policy_violation("x = 1\n\nimport socket")
    assert reason is not None
    assert "line 3" in reason and "'socket'" in reason and "pandas" in reason


def test_deep_nesting_is_rejected_not_crashed() -> None:
    reason = policy_violation("x = " + "-" * 200_000 + "1")
    assert reason is not None and "too deeply nested" in reason
