"""tracing.py: spans along a call's path, read with the OpenTelemetry SDK's in-memory exporter
(skipped without the SDK, which the dev extra installs); and when the OTEL_* variables ask for
traces."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
from opentelemetry import trace

from mcp_sandbox import tracing
from mcp_sandbox.sandbox import Sandbox
from tests.unit.test_hibernation import pool_of_sessions

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Spans of this test only: a provider of its own behind tracing's tracer (not the global one)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", provider.get_tracer("test"))
    return exporter


async def test_a_call_is_a_span_and_its_wait_for_a_sandbox_a_child(spans: InMemorySpanExporter) -> None:
    async with Sandbox(backend="inprocess", pool_size=1, default_packages="") as sandbox:
        assert (await sandbox.run("1 + 1")).result == "2"
    by_name = {span.name: span for span in spans.get_finished_spans()}
    execute, wait = by_name["mcp_sandbox.execute"], by_name["mcp_sandbox.sandbox_wait"]
    assert wait.parent is not None and execute.context is not None
    assert wait.parent.span_id == execute.context.span_id


async def test_a_checkpoint_and_a_restore_are_spans(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    async with pool_of_sessions(tmp_path, max_live_sandboxes=1) as sessions:
        await sessions.run("a1", timeout=1, session_id="a")
        await sessions.run("b1", timeout=1, session_id="b")  # a is checkpointed and hibernated
        assert (await sessions.run("a2", timeout=1, session_id="a")).result == '["a1", "a2"]'
    names = [span.name for span in spans.get_finished_spans()]
    assert "mcp_sandbox.checkpoint" in names and "mcp_sandbox.restore" in names, names


def test_the_otel_variables_ask_for_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert not tracing.wanted()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert tracing.wanted()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.wanted()
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    assert not tracing.wanted()


def test_asked_for_traces_without_the_exporter_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if importlib.util.find_spec("opentelemetry.exporter") is not None:
        pytest.skip("the otel extra is installed here")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    with caplog.at_level(logging.WARNING, logger="mcp_sandbox.tracing"):
        tracing.configure()
    assert "pip install 'mcp-sandbox[otel]'" in caplog.text
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), "nothing was set"
