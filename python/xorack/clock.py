"""Injectable clocks: the FT layer asks a clock for the time instead of calling time itself,
so timeout tests advance a ManualClock and never sleep.

>>> from xorack import ManualClock
>>> c = ManualClock(); c.advance(2.5); c.now()
2.5
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic, arbitrary origin."""
        ...


class MonotonicClock:
    """Wall time from ``time.monotonic()`` (the default)."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        with self._lock:
            self._t += seconds
