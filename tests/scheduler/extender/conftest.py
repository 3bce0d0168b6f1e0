from __future__ import annotations

import shutil

import pytest

from tests import skips
from tests.scheduler.extender.helpers import FakeClock, Pki, make_pki


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        skips.skip(skips.MISSING_COMMAND, "openssl, to make test certificates")
    return make_pki(tmp_path_factory.mktemp("pki"))
