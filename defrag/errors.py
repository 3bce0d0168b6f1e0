"""Faults that stop a defrag cycle (exit 1), as opposed to bad input (exit 2) or a move the
cluster refuses (a PDB at its limit: counted, not fatal)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import orjson

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


def _status(e: BaseException) -> int:
    status = getattr(e, "status", 0)
    return int(status) if isinstance(status, int) else 0


def describe(e: BaseException) -> str:
    """``HTTP <status>: <the API server's message>`` for a Kubernetes ApiException."""
    body = getattr(e, "body", None)
    if body:
        try:
            message = orjson.loads(body).get("message")
            if message:
                return f"HTTP {_status(e)}: {message}"
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            pass
    return f"HTTP {_status(e)} {getattr(e, 'reason', '') or e}"


def call_api(doing: str, fn: Callable[[], T]) -> T:
    """Run one Kubernetes API call; any failure raises :class:`CycleStopped`."""
    answer = call_api_or_refusal(doing, fn, ok=())
    assert not isinstance(answer, ApiRefusal)
    return answer


def call_api_or_refusal(doing: str, fn: Callable[[], T], *,
                        ok: tuple[int, ...]) -> T | ApiRefusal:
    """Run one Kubernetes API call. An answer whose status is in ``ok`` comes back as an
    :class:`ApiRefusal` (the caller handles it); any other failure raises :class:`CycleStopped`."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return fn()
    except ApiException as e:
        if _status(e) in ok:
            return ApiRefusal(_status(e), describe(e))
        raise CycleStopped(doing, describe(e), status=_status(e)) from None
    except (HTTPError, OSError) as e:
        raise CycleStopped(doing, f"cannot reach the API server: {e}") from None


@dataclass(frozen=True, slots=True)
class ApiRefusal:
    """An expected non-success answer (404 gone, 409 conflict, 429 budget spent)."""

    status: int
    message: str
