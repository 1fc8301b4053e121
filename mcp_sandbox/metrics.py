"""What an operator counts: the Prometheus metrics of one App, on a registry of its own (several
Apps in one process, as in tests and the Python API, never share or collide). Events are counted
where they happen; what is a state rather than an event (sessions by state, the ready pool) is
read when `/metrics` is scraped.

No label ever names a principal or a session: those are unbounded. Labels take values from
fixed sets (backends, outcomes, the kinds of refusal and the settings that set a limit)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mcp_sandbox.errors import PrincipalLimitReached, Refused
from mcp_sandbox.result import SANDBOX_NAMES, ExecutionResult
from mcp_sandbox.version import __version__

#: What `/metrics` answers with.
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: Seconds: a warm call takes milliseconds, a program may run for minutes.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
WAIT_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: The outcome of a call the server refused to run (the refusal's kind is counted apart).
REFUSED = "refused"


def outcome_of(result: ExecutionResult) -> str:
    """The result's status: ok, error (an exception in the program), timeout, cancelled,
    memory_limit, crash or rejected."""
    return result.status


@dataclass
class Readings:
    """What the scrape reads from the live server: sessions by state, ready and waiting."""

    sessions: Callable[[], Mapping[str, int]] = dict
    ready: Callable[[], int] = lambda: 0
    waiting: Callable[[], int] = lambda: 0
    backend: Callable[[], str] = lambda: ""


class _Gauges(Collector):
    """Read at each scrape."""

    def __init__(self) -> None:
        self.readings = Readings()

    def collect(self) -> Iterable[Metric]:
        sessions = GaugeMetricFamily(
            "mcp_sandbox_sessions", "Sessions open on this instance, by state.", labels=["state"]
        )
        for state, count in sorted(self.readings.sessions().items()):
            sessions.add_metric([state], count)
        yield sessions
        yield GaugeMetricFamily(
            "mcp_sandbox_ready_sandboxes",
            "Sandboxes started and waiting in the ready pool.",
            self.readings.ready(),
        )
        yield GaugeMetricFamily(
            "mcp_sandbox_waiting_calls", "Calls waiting for a sandbox.", self.readings.waiting()
        )
        info = GaugeMetricFamily(
            "mcp_sandbox_build_info", "This server's version and backend.", labels=["version", "backend"]
        )
        info.add_metric([__version__, self.readings.backend()], 1)
        yield info


class Metrics:
    """One App's metrics. Each `count_*`/`observe_*` is one line where its event happens."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.calls = Counter(
            "mcp_sandbox_calls",
            "execute_python calls ended, by backend and outcome (ok, error, timeout, cancelled, "
            "memory_limit, crash, rejected, refused).",
            ["backend", "outcome"],
            registry=registry,
        )
        self.call_seconds = Histogram(
            "mcp_sandbox_call_duration_seconds",
            "Seconds from a call's arrival to its result or refusal, by backend and outcome.",
            ["backend", "outcome"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.refusals = Counter(
            "mcp_sandbox_refusals",
            "Calls refused, by kind (the Refused subclass) and the setting whose limit it was ('' if none).",
            ["kind", "setting"],
            registry=registry,
        )
        self.sandbox_wait = Histogram(
            "mcp_sandbox_sandbox_wait_seconds",
            "Seconds a call or a session waited for a sandbox from the ready pool (got one or not).",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.sandboxes_lost = Counter(
            "mcp_sandbox_sandboxes_lost",
            "Sandboxes that ended during a call: killed after ignoring the interrupt (timeout), past "
            "their memory (memory_limit), or crashed or killed from outside (crash).",
            ["reason"],
            registry=registry,
        )
        self.sandbox_start_failures = Counter(
            "mcp_sandbox_sandbox_start_failures", "Sandboxes that failed to start.", registry=registry
        )
        self.restores = Counter(
            "mcp_sandbox_restores",
            "Sessions put back from a checkpoint into a new sandbox (restored), or whose checkpoint "
            "could not be used (failed).",
            ["outcome"],
            registry=registry,
        )
        self.checkpoints = Counter(
            "mcp_sandbox_checkpoints", "Session checkpoints written to the store.", registry=registry
        )
        self.checkpoint_bytes = Counter(
            "mcp_sandbox_checkpoint_bytes",
            "Bytes of checkpoints written to the store, as the sandbox gave them (before compression).",
            registry=registry,
        )
        self.store_errors = Counter(
            "mcp_sandbox_store_errors",
            "Store operations that failed (a disk full, a cap reached, the store unreachable), by operation.",
            ["operation"],
            registry=registry,
        )
        self.handovers = Counter(
            "mcp_sandbox_handovers",
            "Sessions this instance checkpointed and let go because another instance asked for them.",
            registry=registry,
        )
        self._gauges = _Gauges()
        registry.register(self._gauges)

    def read(self, readings: Readings) -> None:
        """What the scrape reads (App sets it once the sessions and the ready pool exist)."""
        self._gauges.readings = readings

    @contextmanager
    def call(self, backend: str) -> Iterator[Call]:
        """Count the call made in the block, with its duration: its outcome is what `Call.ended`
        was told, or `refused` when a Refused leaves the block (counted by kind too)."""
        call = Call(time.perf_counter())
        try:
            yield call
        except Refused as refusal:
            call.outcome = REFUSED
            self.refusals.labels(type(refusal).__name__, refusal_setting(refusal)).inc()
            raise
        finally:
            if call.outcome is not None:  # None: cancelled, or a bug; neither is a call's outcome
                self.calls.labels(backend, call.outcome).inc()
                self.call_seconds.labels(backend, call.outcome).observe(time.perf_counter() - call.started)

    def count_lost(self, result: ExecutionResult) -> None:
        """A result straight from a sandbox: if its sandbox ended during the call, count why."""
        if result.session_lost:
            self.sandboxes_lost.labels(result.status if result.status in SANDBOX_NAMES else "crash").inc()

    def count_restore(self, restored: bool, problem: str | None) -> None:
        """A restore's outcome: restored, or failed (a checkpoint there and unusable); nothing
        when the session had no checkpoint."""
        if restored or problem is not None:
            self.restores.labels("restored" if restored else "failed").inc()

    def count_checkpoint(self, size: int) -> None:
        self.checkpoints.inc()
        self.checkpoint_bytes.inc(size)

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)


@dataclass
class Call:
    started: float
    outcome: str | None = None

    def ended(self, result: ExecutionResult) -> None:
        self.outcome = outcome_of(result)


def refusal_setting(refusal: Refused) -> str:
    """The setting whose limit refused a call ('' for refusals no one setting explains)."""
    return refusal.setting if isinstance(refusal, PrincipalLimitReached) else ""
