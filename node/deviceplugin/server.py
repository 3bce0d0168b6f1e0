"""Serving the plugin's sockets and staying registered with the kubelet.

For each resource an :class:`Endpoint` serves ``DevicePlugin`` on ``<socket-dir>/gpufrag-<kind>
.sock`` and registers it on the kubelet's ``kubelet.sock``. The kubelet dials back during
``Register`` (it asks for the options and opens ListAndWatch), so an endpoint is serving before
it registers.

A kubelet that restarts removes every socket in the directory (its device manager's
``CleanupPluginDirectory``) and creates a new ``kubelet.sock``; a plugin that does not notice
stays invisible until it is restarted. :class:`Supervisor` watches the directory (every
``watch_interval_s``: the identity of ``kubelet.sock`` — inode and change time — and the
presence of the plugin's own sockets) and, on a change, tears the endpoints down, serves fresh
sockets and registers again. Registration that fails (kubelet not up yet, refused) is retried on
the next tick.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
from structlog.typing import FilteringBoundLogger

from gpufrag.probes import Liveness
from node.deviceplugin.api import (
    VERSION,
    RegistrationClient,
    add_device_plugin_service,
    pb,
)
from node.deviceplugin.config import DevicePluginConfig
from node.deviceplugin.metrics import PluginMetrics
from node.deviceplugin.service import OPTIONS, DevicePluginServicer
from node.unixgrpc import listen_unix, stop_unix

# One ListAndWatch stream per registration holds a thread; the rest serve unary calls.
WORKERS_PER_ENDPOINT = 8
# ListAndWatch for shares carries 1000 devices per GPU (~55 bytes each).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class Endpoint:
    """One resource's gRPC server on its unix socket."""

    def __init__(self, servicer: DevicePluginServicer, socket_path: str) -> None:
        self.servicer = servicer
        self.socket_path = socket_path
        self._server: grpc.Server | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=WORKERS_PER_ENDPOINT,
                                       thread_name_prefix=f"dp-{self.servicer.kind.value}"),
            options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        add_device_plugin_service(server, self.servicer)
        listen_unix(server, self.socket_path)
        server.start()
        self._server = server

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving; open ListAndWatch streams are cancelled after ``grace_s``."""
        server, self._server = self._server, None
        stop_unix(server, [self.socket_path], grace_s)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class Supervisor:
    """Keeps every endpoint served and registered across kubelet restarts."""

    def __init__(self, config: DevicePluginConfig, servicers: Sequence[DevicePluginServicer],
                 metrics: PluginMetrics, liveness: Liveness, *,
                 log: FilteringBoundLogger) -> None:
        self._config = config
        self._metrics = metrics
        self._liveness = liveness
        self._log = log
        self.endpoints = [Endpoint(s, config.socket_path(s.kind)) for s in servicers]
        self._registered_with: tuple[int, int] | None = None  # kubelet.sock's identity
        self._registered: set[str] = set()
        self.registrations = 0

    @property
    def ready(self) -> bool:
        return len(self._registered) == len(self.endpoints)

    def tick(self) -> None:
        """One look at the directory; (re)serve and (re)register when needed."""
        self._liveness.tick()
        kubelet = _identity(self._config.kubelet_socket_path)
        ours_gone = any(e.serving and not os.path.exists(e.socket_path) for e in self.endpoints)
        if kubelet is None:
            if self._registered:
                self._log.warning("kubelet_socket_gone", socket=self._config.kubelet_socket_path,
                                  effect="waiting for the kubelet to come back")
                self._unregistered()
            return
        if kubelet == self._registered_with and not ours_gone and self.ready:
            return
        if self._registered_with is not None and (kubelet != self._registered_with or ours_gone):
            self._log.info("kubelet_restarted", socket=self._config.kubelet_socket_path,
                           effect="serving fresh sockets and registering again")
            self._restart_endpoints()
            self._unregistered()
        self._register_all(kubelet)

    def _unregistered(self) -> None:
        for endpoint in self.endpoints:
            self._metrics.registered.labels(endpoint.servicer.resource).set(0)
        self._registered.clear()
        self._registered_with = None

    def _restart_endpoints(self) -> None:
        for endpoint in self.endpoints:
            endpoint.stop()

    def _register_all(self, kubelet: tuple[int, int]) -> None:
        client = RegistrationClient(self._config.kubelet_socket_path)
        try:
            for endpoint in self.endpoints:
                resource = endpoint.servicer.resource
                if resource in self._registered:
                    continue
                if not endpoint.serving or not os.path.exists(endpoint.socket_path):
                    endpoint.stop()
                    endpoint.start()
                request = pb.RegisterRequest(
                    version=VERSION, endpoint=os.path.basename(endpoint.socket_path),
                    resource_name=resource, options=OPTIONS)
                try:
                    client.register(request, timeout_s=self._config.register_timeout_s)
                except grpc.RpcError as exc:
                    self._metrics.registrations.labels(resource, "error").inc()
                    self._log.warning("register_failed", resource=resource,
                                      socket=self._config.kubelet_socket_path,
                                      error=_rpc_message(exc), effect="retrying")
                    continue
                self._registered.add(resource)
                self.registrations += 1
                self._metrics.registrations.labels(resource, "ok").inc()
                self._metrics.registered.labels(resource).set(1)
                self._log.info("registered", resource=resource, endpoint=endpoint.socket_path,
                               kubelet=self._config.kubelet_socket_path)
        finally:
            client.close()
        if self.ready:
            self._registered_with = kubelet

    def run(self, wait: Callable[[float], bool]) -> None:
        """Tick every ``watch_interval_s`` until ``wait`` returns True (stop)."""
        while True:
            try:
                self.tick()
            except Exception:  # a bug in one tick must not end registration
                self._log.exception("supervisor_tick_failed")
            if wait(self._config.watch_interval_s):
                return

    def stop(self) -> None:
        for endpoint in self.endpoints:
            endpoint.stop()
        self._unregistered()


def _rpc_message(exc: grpc.RpcError) -> str:
    details = getattr(exc, "details", None)
    code = getattr(exc, "code", None)
    if callable(details) and callable(code):
        return f"{code().name}: {details()}"
    return str(exc)
