"""All of the extender's writes to the cluster, in one place.

Binding a pod is one write: a Binding whose metadata carries the chosen GPUs as an annotation
(the API server copies a Binding's annotations onto the pod in the same update that sets
``spec.nodeName``) and the pod's UID as a precondition. One write rather than an annotation
patch and then a Binding: the pod can never start without its GPU indices, a refused bind leaves
no stale annotation behind, a pod deleted and re-created under the same name is never bound by a
decision made for its predecessor, and each bind costs the API server one update (and every
watcher one event) instead of two.

The Binding goes out as one POST of a body built with orjson (:class:`JsonPoster`), with the
client configuration's TLS, client certificate, proxy and bearer token: the Kubernetes client's
generated call (argument validation, model sanitising, its REST layer) cost more CPU than the
rest of the bind. Each connection is opened by urllib3 (so every TLS setting of the client
configuration means what it means to the client), then kept alive and spoken to directly: the
request written as bytes, the answer read with httptools. urllib3's request path (its pool,
http.client's response and header parsing) cost 144 µs of CPU per POST against a local TLS
server, this one 33 µs (docs/extender.md). The idle connections kept are at most ``pool_size``
(:data:`BIND_POOL_SIZE`, 16: at least the server's bind threads, 8 by default), so concurrent
binds seldom open (and throw away) a TLS connection each. A kept connection is checked before
it is reused, as urllib3 does (one the server closed is readable: dropped, with every other kept
one); a POST is sent again, on a new connection, only when writing it found the kept connection
closed, so the server never read it. A request written and then left unanswered is not sent
again (the server may have applied it): the bind fails as retryable and kube-scheduler decides.
Through a proxy, binds take urllib3's whole path. Refusals map through
:mod:`scheduler.kube.errors` like every other API call.

``DryRunBinder`` swaps the writer, not the logic: with a snapshot there is no cluster to write
to, so the extender records what it would have done.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

import httptools
import kubernetes
import orjson
import structlog
import urllib3
from kubernetes.client.exceptions import ApiException
from urllib3.util.wait import wait_for_read

from gpufrag.conventions import KubeNames
from gpufrag.http1 import reason_phrase
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
# One read of an answer (a Binding's is ~200 bytes; a refusal's message a few KB).
_READ_BYTES = 65536

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


class _Reply:
    """httptools' callbacks for one answer; interim (1xx) answers before it are skipped."""

    __slots__ = ("body", "done", "framed", "headers_done", "interim", "keep", "parser")

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.done = False
        self.keep = False
        self.framed = False  # a Content-Length or Transfer-Encoding: the end is known
        self.headers_done = False
        self.interim = False
        self.parser: Any = None

    def on_header(self, name: bytes, _value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # 100 Continue, 103 Early Hints: not it
            self.interim = True
            return
        # (read here: once the message is complete, llhttp has reset what it knew)
        self.keep = bool(self.parser.should_keep_alive())
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if not self.interim:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.interim:  # the final answer follows on the same connection
            self.interim = False
            self.framed = False
            return
        self.done = True


class _Stale(ConnectionError):
    """A kept connection the server had closed before reading the request."""


class _Wire:
    """One connection to the API server, opened by urllib3 and then used directly."""

    __slots__ = ("conn", "sock", "used")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sock: Any = conn.sock
        self.used = False

    def dropped(self) -> bool:
        """Whether the server has closed this idle connection (it is readable: an EOF, a
        reset, or bytes nobody asked for), the check urllib3 makes before reusing one."""
        try:
            return bool(wait_for_read(self.sock, timeout=0.0))
        except OSError:
            return True

    def exchange(self, request: bytes, read_timeout_s: float) -> tuple[int, bytes, bool]:
        """Write ``request``; the answer's status, body and whether the connection may be
        kept. Raises :class:`_Stale` only when the write itself found a kept connection
        closed: the server cannot have read the request then. Anything later (no answer,
        a reset) may follow a request the server applied, so it is not retried here."""
        sock = self.sock
        sock.settimeout(read_timeout_s)
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError) as e:
            if self.used:
                raise _Stale(str(e)) from None
            raise
        reply = _Reply()
        parser = reply.parser = httptools.HttpResponseParser(reply)
        got = 0
        try:
            while not reply.done:
                data = sock.recv(_READ_BYTES)
                if not data:
                    if reply.headers_done and not reply.framed:  # the body ends at the close
                        reply.keep = False
                        break
                    raise ConnectionError("the API server closed the connection "
                                          + ("mid-answer" if got else "without answering"))
                got += len(data)
                parser.feed_data(data)
        except httptools.HttpParserError as e:
            raise ConnectionError(f"the API server's answer is not HTTP/1.1: {e}") from None
        self.used = True
        body = reply.body[0] if len(reply.body) == 1 else b"".join(reply.body)
        return parser.get_status_code(), body, reply.keep

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class JsonPoster:
    """POSTs prebuilt JSON bodies to the API server of a ``kubernetes.client.ApiClient``, with
    its configuration (TLS, client certificate, proxy, bearer token, refreshed as the client
    would) and none of its per-call machinery; an answer other than 2xx raises the client's
    own ``ApiException``, so the one mapping in :mod:`scheduler.kube.errors` reads it."""

    def __init__(self, api_client: Any, pool_size: int = BIND_POOL_SIZE) -> None:
        config = api_client.configuration
        self._config = config
        self._base = str(config.host or "").rstrip("/")
        self._manager: Any = api_client.rest_client.pool_manager
        self._pool_size = max(1, pool_size)
        self._pool: Any = None  # made at the first POST: a bad host fails that POST, not start-up
        self._prefix = ""  # the host's path (a server behind a path prefix)
        self._host_line = b""
        self._pool_lock = threading.Lock()
        self._idle: list[_Wire] = []  # kept connections, the most recently used last
        self._auth: tuple[float, dict[str, str]] = (-float("inf"), {})
        self._head: tuple[dict[str, str], bytes] = ({}, b"")
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
        """One pool of the manager's settings (TLS, client certificate), sized for the threads;
        it opens the connections."""
        with self._pool_lock:
            if self._pool is None:
                url = urllib3.util.parse_url(self._base)
                self._prefix = (url.path or "").rstrip("/")
                self._host_line = f"Host: {url.netloc}\r\n".encode("latin-1")
                self._pool = self._manager.connection_from_url(
                    self._base, pool_kwargs={"maxsize": self._pool_size})
            return self._pool

    def _header_block(self) -> bytes:
        """Every header but Content-Length, as bytes (built again when the token changes)."""
        auth = self._auth_headers()
        cached_auth, block = self._head
        if auth is not cached_auth:
            headers = {**self._headers, **auth}
            block = self._host_line + b"".join(
                f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items())
            self._head = (auth, block)
        return block

    def _take(self, connect_timeout_s: float, *, fresh: bool = False) -> _Wire:
        """A kept connection the server has not closed, or (``fresh``, or none left) a new
        one opened by urllib3 with the pool's TLS settings (the pool :meth:`post` made)."""
        while not fresh:
            with self._pool_lock:
                wire = self._idle.pop() if self._idle else None
            if wire is None:
                break
            if not wire.dropped():
                return wire
            wire.close()
        conn = self._pool._new_conn()  # urllib3's own, with the pool's TLS settings
        conn.timeout = connect_timeout_s
        conn.connect()
        return _Wire(conn)

    def _drop_idle(self) -> None:
        """Close every kept connection (one found closed by the server: the others, kept as
        long, most likely are too)."""
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for wire in idle:
            wire.close()

    def _keep(self, wire: _Wire) -> None:
        with self._pool_lock:
            if len(self._idle) < self._pool_size:
                self._idle.append(wire)
                return
        wire.close()

    def post(self, path: str, body: bytes, timeout_s: tuple[float, float]) -> bytes:
        """The answer's body; raises ``ApiException`` (a refusal) or ``OSError`` / urllib3's
        errors (no answer)."""
        if self._config.proxy:  # through a proxy, the manager decides how to reach the server
            return self._post_via_manager(path, body, timeout_s)
        if self._pool is None:
            self._connection_pool()
        request = (b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
            (self._prefix + path).encode("latin-1"), self._header_block(), len(body), body))
        for attempt in (1, 2):
            wire = self._take(timeout_s[0], fresh=attempt == 2)
            try:
                status, data, keep = wire.exchange(request, timeout_s[1])
            except _Stale:
                wire.close()
                self._drop_idle()
                if attempt == 1:
                    continue  # never read: safe to send again, on a new connection
                raise
            except BaseException:
                wire.close()
                raise
            if keep:
                self._keep(wire)
            else:
                wire.close()
            break
        if not 200 <= status < 300:
            raise _refusal(status, reason_phrase(status, unknown=""), data)
        return data

    def _post_via_manager(self, path: str, body: bytes, timeout_s: tuple[float, float]) -> bytes:
        headers = {**self._headers, **self._auth_headers()}
        timeout = urllib3.Timeout(connect=timeout_s[0], read=timeout_s[1])
        resp = self._manager.urlopen("POST", self._base + path, body=body, headers=headers,
                                     timeout=timeout, redirect=False)
        data: bytes = resp.data
        if not 200 <= resp.status < 300:
            raise _refusal(resp.status, resp.reason, data)
        return data

    def close(self) -> None:
        """Close the kept connections."""
        self._drop_idle()


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
