"""Why a request was not answered with outputs, each mapped to one HTTP status.

The batcher raises (or sets on a request's future) these; the HTTP layer turns them into the v2
error shape ``{"error": "<message>"}`` with :attr:`ServingError.status`. ``retryable`` tells a
client whether the same request may succeed later (the client retries only those statuses).
"""

from __future__ import annotations


class ServingError(Exception):
    """A request that gets an error response rather than outputs."""

    status = 500
    retryable = False
    outcome = "error"

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class InvalidRequest(ServingError):
    """The request itself is wrong (names, shapes, datatypes, JSON); sending it again won't help."""

    status = 400
    outcome = "invalid"


class ModelNotFound(ServingError):
    status = 404
    outcome = "invalid"


class BodyTooLarge(ServingError):
    status = 413
    outcome = "invalid"


class UnsupportedMediaType(ServingError):
    """A request body in a coding the server does not read (``Content-Encoding``)."""

    status = 415
    outcome = "invalid"


class Unavailable(ServingError):
    """Not admitted: queue full, model not loaded yet, or shutting down. Retry after a pause."""

    status = 503
    retryable = True
    outcome = "rejected"


class QueueFull(Unavailable):
    pass


class ShuttingDown(Unavailable):
    pass


class RequestTimedOut(ServingError):
    """The request's deadline passed while it was queued; it was never computed."""

    status = 504
    retryable = True
    outcome = "timeout"


class BackendFailed(ServingError):
    """The model raised while computing this request's batch; other batches are unaffected."""

    status = 500
    outcome = "error"
