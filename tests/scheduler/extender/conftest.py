from __future__ import annotations

import pytest

from tests.scheduler.extender.helpers import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
