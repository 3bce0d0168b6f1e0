"""The kubelet's DRA plugin API v1, DRA health API v1alpha1 and plugin registration API v1
over gRPC: typed glue.

The messages are generated from the upstream protos (``dra/v1/api_pb2.py``,
``drahealth/v1alpha1/api_pb2.py`` and ``pluginregistration/v1/api_pb2.py``, committed; their
headers say which version and the command). The services are wired here by hand, as
:mod:`node.deviceplugin.api` does, with the method paths read from the generated descriptors
so they cannot drift from the protos:

- :func:`add_dra_plugin_service` / :func:`add_health_service` /
  :func:`add_registration_service`: what the driver serves;
- :class:`DraPluginClient` / :class:`HealthClient` / :class:`RegistrationClient`: the
  kubelet's side, for tests.

How the kubelet finds a DRA driver (``pkg/kubelet/pluginmanager``, 1.36): it watches
``/var/lib/kubelet/plugins_registry`` for sockets, calls ``Registration.GetInfo`` on each, and
for a ``DRAPlugin`` dials ``PluginInfo.endpoint`` (the driver's own socket, by convention under
``/var/lib/kubelet/plugins/<driver>/``) with the first service in ``supported_versions`` it
speaks; the 1.36 kubelet speaks ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin`` and this driver
offers v1 only. It then reports the outcome through ``NotifyRegistrationStatus``. With the
``ResourceHealthStatus`` gate (KEP-4680, beta and on by default in 1.36) it also calls
``DRAResourceHealth.NodeWatchResources`` on that same endpoint, whatever
``supported_versions`` says, and calls it again 5 s after each stream ends
(``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc

from node.dra.api.dra.v1 import api_pb2 as drapb
from node.dra.api.drahealth.v1alpha1 import api_pb2 as healthpb
from node.dra.api.pluginregistration.v1 import api_pb2 as regpb

# pluginregistration/v1/constants.go and dra/v1/types.go
DRA_PLUGIN_TYPE = "DRAPlugin"
DRA_V1_SERVICE = "v1.DRAPlugin"  # DRAPluginService: what supported_versions names
PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR = "/var/lib/kubelet/plugins"

_DRA = drapb.DESCRIPTOR.services_by_name["DRAPlugin"]
_REG = regpb.DESCRIPTOR.services_by_name["Registration"]
_HEALTH = healthpb.DESCRIPTOR.services_by_name["DRAResourceHealth"]
DRA_PLUGIN = _DRA.full_name  # "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
DRA_HEALTH = _HEALTH.full_name  # "v1alpha1.DRAResourceHealth"
REGISTRATION = _REG.full_name  # "pluginregistration.Registration"


class DraPluginService(Protocol):
    """What a DRA driver serves (``service DRAPlugin`` in dra/v1/api.proto)."""

    def NodePrepareResources(self, request: drapb.NodePrepareResourcesRequest,
                             context: grpc.ServicerContext
                             ) -> drapb.NodePrepareResourcesResponse: ...

    def NodeUnprepareResources(self, request: drapb.NodeUnprepareResourcesRequest,
                               context: grpc.ServicerContext
                               ) -> drapb.NodeUnprepareResourcesResponse: ...


class HealthService(Protocol):
    """What a DRA driver may serve beside it (``service DRAResourceHealth`` in
    drahealth/v1alpha1/api.proto): a server stream of its devices' health."""

    def NodeWatchResources(self, request: healthpb.NodeWatchResourcesRequest,
                           context: grpc.ServicerContext
                           ) -> Iterator[healthpb.NodeWatchResourcesResponse]: ...


class RegistrationService(Protocol):
    """What a plugin serves on its registration socket (pluginregistration/v1/api.proto)."""

    def GetInfo(self, request: regpb.InfoRequest,
                context: grpc.ServicerContext) -> regpb.PluginInfo: ...

    def NotifyRegistrationStatus(self, request: regpb.RegistrationStatus,
                                 context: grpc.ServicerContext
                                 ) -> regpb.RegistrationStatusResponse: ...


def _serve(server: grpc.Server, service: str, methods: set[str],
           handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
    missing = methods - set(handlers)
    assert not missing, f"the proto has methods the glue does not serve: {missing}"
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, handlers)])


def add_dra_plugin_service(server: grpc.Server, service: DraPluginService) -> None:
    _serve(server, DRA_PLUGIN, set(_DRA.methods_by_name), {
        "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
            service.NodePrepareResources, drapb.NodePrepareResourcesRequest.FromString,
            drapb.NodePrepareResourcesResponse.SerializeToString),
        "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
            service.NodeUnprepareResources, drapb.NodeUnprepareResourcesRequest.FromString,
            drapb.NodeUnprepareResourcesResponse.SerializeToString),
    })


def add_health_service(server: grpc.Server, service: HealthService) -> None:
    _serve(server, DRA_HEALTH, set(_HEALTH.methods_by_name), {
        "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
            service.NodeWatchResources, healthpb.NodeWatchResourcesRequest.FromString,
            healthpb.NodeWatchResourcesResponse.SerializeToString),
    })


def add_registration_service(server: grpc.Server, service: RegistrationService) -> None:
    _serve(server, REGISTRATION, set(_REG.methods_by_name), {
        "GetInfo": grpc.unary_unary_rpc_method_handler(
            service.GetInfo, regpb.InfoRequest.FromString, regpb.PluginInfo.SerializeToString),
        "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
            service.NotifyRegistrationStatus, regpb.RegistrationStatus.FromString,
            regpb.RegistrationStatusResponse.SerializeToString),
    })


def _unary(channel: grpc.Channel, service: str, method: str, request: Any,
           response: Any) -> Callable[..., Any]:
    return channel.unary_unary(f"/{service}/{method}",
                               request_serializer=request.SerializeToString,
                               response_deserializer=response.FromString)


class DraPluginClient:
    """A driver's ``DRAPlugin`` service, as the kubelet calls it (tests)."""

    def __init__(self, socket_path: str) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.node_prepare_resources = _unary(
            self._channel, DRA_PLUGIN, "NodePrepareResources",
            drapb.NodePrepareResourcesRequest, drapb.NodePrepareResourcesResponse)
        self.node_unprepare_resources = _unary(
            self._channel, DRA_PLUGIN, "NodeUnprepareResources",
            drapb.NodeUnprepareResourcesRequest, drapb.NodeUnprepareResourcesResponse)

    def close(self) -> None:
        self._channel.close()


class HealthClient:
    """A driver's ``DRAResourceHealth`` service, as the kubelet calls it (tests):
    ``node_watch_resources(request)`` answers an iterator of responses, which ``cancel()``
    ends."""

    def __init__(self, socket_path: str) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.node_watch_resources = self._channel.unary_stream(
            f"/{DRA_HEALTH}/NodeWatchResources",
            request_serializer=healthpb.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=healthpb.NodeWatchResourcesResponse.FromString)

    def close(self) -> None:
        self._channel.close()


class RegistrationClient:
    """A plugin's ``Registration`` service, as the kubelet's plugin watcher calls it (tests)."""

    def __init__(self, socket_path: str) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.get_info = _unary(self._channel, REGISTRATION, "GetInfo", regpb.InfoRequest,
                               regpb.PluginInfo)
        self.notify_registration_status = _unary(
            self._channel, REGISTRATION, "NotifyRegistrationStatus", regpb.RegistrationStatus,
            regpb.RegistrationStatusResponse)

    def close(self) -> None:
        self._channel.close()


__all__ = ["DRA_HEALTH", "DRA_PLUGIN", "DRA_PLUGIN_TYPE", "DRA_V1_SERVICE", "PLUGINS_DIR",
           "PLUGINS_REGISTRY_DIR", "REGISTRATION", "DraPluginClient", "DraPluginService",
           "HealthClient", "HealthService", "RegistrationClient", "RegistrationService",
           "add_dra_plugin_service", "add_health_service", "add_registration_service",
           "drapb", "healthpb", "regpb"]
