"""The one mapping from Kubernetes API failures to retryable and permanent errors.

The extender's binder, the defrag controller and the node agent all call the API server; they
used to classify its answers three ways. Here is the one table (kopf's ``_cogs/clients/errors``
in spirit): no answer at all (connection refused or reset, a timeout), 408, 429 and any 5xx
may pass on a retry; every other status is the caller's to fix (400 invalid, 401/403 RBAC, 404
gone, 409 conflict or already done, 422 invalid) and is permanent. A caller that expects a
status (404 on a first read, 409 in an optimistic-concurrency loop) says so with ``ok=`` and
gets it back as an :class:`ApiRefusal` instead of an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import orjson
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

T = TypeVar("T")

# Statuses worth retrying; None stands for "no answer" (connection errors, timeouts).
RETRYABLE_STATUSES = frozenset({408, 429})


def is_retryable(status: int | None) -> bool:
    return status is None or status in RETRYABLE_STATUSES or status >= 500


class ApiError(RuntimeError):
    """A failed API call: what was being done, the HTTP status (None when the server never
    answered), the server's own message, and whether a retry may succeed."""

    def __init__(self, doing: str, status: int | None, message: str, *,
                 reason: str = "") -> None:
        self.doing = doing
        self.status = status
        self.message = message
        self.reason = reason
        self.retryable = is_retryable(status)
        where = ("cannot reach the API server" if status is None
                 else f"HTTP {status} {reason}".rstrip())
        super().__init__(f"{doing}: {where}: {message}" if message else f"{doing}: {where}")


@dataclass(frozen=True, slots=True)
class ApiRefusal:
    """An expected non-success answer (404 gone, 409 conflict, 429 budget spent)."""

    status: int
    message: str


def server_message(e: ApiException) -> str:
    """The API server's ``Status.message`` from an ApiException, else its reason phrase."""
    body = e.body
    if body:
        try:
            message = orjson.loads(body).get("message")
            if message:
                return str(message)
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return str(body)[:300]
    return str(e.reason or "")


def api_error(doing: str, e: BaseException) -> ApiError | None:
    """``e`` as an :class:`ApiError`, or None when it is not a failure of the API call."""
    if isinstance(e, ApiException):
        status = e.status if isinstance(e.status, int) and e.status else None
        message = server_message(e)
        reason = str(e.reason or "")
        return ApiError(doing, status, "" if message == reason else message, reason=reason)
    if isinstance(e, HTTPError | OSError):
        return ApiError(doing, None, str(e) or type(e).__name__)
    return None


@contextmanager
def api_errors(doing: str) -> Iterator[None]:
    """Translate any failure of the API calls inside into :class:`ApiError`."""
    try:
        yield
    except Exception as e:
        error = api_error(doing, e)
        if error is None:
            raise
        raise error from None


def call_api(doing: str, fn: Callable[[], T], *, ok: tuple[int, ...] = ()) -> T | ApiRefusal:
    """Run one API call. An answer whose status is in ``ok`` comes back as an
    :class:`ApiRefusal`; any other failure raises :class:`ApiError`."""
    try:
        with api_errors(doing):
            return fn()
    except ApiError as e:
        if e.status is not None and e.status in ok:
            return ApiRefusal(e.status, f"HTTP {e.status}: {e.message}")
        raise


__all__ = ["ApiError", "ApiRefusal", "api_error", "api_errors", "call_api", "is_retryable",
           "server_message"]
