"""What the tests need the dev kit to build or fetch first (a Go tool, upstream CRDs): built,
or the test fails saying why, never skipped. One home for the fixtures that do it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from devkit.build import BuildError

T = TypeVar("T")


def built_or_fail(what: str, make: Callable[[], T]) -> T:
    """``make()``, or a failed test naming ``what`` and the build's own message."""
    try:
        return make()
    except BuildError as e:
        failure = str(e)
    pytest.fail(f"{what} failed:\n{failure}", pytrace=False)
