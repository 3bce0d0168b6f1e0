"""Faults that stop a defrag cycle (exit 1), as opposed to bad input (exit 2) or a move the
cluster refuses (a PDB at its limit: counted, not fatal).

API failures are classified once, in :mod:`scheduler.kube.errors`; this module turns the ones a
cycle cannot go on after into :class:`CycleStopped`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from scheduler.kube.errors import ApiError, ApiRefusal
from scheduler.kube.errors import call_api as _call_api

T = TypeVar("T")


class CycleStopped(RuntimeError):
    """A call to the cluster (or Prometheus) failed; the cycle stops where it is.

    The message says what was being done and what the server answered, so the CronJob's log
    tells an operator what to fix (RBAC, the hints ConfigMap, connectivity).
    """

    def __init__(self, doing: str, detail: str, *, status: int | None = None) -> None:
        self.doing = doing
        self.detail = detail
        self.status = status
        super().__init__(f"{doing}: {detail}")

    @classmethod
    def from_api_error(cls, e: ApiError) -> CycleStopped:
        detail = (f"cannot reach the API server: {e.message}" if e.status is None
                  else f"HTTP {e.status}: {e.message}")
        return cls(e.doing, detail, status=e.status)


def call_api(doing: str, fn: Callable[[], T]) -> T:
    """Run one Kubernetes API call; any failure raises :class:`CycleStopped`."""
    answer = call_api_or_refusal(doing, fn, ok=())
    assert not isinstance(answer, ApiRefusal)
    return answer


def call_api_or_refusal(doing: str, fn: Callable[[], T], *,
                        ok: tuple[int, ...]) -> T | ApiRefusal:
    """Run one Kubernetes API call. An answer whose status is in ``ok`` comes back as an
    :class:`ApiRefusal` (the caller handles it); any other failure raises :class:`CycleStopped`."""
    try:
        return _call_api(doing, fn, ok=ok)
    except ApiError as e:
        raise CycleStopped.from_api_error(e) from None


__all__ = ["ApiRefusal", "CycleStopped", "call_api", "call_api_or_refusal"]
