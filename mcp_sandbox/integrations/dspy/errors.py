"""DSPy's interpreter exceptions, which SandboxInterpreter raises as DSPy's own interpreter does:
CodeExecutionError for a failure of the code (the session goes on), a bare CodeInterpreterError
for one of the interpreter (it is then finished), and SyntaxError."""

try:
    from dspy.primitives.code_interpreter import (  # type: ignore[import-untyped]
        CodeExecutionError,
        CodeInterpreterError,
        FinalOutput,
    )
except ImportError as missing:  # pragma: no cover - depends on the environment
    raise ImportError(
        'mcp_sandbox.integrations.dspy needs DSPy: pip install "mcp-sandbox[dspy]"'
    ) from missing

__all__ = ["CodeExecutionError", "CodeInterpreterError", "FinalOutput"]
