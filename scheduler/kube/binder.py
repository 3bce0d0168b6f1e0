"""All of the extender's writes to the cluster, in one place.

Binding a pod is one write: a Binding whose metadata carries the chosen GPUs as an annotation
(the API server copies a Binding's annotations onto the pod in the same update that sets
``spec.nodeName``) and the pod's UID as a precondition. One write rather than an annotation
patch and then a Binding: the pod can never start without its GPU indices, a refused bind leaves
no stale annotation behind, a pod deleted and re-created under the same name is never bound by a
decision made for its predecessor, and each bind costs the API server one update (and every
watcher one event) instead of two.

The Binding goes out as one POST of a body built with orjson (:class:`JsonPoster`), through
urllib3's public pool API with the client configuration's TLS, client certificate, proxy and
bearer token: the Kubernetes client's generated call (argument validation, model sanitising)
cost more CPU than the rest of the bind. At most ``pool_size`` (:data:`BIND_POOL_SIZE`, 16: at
least the server's bind threads, 8 by default) connections are kept, so concurrent binds seldom
open (and throw away) a TLS connection each. Nothing is sent twice: a request written and then
left unanswered is not retried (the server may have applied it); the bind fails as retryable
and kube-scheduler decides. Refusals map through :mod:`scheduler.kube.errors` like every other
API call. (Until this round the connections were opened through urllib3's private
``_new_conn()`` and spoken to with httptools, 0.6% less CPU per pod: not worth a private API.)

``DryRunBinder`` swaps the writer, not the logic: with a snapshot there is no cluster to write
to, so the extender records what it would have done.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

import kubernetes
import orjson
import structlog
import urllib3
from kubernetes.client.exceptions import ApiException

from gpufrag.conventions import KubeNames
from gpufrag.records import gpu_indices_text
from scheduler.kube.errors import ApiError, api_errors

Obj = Mapping[str, Any]
# How the API server words a failed UID precondition (storage preconditions, as a 409).
_UID_PRECONDITION = "Precondition failed: UID in precondition"
# A bind that hangs frees its request thread: (connect, read) seconds. kube-scheduler gives up on
# the extender's answer after its own httpTimeout anyway.
BIND_TIMEOUT_S = (5.0, 30.0)
# How long a bearer token read from the client configuration is used before asking it again.
AUTH_REFRESH_S = 1.0
# Connections kept to the API server for binds: at least the server's request threads.
BIND_POOL_SIZE = 16

log = structlog.get_logger("gpufrag.binder")


class BindError(RuntimeError):
    """A write the API server refused; ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class Binder(Protocol):
    """Reads pods and binds them. The extender reads the pod before a bind only when its cache
    does not hold that very pod (not seen yet, or its UID differs: re-created under the same
    name): the watch's copy keeps ``spec.schedulerName``, which decides whether the extender
    may bind the pod at all (the service account has ``get`` on pods for the reads)."""

    def read_pod(self, namespace: str, name: str) -> Obj | None:
        """The pod as the API server has it now (None when it does not exist)."""
        ...

    def read_node(self, name: str) -> Obj | None:
        """The node as the API server has it now (None when it does not exist); read only when
        a device plugin needs what the node says about its GPUs (HAMi's GPU UUIDs)."""
        ...

    def bind(self, namespace: str, name: str, uid: str, node: str,
             gpus: tuple[int, ...] | None, extra: Mapping[str, str] | None = None) -> None:
        """Bind the pod to ``node``, annotated with ``gpus`` (when not None) and the ``extra``
        annotations (another device plugin's, see ``names.device_plugin``), in one write."""
        ...


def _body(resp: Any) -> bytes:
    """Read a raw (``_preload_content=False``) response to the end, then give its connection
    back: a connection returned with its body unread would hand that body to the next request
    on it as a status line."""
    try:
        data: bytes = resp.data
        return data
    finally:
        resp.release_conn()


def _bind_error(e: ApiError) -> BindError:
    """The one classification (:mod:`scheduler.kube.errors`): 404 gone, 409 changed or already
    bound, 400/422 invalid are permanent; 408, 429, 5xx and no answer may pass on a retry."""
    return BindError(str(e), retryable=e.retryable)


class JsonPoster:
    """POSTs prebuilt JSON bodies to the API server of a ``kubernetes.client.ApiClient``, with
    its configuration (TLS, client certificate, proxy, bearer token, refreshed as the client
    would) and none of its per-call machinery; an answer other than 2xx raises the client's
    own ``ApiException``, so the one mapping in :mod:`scheduler.kube.errors` reads it.

    Each POST goes through urllib3's public pool API (``connection_from_url`` on the client's
    own pool manager, then ``urlopen``), so every TLS and proxy setting of the client means what
    it means to the client, kept connections are checked before reuse, and nothing is resent:
    ``retries=False``. A request written and then left unanswered may have been applied, so the
    bind fails as retryable and kube-scheduler decides. An interim (1xx) answer is not one
    urllib3's HTTP/1.1 layer skips (it takes it for the answer, with the real one still unread
    on the connection): the connection is closed and the bind fails as retryable."""

    def __init__(self, api_client: Any, pool_size: int = BIND_POOL_SIZE) -> None:
        config = api_client.configuration
        self._config = config
        self._base = str(config.host or "").rstrip("/")
        self._manager: Any = api_client.rest_client.pool_manager
        self._pool_size = max(1, pool_size)
        self._pool: Any = None  # made at the first POST: a bad host fails that POST, not start-up
        self._prefix = ""  # the host's path (a server behind a path prefix)
        self._pool_lock = threading.Lock()
        self._auth: tuple[float, dict[str, str]] = (-float("inf"), {})
        self._headers = {**api_client.default_headers, "Accept": "application/json",
                         "Content-Type": "application/json", "User-Agent": api_client.user_agent}

    def _auth_headers(self) -> dict[str, str]:
        """The bearer token's header, asked of the configuration at most every
        :data:`AUTH_REFRESH_S` (its refresh hook re-reads an expiring token — a service
        account's, an exec plugin's — and re-applies the whole kubeconfig each time it is
        asked, which cost more than the rest of the POST)."""
        now = time.monotonic()
        at, headers = self._auth
        if now - at < AUTH_REFRESH_S:
            return headers
        headers = {auth["key"]: auth["value"] for auth in self._config.auth_settings().values()
                   if auth.get("in") == "header" and auth.get("value")}
        self._auth = (now, headers)
        return headers

    def _connection_pool(self) -> Any:
        """One pool of the manager's settings (TLS, client certificate), sized for the bind
        threads; through a proxy, the manager itself, which knows how to reach the server."""
        with self._pool_lock:
            if self._pool is None:
                if self._config.proxy:
                    self._pool = self._manager
                else:
                    self._prefix = (urllib3.util.parse_url(self._base).path or "").rstrip("/")
                    self._pool = self._manager.connection_from_url(
                        self._base, pool_kwargs={"maxsize": self._pool_size})
            return self._pool

    def post(self, path: str, body: bytes, timeout_s: tuple[float, float]) -> bytes:
        """The answer's body; raises ``ApiException`` (a refusal) or ``ConnectionError`` /
        urllib3's errors (no answer)."""
        pool = self._connection_pool()
        target = self._base + path if pool is self._manager else self._prefix + path
        headers = {**self._headers, **self._auth_headers()}
        timeout = urllib3.Timeout(connect=timeout_s[0], read=timeout_s[1])
        try:
            resp = pool.urlopen("POST", target, body=body, headers=headers, timeout=timeout,
                                retries=False, redirect=False, preload_content=False,
                                release_conn=False)
        except urllib3.exceptions.ProtocolError as e:
            raise ConnectionError(_no_answer(e)) from None
        try:
            status = resp.status
            if status < 200:  # an interim answer taken for the answer: the connection is out
                connection = resp.connection  # of step with its requests now (closed before
                if connection is not None:  # reading, which would give it back to the pool)
                    connection.close()
                raise ConnectionError(f"the API server sent an interim answer ({status}) "
                                      "that this client cannot skip; the bind was not confirmed")
            data: bytes = resp.data
        except urllib3.exceptions.ProtocolError as e:
            raise ConnectionError(_no_answer(e)) from None
        finally:
            resp.release_conn()
        if not 200 <= status < 300:
            raise _refusal(status, str(resp.reason or ""), data)
        return data

    def close(self) -> None:
        """Close the kept connections."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None and pool is not self._manager:
            pool.close()


def _no_answer(error: Exception) -> str:
    """Words for a POST that got no (whole) answer: the server closed the connection, or spoke
    something that is not HTTP/1.1."""
    cause = error.args[1] if len(error.args) > 1 else error
    if isinstance(cause, http.client.BadStatusLine) and not isinstance(
            cause, http.client.RemoteDisconnected):
        return f"the API server's answer is not HTTP/1.1: {cause!r}"
    return f"the API server closed the connection without a whole answer: {cause!r}"


def _refusal(status: int, reason: str, body: bytes) -> ApiException:
    """A non-2xx answer as the client's own exception, for :mod:`scheduler.kube.errors`."""
    refusal = ApiException(status=status, reason=reason)
    refusal.body = body.decode("utf-8", "replace")
    return refusal


def binding_body(namespace: str, name: str, uid: str, node: str,
                 annotations: Mapping[str, str]) -> bytes:
    """The Binding of pod ``namespace/name`` to ``node``, as JSON: its UID (when given) as a
    precondition (409 if the pod was re-created meanwhile), ``annotations`` copied onto the
    pod by the API server in the same update."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = dict(annotations)
    return orjson.dumps({"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                         "target": {"apiVersion": "v1", "kind": "Node", "name": node}})


class KubeBinder:
    """Reads through the Kubernetes client (rare: a pod the cache does not hold, a node for
    HAMi); binds through :class:`JsonPoster` (every pod)."""

    def __init__(self, api_client: Any, names: KubeNames, *,
                 pool_size: int = BIND_POOL_SIZE) -> None:
        # Typed as Any: with _preload_content=False the calls return raw responses, not models.
        self.core: Any = kubernetes.client.CoreV1Api(api_client)
        self.poster = JsonPoster(api_client, pool_size)
        self.names = names

    def read_pod(self, namespace: str, name: str) -> Obj | None:
        try:
            with api_errors(f"reading pod {namespace}/{name}"):
                obj: Obj = orjson.loads(_body(self.core.read_namespaced_pod(
                    name, namespace, _preload_content=False)))
        except ApiError as e:
            if e.status == 404:
                return None
            raise _bind_error(e) from None
        except Exception as e:  # a body that is not JSON, a client-side fault
            raise BindError(f"reading pod {namespace}/{name}: {e!r}", retryable=True) from None
        return obj

    def read_node(self, name: str) -> Obj | None:
        try:
            with api_errors(f"reading node {name}"):
                obj: Obj = orjson.loads(_body(self.core.read_node(name, _preload_content=False)))
        except ApiError as e:
            if e.status == 404:
                return None
            raise _bind_error(e) from None
        except Exception as e:
            raise BindError(f"reading node {name}: {e!r}", retryable=True) from None
        return obj

    def bind(self, namespace: str, name: str, uid: str, node: str,
             gpus: tuple[int, ...] | None, extra: Mapping[str, str] | None = None) -> None:
        annotations = dict(extra or {})
        if gpus is not None:
            annotations[self.names.annotation_gpu_indices] = gpu_indices_text(gpus)
        body = binding_body(namespace, name, uid, node, annotations)
        path = (f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
                "/binding")
        try:
            with api_errors(f"binding pod {namespace}/{name} to {node}"):
                self.poster.post(path, body, BIND_TIMEOUT_S)
        except ApiError as e:
            refusal = _bind_error(e)
            if e.status == 409 and uid and _UID_PRECONDITION in str(refusal):
                raise BindError(f"pod {namespace}/{name} is not the pod to bind: its UID is "
                                f"no longer {uid} (re-created under the same name)",
                                retryable=False) from None
            raise refusal from None
        except Exception as e:
            raise BindError(f"binding pod {namespace}/{name} to {node}: {e!r}",
                            retryable=True) from None


@dataclass(frozen=True, slots=True)
class BindCall:
    namespace: str
    name: str
    uid: str
    node: str
    gpus: tuple[int, ...] | None
    extra: Mapping[str, str] = field(default_factory=dict)


class DryRunBinder:
    """Records and logs binds instead of writing (snapshot mode); reads from a fixed set."""

    def __init__(self, pods: Mapping[str, Obj] | None = None,
                 nodes: Mapping[str, Obj] | None = None) -> None:
        self.pods = dict(pods or {})
        self.nodes = dict(nodes or {})
        self.calls: list[BindCall] = []

    def read_pod(self, namespace: str, name: str) -> Obj | None:
        return self.pods.get(f"{namespace}/{name}")

    def read_node(self, name: str) -> Obj | None:
        return self.nodes.get(name)

    def bind(self, namespace: str, name: str, uid: str, node: str,
             gpus: tuple[int, ...] | None, extra: Mapping[str, str] | None = None) -> None:
        self.calls.append(BindCall(namespace, name, uid, node, gpus, dict(extra or {})))
        log.info("dry run: would bind", pod=f"{namespace}/{name}", node=node,
                 gpus=gpu_indices_text(gpus) if gpus is not None else None)


# A hung Event write frees the writer thread: (connect, read) seconds.
EVENT_WRITE_TIMEOUT_S = (5.0, 10.0)


class KubeEventWriter:
    """Creates Events through the Kubernetes API, each call bounded by
    :data:`EVENT_WRITE_TIMEOUT_S`."""

    def __init__(self, api_client: Any) -> None:
        # Typed as Any: with _preload_content=False the calls return raw responses.
        self.core: Any = kubernetes.client.CoreV1Api(api_client)

    def __call__(self, namespace: str, body: dict[str, Any]) -> None:
        resp = self.core.create_namespaced_event(namespace, body, _preload_content=False,
                                                 _request_timeout=EVENT_WRITE_TIMEOUT_S)
        try:
            resp.data  # noqa: B018  (read to the end before the connection goes back)
        finally:
            resp.release_conn()



__all__ = ["AUTH_REFRESH_S", "BIND_POOL_SIZE", "BIND_TIMEOUT_S", "EVENT_WRITE_TIMEOUT_S",
           "BindCall", "BindError", "Binder", "DryRunBinder", "JsonPoster", "KubeBinder",
           "KubeEventWriter", "binding_body", "gpu_indices_text"]
