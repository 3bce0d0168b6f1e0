"""Suite-wide fixtures.

The test command (scripts/test) runs the tests in a random order (pytest-randomly, its seed
printed) on pytest-xdist workers; every test passes alone and in any order (how the runs are
split between workers and processes: scripts/test).

Commands run in-process by tests (``main(argv)``, servers in threads) configure structlog as
they do in production, where ``cache_logger_on_first_use`` lets each module-level logger fix
its level and processors the first time it logs. Across tests that would leak one test's
configuration into every later one (``structlog.testing.capture_logs`` would then see
nothing), so for the whole session every configuration is made uncached, also for a server
thread that outlives its test, and the defaults are restored after each test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import structlog


@pytest.fixture(autouse=True, scope="session")
def _structlog_uncached() -> Iterator[None]:
    configure = structlog.configure

    def uncached(**settings: Any) -> None:
        configure(**{**settings, "cache_logger_on_first_use": False})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(structlog, "configure", uncached)
        yield


@pytest.fixture(autouse=True)
def _structlog_defaults_after_each_test() -> Iterator[None]:
    yield
    structlog.reset_defaults()
