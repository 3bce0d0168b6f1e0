# ruff: noqa
# mypy: ignore-errors
# Generated from pluginregistration/v1/api.proto beside this file, the kubelet's plugin registration API v1 (package pluginregistration, as upstream declares it): a verbatim copy
# of pkg/apis/pluginregistration/v1/api.proto in the Go module k8s.io/kubelet v0.36.3 (the release of
# k8s.io/kubernetes v1.36.3 that devkit/cluster/go.mod pins). No gogo options; used unmodified.
# Command, in node/dra/api, with grpcio-tools 1.85.1 (protoc 35.1, gencode 7.35.1):
#   python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. pluginregistration/v1/api.proto
# then these header lines prepended. tests/node/dra/test_api.py regenerates and compares.
# Do not edit by hand.
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PluginInfo(_message.Message):
    __slots__ = ("type", "name", "endpoint", "supported_versions")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    type: str
    name: str
    endpoint: str
    supported_versions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, type: _Optional[str] = ..., name: _Optional[str] = ..., endpoint: _Optional[str] = ..., supported_versions: _Optional[_Iterable[str]] = ...) -> None: ...

class RegistrationStatus(_message.Message):
    __slots__ = ("plugin_registered", "error")
    PLUGIN_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    plugin_registered: bool
    error: str
    def __init__(self, plugin_registered: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class RegistrationStatusResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
