"""Use mcp-sandbox where you use `dspy.PythonInterpreter`: ProgramOfThought, CodeAct, RLM and Flex
run their code in a sandbox session.

    import dspy
    from mcp_sandbox.integrations.dspy import SandboxInterpreter

    dspy.configure(interpreter_factory=SandboxInterpreter)

`SandboxInterpreter` takes `PythonInterpreter`'s arguments and behaves as it does (DSPy's own
interpreter tests run against it: tests/dspy_conformance). interpreter.py is the host side,
guest.py what runs in the session, values.py how values cross, mounts.py the host files.
"""

from mcp_sandbox.integrations.dspy.errors import CodeExecutionError, CodeInterpreterError, FinalOutput
from mcp_sandbox.integrations.dspy.interpreter import SandboxInterpreter

__all__ = ["CodeExecutionError", "CodeInterpreterError", "FinalOutput", "SandboxInterpreter"]
