"""OpenTelemetry spans along a call's path: the call, its wait for a sandbox, a restore, a
checkpoint. Through the OpenTelemetry API alone (which the MCP SDK depends on), so they cost
nothing until an SDK is installed and configured: `pip install 'mcp-sandbox[otel]'` and set
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_TRACES_EXPORTER); `configure` does the rest, once, at
`serve`. The MCP SDK's own span for each request is the parent of ours."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from opentelemetry import trace

from mcp_sandbox.version import __version__

logger = logging.getLogger(__name__)

tracer = trace.get_tracer("mcp_sandbox", __version__)

P = ParamSpec("P")
T = TypeVar("T")


def traced(name: str) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """An async function whose every run is a span called `name` (a child of the current one)."""

    def decorate(function: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(function)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            with tracer.start_as_current_span(name):
                return await function(*args, **kwargs)

        return run

    return decorate


def wanted() -> bool:
    """Whether the standard OTEL_* variables ask for traces to be exported."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "")
    return exporter not in ("", "none") or bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure() -> None:
    """Export spans over OTLP/HTTP when the OTEL_* variables ask for it and the `otel` extra is
    installed; else nothing (a warning when asked but not installed). A tracer provider already
    set (`opentelemetry-instrument`) is left as it is."""
    if not wanted() or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning(
            "OTEL_* asks for traces, but the otel extra is missing: pip install 'mcp-sandbox[otel]'"
        )
        return
    # Each reads its own OTEL_* variables: OTEL_SERVICE_NAME, the endpoint, headers, sampler, batching.
    service = os.environ.get("OTEL_SERVICE_NAME", "mcp-sandbox")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    logger.info("exporting traces over OTLP")
