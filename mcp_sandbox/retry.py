"""One backoff for everything that retries: starting sandboxes, reconnecting upstreams."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Backoff:
    """Waits that double after each failure in a row, from `first` up to `cap` seconds."""

    first: float = 0.5
    cap: float = 30.0
    failures: int = 0

    @property
    def delay(self) -> float:
        """The wait before the next try: none before the first failure."""
        return 0.0 if self.failures == 0 else min(self.first * 2 ** (self.failures - 1), self.cap)

    def failed(self) -> None:
        self.failures += 1

    def succeeded(self) -> None:
        self.failures = 0
