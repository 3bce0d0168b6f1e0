"""Time, injected: the batcher asks a :class:`Clock` for "now" and to sleep until a deadline.

Production uses the event loop's monotonic clock; tests use :class:`serving.testing.FakeClock`,
whose time moves only when the test says so, so batching-delay and timeout behaviour is tested
exactly and without wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences mean anything)."""
        ...

    async def sleep_until(self, deadline_s: float) -> None:
        """Return once ``now() >= deadline_s`` (at the earliest)."""
        ...


class MonotonicClock:
    """``time.monotonic`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline_s: float) -> None:
        delay = deadline_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
