"""The driver's two unix sockets, served by one gRPC server.

The plugin socket (``<plugins_dir>/<driver>/dra.sock``) serves the DRA plugin service and,
beside it, the DRA health service (:mod:`node.dra.health`; the kubelet calls both on the
endpoint it dialled); the registration socket (``<registry_dir>/<driver>-reg.sock``) serves
``Registration``. One server serves both sockets, so the endpoint GetInfo names answers from
the moment the kubelet's plugin watcher can see the registration socket. Stopping removes
both sockets: the kubelet takes a vanished registration socket as the driver leaving.
"""

from __future__ import annotations

import os
from concurrent import futures

import grpc

from node.dra.api import add_dra_plugin_service, add_health_service, add_registration_service
from node.dra.config import DraConfig
from node.dra.health import HealthServicer
from node.dra.service import DraPluginServicer, RegistrationServicer
from node.unixgrpc import listen_unix, stop_unix

WORKERS = 8


class DriverServer:
    """Serves :class:`DraPluginServicer`, :class:`HealthServicer` (when given) and
    :class:`RegistrationServicer` (module docstring)."""

    def __init__(self, config: DraConfig, plugin: DraPluginServicer,
                 registration: RegistrationServicer,
                 health: HealthServicer | None = None) -> None:
        self._paths = (config.plugin_socket_path, config.registration_socket_path)
        self._plugin = plugin
        self._registration = registration
        self._health = health
        self._server: grpc.Server | None = None

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS,
                                                        thread_name_prefix="dra"))
        add_dra_plugin_service(server, self._plugin)
        if self._health is not None:
            add_health_service(server, self._health)
        add_registration_service(server, self._registration)
        for path in self._paths:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            listen_unix(server, path)
        server.start()
        self._server = server

    def stop(self, grace_s: float = 1.0) -> None:
        server, self._server = self._server, None
        stop_unix(server, reversed(self._paths), grace_s)
