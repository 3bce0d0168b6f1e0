"""The kubelet device-plugin API v1beta1 over gRPC: messages, service names and typed glue.

The messages are generated from the upstream ``api.proto`` (``v1beta1/api_pb2.py``, committed;
its header says which version and the command). The two services are wired here by hand rather
than with protoc's ``_pb2_grpc.py``: that file is a table of untyped functions, and the glue it
would hold is a dozen lines — the method paths below are read from the generated descriptor, so
they cannot drift from the proto. What is here:

- :func:`add_device_plugin_service`: serve a :class:`DevicePluginService` on a ``grpc.Server``;
- :class:`RegistrationClient`: the plugin's one call to the kubelet (``Register``);
- :class:`DevicePluginClient`: the kubelet's side of ``DevicePlugin``, for tests and benchmarks;
- :func:`add_registration_service`: a stand-in kubelet ``Registration`` service, for tests.

Constants mirror ``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc

from node.deviceplugin.api.v1beta1 import api_pb2 as pb
from node.unixgrpc import unix_target

# constants.go
VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET = DEVICE_PLUGIN_PATH + "kubelet.sock"
PRE_START_CONTAINER_TIMEOUT_S = 30  # KubeletPreStartContainerRPCTimeoutInSecs
MAX_DEVICE_ID_LENGTH = 63  # api.proto: "Max length of this field is 63 characters"

_SERVICES = pb.DESCRIPTOR.services_by_name
REGISTRATION = _SERVICES["Registration"].full_name  # "v1beta1.Registration"
DEVICE_PLUGIN = _SERVICES["DevicePlugin"].full_name  # "v1beta1.DevicePlugin"


def _path(service: str, method: str) -> str:
    descriptor = _SERVICES[service.rsplit(".", 1)[-1]]
    return f"/{service}/{descriptor.methods_by_name[method].name}"


class DevicePluginService(Protocol):
    """What a device plugin serves (``service DevicePlugin`` in api.proto)."""

    def GetDevicePluginOptions(self, request: pb.Empty,
                               context: grpc.ServicerContext) -> pb.DevicePluginOptions: ...

    def ListAndWatch(self, request: pb.Empty,
                     context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]: ...

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: grpc.ServicerContext
                               ) -> pb.PreferredAllocationResponse: ...

    def Allocate(self, request: pb.AllocateRequest,
                 context: grpc.ServicerContext) -> pb.AllocateResponse: ...

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> pb.PreStartContainerResponse: ...


def add_device_plugin_service(server: grpc.Server, service: DevicePluginService) -> None:
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
            service.GetDevicePluginOptions, pb.Empty.FromString,
            pb.DevicePluginOptions.SerializeToString),
        "ListAndWatch": grpc.unary_stream_rpc_method_handler(
            service.ListAndWatch, pb.Empty.FromString,
            pb.ListAndWatchResponse.SerializeToString),
        "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
            service.GetPreferredAllocation, pb.PreferredAllocationRequest.FromString,
            pb.PreferredAllocationResponse.SerializeToString),
        "Allocate": grpc.unary_unary_rpc_method_handler(
            service.Allocate, pb.AllocateRequest.FromString,
            pb.AllocateResponse.SerializeToString),
        "PreStartContainer": grpc.unary_unary_rpc_method_handler(
            service.PreStartContainer, pb.PreStartContainerRequest.FromString,
            pb.PreStartContainerResponse.SerializeToString),
    }
    missing = set(_SERVICES["DevicePlugin"].methods_by_name) - set(handlers)
    assert not missing, f"api.proto has methods the glue does not serve: {missing}"
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(DEVICE_PLUGIN, handlers)])


RegisterHandler = Callable[[pb.RegisterRequest, grpc.ServicerContext], pb.Empty]


def add_registration_service(server: grpc.Server, register: RegisterHandler) -> None:
    """A ``Registration`` service calling ``register`` (the kubelet's side; for tests)."""
    handler = grpc.unary_unary_rpc_method_handler(register, pb.RegisterRequest.FromString,
                                                  pb.Empty.SerializeToString)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(REGISTRATION, {"Register": handler})])


class RegistrationClient:
    """The kubelet's ``Registration`` service, over its unix socket."""

    def __init__(self, kubelet_socket: str) -> None:
        self._channel = grpc.insecure_channel(unix_target(kubelet_socket))
        self._register = self._channel.unary_unary(
            _path(REGISTRATION, "Register"),
            request_serializer=pb.RegisterRequest.SerializeToString,
            response_deserializer=pb.Empty.FromString)

    def register(self, request: pb.RegisterRequest, *, timeout_s: float) -> None:
        """Raises ``grpc.RpcError`` when the kubelet refuses or cannot be reached.

        Fails fast (``UNAVAILABLE``) when nothing listens on the socket, rather than waiting
        ``timeout_s`` for a kubelet to appear: a dead kubelet leaves its socket behind, and the
        caller retries at its next look anyway (``timeout_s`` bounds a kubelet that accepted
        the connection but does not answer)."""
        self._register(request, timeout=timeout_s, wait_for_ready=False)

    def close(self) -> None:
        self._channel.close()


class DevicePluginClient:
    """A plugin's ``DevicePlugin`` service, as the kubelet calls it (tests, benchmarks)."""

    def __init__(self, plugin_socket: str) -> None:
        self._channel = grpc.insecure_channel(unix_target(plugin_socket))
        c = self._channel
        self.get_device_plugin_options = c.unary_unary(
            _path(DEVICE_PLUGIN, "GetDevicePluginOptions"),
            request_serializer=pb.Empty.SerializeToString,
            response_deserializer=pb.DevicePluginOptions.FromString)
        self.list_and_watch = c.unary_stream(
            _path(DEVICE_PLUGIN, "ListAndWatch"),
            request_serializer=pb.Empty.SerializeToString,
            response_deserializer=pb.ListAndWatchResponse.FromString)
        self.get_preferred_allocation = c.unary_unary(
            _path(DEVICE_PLUGIN, "GetPreferredAllocation"),
            request_serializer=pb.PreferredAllocationRequest.SerializeToString,
            response_deserializer=pb.PreferredAllocationResponse.FromString)
        self.allocate = c.unary_unary(
            _path(DEVICE_PLUGIN, "Allocate"),
            request_serializer=pb.AllocateRequest.SerializeToString,
            response_deserializer=pb.AllocateResponse.FromString)
        self.pre_start_container = c.unary_unary(
            _path(DEVICE_PLUGIN, "PreStartContainer"),
            request_serializer=pb.PreStartContainerRequest.SerializeToString,
            response_deserializer=pb.PreStartContainerResponse.FromString)

    def close(self) -> None:
        self._channel.close()


__all__ = ["DEVICE_PLUGIN", "HEALTHY", "KUBELET_SOCKET", "REGISTRATION", "UNHEALTHY", "VERSION",
           "DevicePluginClient", "DevicePluginService", "RegistrationClient",
           "add_device_plugin_service", "add_registration_service", "pb", "unix_target"]
