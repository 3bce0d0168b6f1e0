"""devkit.cachelock: a second builder of one cache entry waits for the first."""

from __future__ import annotations

import threading
from pathlib import Path

from devkit.cachelock import exclusive


def test_a_second_holder_waits_until_the_first_lets_go(tmp_path: Path) -> None:
    lock = tmp_path / "made" / "by-the-first" / "entry.lock"
    first_holds, first_may_go, second_holds = (threading.Event() for _ in range(3))
    order: list[str] = []

    def first() -> None:
        with exclusive(lock):
            first_holds.set()
            first_may_go.wait(30)
            order.append("first done")

    def second() -> None:
        first_holds.wait(30)
        with exclusive(lock):
            order.append("second in")
            second_holds.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert first_holds.wait(30)
    # While the first holds the lock the second cannot be in: the event stays unset.
    assert not second_holds.wait(0.2)
    first_may_go.set()
    assert second_holds.wait(30)
    for thread in threads:
        thread.join(30)
    assert order == ["first done", "second in"]


def test_the_lock_is_let_go_when_the_block_raises(tmp_path: Path) -> None:
    lock = tmp_path / "entry.lock"
    try:
        with exclusive(lock):
            raise RuntimeError("the build failed")
    except RuntimeError:
        pass
    entered = threading.Event()

    def again() -> None:
        with exclusive(lock):
            entered.set()

    thread = threading.Thread(target=again)
    thread.start()
    assert entered.wait(30)
    thread.join(30)
