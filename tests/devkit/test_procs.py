"""devkit.procs: a start that fails stops what it started; one that succeeds says how long."""

from __future__ import annotations

import time

import pytest

from devkit.procs import start_all_or_none


def test_a_failed_start_stops_what_it_started_and_raises_again() -> None:
    stopped: list[str] = []

    def start() -> None:
        raise KeyboardInterrupt  # Ctrl-C during a start is a failure too

    with pytest.raises(KeyboardInterrupt):
        start_all_or_none(start, lambda: stopped.append("stopped"), started=time.monotonic())
    assert stopped == ["stopped"]


def test_a_start_returns_its_seconds_and_stops_nothing() -> None:
    stopped: list[str] = []
    began = time.monotonic()
    seconds = start_all_or_none(lambda: None, lambda: stopped.append("stopped"),
                                started=began - 2.0)
    assert stopped == []
    assert 2.0 <= seconds <= 2.0 + (time.monotonic() - began)
