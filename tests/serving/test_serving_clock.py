"""The injected clocks: the real one sleeps until its deadline; the fake one only on advance."""

from __future__ import annotations

import asyncio

from serving.clock import MonotonicClock
from serving.testing import FakeClock, settle


def test_monotonic_clock_sleeps_until_the_deadline() -> None:
    async def main() -> None:
        clock = MonotonicClock()
        deadline = clock.now() + 0.01
        await clock.sleep_until(deadline)
        assert clock.now() >= deadline
        await clock.sleep_until(deadline - 1)  # past deadlines return at once

    asyncio.run(main())


def test_fake_clock_wakes_sleepers_in_deadline_order_only_when_advanced() -> None:
    async def main() -> None:
        clock = FakeClock(start_s=0.0)
        woke: list[str] = []

        async def sleeper(name: str, at: float) -> None:
            await clock.sleep_until(at)
            woke.append(name)

        tasks = [asyncio.create_task(sleeper("late", 2.0)),
                 asyncio.create_task(sleeper("early", 1.0))]
        await settle()
        assert woke == [] and clock.sleepers == 2
        clock.advance(1.0)
        await settle()
        assert woke == ["early"]
        clock.advance(5.0)
        await asyncio.gather(*tasks)
        assert woke == ["early", "late"] and clock.now() == 6.0

    asyncio.run(main())
