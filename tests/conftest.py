"""Suite-wide fixtures, and how the test command spreads the tests over its workers.

The test command (scripts/test) runs the tests in a random order (pytest-randomly, its seed
printed) on two pytest-xdist workers with ``--dist loadgroup``. Every test passes alone and in
any order; the groups below only keep expensive or machine-wide things in one worker:
- the real-node tests (tests/e2e/node) share the machine's one kubelet (its device-plugin socket
  path is machine-wide), so they all run in one worker;
- every other end-to-end module runs in one worker, so its module-scoped cluster starts once.
Unit tests are spread one by one.

Commands run in-process by tests (``main(argv)``, servers in threads) configure structlog as
they do in production, where ``cache_logger_on_first_use`` lets each module-level logger fix
its level and processors the first time it logs. Across tests that would leak one test's
configuration into every later one (``structlog.testing.capture_logs`` would then see
nothing), so for the whole session every configuration is made uncached, also for a server
thread that outlives its test, and the defaults are restored after each test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

TESTS = Path(__file__).resolve().parent
E2E = TESTS / "e2e"
REAL_NODE = E2E / "node"
REAL_NODE_GROUP = "real-node"


def xdist_group(item: pytest.Item) -> str | None:
    """The worker group of ``item``: None for a test that may run in any worker."""
    path = Path(str(item.path)).resolve()
    if REAL_NODE in path.parents:
        return REAL_NODE_GROUP
    if E2E in path.parents or item.get_closest_marker("e2e") is not None:
        return str(path.relative_to(TESTS.parent))
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


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
