"""Every reason a test may skip, named once, and what the strict switch makes of each.

A skip is a check that did not run. Written by hand at each place, a skip reads as a pass in a
green run: a trace looked for in the wrong folder, a tool the test command failed to install or
a test run as the wrong user would each hide a published claim's test for good. So a test skips
only through this module, with one of the reasons below, and the suite-wide hooks
(tests/conftest.py) judge every skip, from a test, a fixture, a mark or a module:

- a skip whose message does not start with a reason named here fails ("skip reason not in
  tests/skips.py: ...");
- a *prerequisite* skip (something the test command provides or CI must have: the trace data,
  a toolchain, root, a package of the locked test environment) is allowed on a developer's
  machine and fails under ``GPUFRAG_STRICT_SKIPS=1``, which ``.ci/run`` sets;
- a *by-design* skip (the machine is one where the check cannot mean anything: a GPU is present
  for a test of the no-GPU path, say) is allowed everywhere.

Skip with :func:`skip` (in a test or fixture), :func:`skip_if` (a mark) or :func:`importorskip`;
each writes the message as ``NAME: why (detail)``, which :func:`judge` reads back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import pytest

STRICT_ENV: Final = "GPUFRAG_STRICT_SKIPS"


@dataclass(frozen=True)
class Reason:
    """One allowed reason: its name (the message's first word), why such a skip is allowed, and
    whether it is a prerequisite (a failure under the strict switch)."""

    name: str
    why: str
    prerequisite: bool

    def message(self, detail: str = "") -> str:
        """``NAME: why`` plus the detail of this place, the form :func:`judge` parses."""
        return f"{self.name}: {self.why}" + (f" ({detail})" if detail else "")


# Prerequisites: what the test command installs or builds, or what CI must provide.
MISSING_TRACE: Final = Reason(
    "MISSING_TRACE", "the trace data is not under the data root (GPUFRAG_DATA_ROOT, default "
    "shared/data beside the repository)", prerequisite=True)
NOT_ROOT: Final = Reason(
    "NOT_ROOT", "needs root (a real node, buildah's chroot isolation)", prerequisite=True)
NO_GO: Final = Reason("NO_GO", "no Go toolchain on PATH", prerequisite=True)
NO_C_COMPILER: Final = Reason(
    "NO_C_COMPILER", "no C compiler or no Python headers: the C kernel cannot be built",
    prerequisite=True)
MISSING_COMMAND: Final = Reason(
    "MISSING_COMMAND", "a system command the test needs is not on PATH (scripts/install-node-deps "
    "installs the node's)", prerequisite=True)
NOT_INSTALLED: Final = Reason(
    "NOT_INSTALLED", "a package of the locked test environment (requirements/test.lock) is not "
    "installed as scripts/test installs it", prerequisite=True)

# By design: the check cannot mean anything on such a machine, CI's included.
NO_GPU: Final = Reason("NO_GPU", "needs a GPU and this machine has none", prerequisite=False)
GPU_PRESENT: Final = Reason(
    "GPU_PRESENT", "a GPU (NVML) is here: the no-GPU path this test checks cannot be reached",
    prerequisite=False)
TENSORRT_PRESENT: Final = Reason(
    "TENSORRT_PRESENT", "tensorrt is installed here: its absence cannot be tested",
    prerequisite=False)
NO_CONTAINERS: Final = Reason(
    "NO_CONTAINERS", "this machine's sandbox runs no containers: the node runs upstream's fake "
    "CRI, which starts none (DESIGN.md, 'Real components')", prerequisite=False)
SAME_CA_BUNDLE: Final = Reason(
    "SAME_CA_BUNDLE", "this machine's CA bundle is Debian's own: a leak into the image could "
    "not be told apart", prerequisite=False)

REASONS: Final[dict[str, Reason]] = {r.name: r for r in (
    MISSING_TRACE, NOT_ROOT, NO_GO, NO_C_COMPILER, MISSING_COMMAND, NOT_INSTALLED,
    NO_GPU, GPU_PRESENT, TENSORRT_PRESENT, NO_CONTAINERS, SAME_CA_BUNDLE)}


def strict() -> bool:
    """Whether prerequisite skips fail (``GPUFRAG_STRICT_SKIPS=1``, set by ``.ci/run``)."""
    return os.environ.get(STRICT_ENV, "") == "1"


def skip(reason: Reason, detail: str = "") -> NoReturn:
    """Skip the running test (or fixture) for ``reason``."""
    __tracebackhide__ = True  # the skip is reported at the caller's line, not this one
    pytest.skip(reason.message(detail))


def skip_if(condition: bool, reason: Reason, detail: str = "") -> pytest.MarkDecorator:
    """``pytest.mark.skipif`` with ``reason``'s message."""
    return pytest.mark.skipif(condition, reason=reason.message(detail))


def importorskip(module: str, reason: Reason, detail: str = "") -> Any:
    """``pytest.importorskip`` with ``reason``'s message (its own would name no reason)."""
    return pytest.importorskip(module, reason=reason.message(detail))


def judge(message: str) -> str | None:
    """Why a skip with this message must count as a failure, or None where it may stand.

    ``message`` is the skip's text as pytest reports it (with or without its ``Skipped: ``)."""
    text = message.removeprefix("Skipped: ")
    reason = REASONS.get(text.split(":", 1)[0].strip())
    if reason is None:
        return (f"skip reason not in tests/skips.py: {text!r} (skip with a reason named there, "
                f"or name a new one there with why it may skip)")
    if reason.prerequisite and strict():
        return (f"a prerequisite is missing and {STRICT_ENV}=1 makes that a failure: {text}")
    return None
