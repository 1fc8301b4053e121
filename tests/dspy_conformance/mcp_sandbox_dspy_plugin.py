"""A pytest plugin that runs DSPy's own interpreter tests against SandboxInterpreter.

Every `PythonInterpreter(...)` those tests make is a `SandboxInterpreter(...)` with the same
arguments. See tests/dspy_conformance/README.md for how to run it.
"""

from __future__ import annotations

import sys
import types

import pytest

#: The DSPy commit whose tests these are (DSPy 3.3.1; its interpreter is the one in DSPy 3.4.1).
DSPY_COMMIT = "4ed377ee9110e912d4f5e1be43b317b87455053c"
#: DSPy's tests of its interpreter and of the modules that run code in one.
FILES = [
    "tests/primitives/test_python_interpreter.py",
    "tests/callback/test_interpreter_callback.py",
    "tests/flex/test_flex_interpreter.py",
    "tests/flex/test_flex_binding.py",
    "tests/flex/test_flex_output_types.py",
    "tests/flex/test_flex_gepa.py",
    "tests/flex/test_tools.py",
    "tests/predict/test_rlm.py",
    "tests/predict/test_code_act.py",
    "tests/predict/test_program_of_thought.py",
]

DENO_COMMAND = "passes deno_command, which SandboxInterpreter refuses (it starts its own sandbox)"
JSON_RPC = "tests DSPy's JSON-RPC exchange with its Deno runner (request ids, out-of-band lines)"
DENO_SETUP = "tests how DSPy finds, checks and starts Deno (DENO_DIR, version probes, runner.js)"
INJECTION = "tests how DSPy writes variables into code (_inject_variables, _serialize_value)"
TOOL_SPEC = "tests _extract_parameters, how DSPy describes a tool to its runner"
PROCESS = "reaches into deno_process, DSPy's Deno subprocess"

#: DSPy tests that check DSPy's own machinery, not an interpreter's behaviour: skipped, with why.
#: Where the behaviour underneath holds here too, tests/integration/test_dspy.py checks it.
OUT_OF_SCOPE: dict[str, str] = {
    # tests/primitives/test_python_interpreter.py
    "test_enable_net_flag": "needs the internet (it fetches https://example.com)",
    "test_default_runner_starts_offline_from_warm_shared_cache": DENO_SETUP,
    "test_pydantic_json_values_are_compatible_with_large_variable_injection": INJECTION,
    "test_json_mode_values_cross_every_host_to_sandbox_path": INJECTION,
    "test_json_mode_coercion_preserves_existing_fallbacks": INJECTION,
    "test_unserializable_pydantic_variable_raises_code_interpreter_error": PROCESS,
    "test_custom_deno_command_is_unchanged": DENO_COMMAND,
    "test_rejects_mounts_with_the_same_guest_basename": DENO_COMMAND,
    "test_allows_same_canonical_file_as_read_and_write_mount": DENO_COMMAND,
    "test_rejects_alias_basename_colliding_with_another_file": DENO_COMMAND,
    "test_custom_deno_command_preserves_environment": DENO_COMMAND,
    "test_default_command_uses_managed_deno_for_info_and_run": DENO_SETUP,
    "test_default_command_revokes_shared_cache_after_startup": DENO_SETUP,
    "test_rejects_write_paths_overlapping_runtime_files": DENO_SETUP,
    "test_deno_info_probe_is_bounded": DENO_SETUP,
    "test_explicit_deno_dir_skips_info_query": DENO_SETUP,
    "test_process_death_ends_stateful_session": PROCESS,
    "test_protocol_failure_ends_session": JSON_RPC,
    "test_request_ids_are_128_bit_random_values": JSON_RPC,
    "test_failed_health_check_ends_session": JSON_RPC,
    "test_extract_parameters": TOOL_SPEC,
    "test_extract_parameters_complex_types": TOOL_SPEC,
    "test_small_variable_not_using_filesystem": INJECTION,
    "test_large_variable_threshold_boundary": INJECTION,
    "test_enable_read_paths_symlink": "reads deno_command's --allow-read flag",
    "test_out_of_band_messages_are_skipped_not_consumed_as_responses": JSON_RPC,
    "test_id_less_protocol_errors_are_terminal": JSON_RPC,
    "test_execution_instructions_are_class_metadata": DENO_COMMAND,
    # tests/callback/test_interpreter_callback.py
    "test_handle_tool_call_reports_host_exception_before_jsonrpc_conversion": JSON_RPC,
    # tests/predict/
    "test_pot_evaluate_creates_one_interpreter_per_example": PROCESS,
    "test_start_prewarms_sandbox": PROCESS,
    "test_start_is_idempotent": PROCESS,
    "test_python_interpreter_lm_request_bytes": (
        "compares RLM's prompt byte for byte with a snapshot that quotes "
        "PythonInterpreter.execution_instructions; "
        "this interpreter's instructions describe its own sandbox"
    ),
}

#: DSPy tests of a behaviour this interpreter has differently, on purpose: expected to fail, with why.
DIFFERENT: dict[str, str] = {
    "test_interpreter_security_filesystem_access": (
        "expects a given file to be readable at its host path through Deno's own API "
        "(js.Deno.readTextFileSync); this sandbox copies it in at /sandbox/<name> instead, and never opens "
        "host paths to the code"
    ),
    "test_codeact_code_parse_failure": (
        "expects the empty message DSPy's runner gives a SyntaxError; this one says where the error is"
    ),
}


def _replace(original: type, replacement: type) -> None:
    """Every reference DSPy's modules hold to `original`: module globals and default arguments."""
    for name, module in list(sys.modules.items()):
        if not (name == "dspy" or name.startswith("dspy.")) or module is None:
            continue
        for attribute, value in list(vars(module).items()):
            if value is original:
                setattr(module, attribute, replacement)
            for function in _functions(value):
                if function.__defaults__ and original in function.__defaults__:
                    function.__defaults__ = tuple(
                        replacement if d is original else d for d in function.__defaults__
                    )
                if function.__kwdefaults__:
                    for key, default in function.__kwdefaults__.items():
                        if default is original:
                            function.__kwdefaults__[key] = replacement


def _functions(value: object) -> list[types.FunctionType]:
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, type):
        return [f for f in vars(value).values() if isinstance(f, types.FunctionType)]
    return []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--mcp-sandbox-whole-list",
        action="store_true",
        help="fail when OUT_OF_SCOPE or DIFFERENT names a test not collected (run with every file of FILES)",
    )


def pytest_configure(config: pytest.Config) -> None:
    import dspy  # noqa: F401 - loads the modules whose references are replaced
    import dspy.primitives.python_interpreter as python_interpreter

    from mcp_sandbox.integrations.dspy import SandboxInterpreter

    _replace(python_interpreter.PythonInterpreter, SandboxInterpreter)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seen = set()
    for item in items:
        name = item.name.split("[")[0]
        if (reason := OUT_OF_SCOPE.get(name)) is not None:
            seen.add(name)
            item.add_marker(pytest.mark.skip(reason=f"out of scope: {reason}"))
        elif (reason := DIFFERENT.get(name)) is not None:
            seen.add(name)
            item.add_marker(pytest.mark.xfail(reason=f"different on purpose: {reason}", strict=True))
    if config.getoption("--mcp-sandbox-whole-list"):
        stale = sorted((set(OUT_OF_SCOPE) | set(DIFFERENT)) - seen)
        if stale:  # the lists name only tests that exist, so they cannot hide a renamed one
            raise pytest.UsageError(
                f"OUT_OF_SCOPE or DIFFERENT names tests DSPy's files do not have: {stale}"
            )
