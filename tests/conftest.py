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

Every skip is judged here (the reasons and the strict switch: tests/skips.py): a skip whose
reason is not listed there, or a prerequisite skip under ``GPUFRAG_STRICT_SKIPS=1``, is turned
into a failure, whether a test, a fixture, a mark or a module's collection raised it.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest
import structlog

from tests import skips


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


def _judged(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn ``report`` from skipped into failed where :func:`tests.skips.judge` says so (an
    xfail, reported as skipped too, is left to pytest's own strict xfail)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    failure = skips.judge(message)
    if failure is not None:
        report.outcome = "failed"
        report.longrepr = failure


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                        pytest.TestReport]:
    report = yield
    _judged(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
        collector: pytest.Collector) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _judged(report)
    return report
