"""The trace data the tests read: files under the one data root (:mod:`gpufrag.dataroot`).

Every test that reads the shared traces asks here, so each finds them where the product does
(``GPUFRAG_DATA_ROOT``, or ``shared/data`` beside the repository, wherever pytest was started),
and where they are missing skips with the one named reason, :data:`tests.skips.MISSING_TRACE`:
a pass on a developer's machine without the data, a failure under ``GPUFRAG_STRICT_SKIPS=1``
(CI), where the tests behind published claims must run.
"""

from __future__ import annotations

from pathlib import Path

from gpufrag.dataroot import ENV, data_root
from tests import skips


def _where(path: Path) -> str:
    return f"{path} is missing; set {ENV} to the folder holding openb/, genai/ and kss/"


def trace(*parts: str) -> Path:
    """``parts`` under the data root (a file or a folder); the test skips when it is absent."""
    __tracebackhide__ = True  # reported at the test's line
    path = data_root().joinpath(*parts)
    if not path.exists():
        skips.skip(skips.MISSING_TRACE, _where(path))
    return path


def trace_or_none(*parts: str) -> Path | None:
    """``parts`` under the data root, or None for a test that then runs on the synthetic
    stand-in instead; under the strict switch a missing trace still fails (CI must run the
    trace's case), so nothing quietly checks less there."""
    __tracebackhide__ = True  # reported at the test's line
    path = data_root().joinpath(*parts)
    if path.exists():
        return path
    if skips.strict():
        skips.skip(skips.MISSING_TRACE, _where(path))
    return None
