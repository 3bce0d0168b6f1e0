"""The device plugin's settings: one frozen dataclass, validated once at start-up.

Everything the hot path (Allocate) reads is settled here, so it never re-checks a flag. The
resource names come from the shared names section (:class:`gpufrag.conventions.KubeNames`), so
a remap set once for the extender applies here too.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from enum import Enum

from gpufrag.conventions import (
    ANNOTATION_GPU_ALLOCATED,
    DEFAULT_NAMES,
    KubeNames,
    qualified_name_problem,
)
from gpufrag.errors import BadInput
from node.daemon import check_node_name
from node.gpus import CONTROL_DEVICES, check_grant_settings
from node.health import DEFAULT_HEALTH_INTERVAL_S

DEFAULT_SOCKET_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_KUBELET_SOCKET = "kubelet.sock"
DEFAULT_WATCH_INTERVAL_S = 1.0
DEFAULT_METRICS_PORT = 9402  # beside the agent's 9401 and DCGM's 9400


class Kind(Enum):
    """Which resource a plugin endpoint serves."""

    WHOLE = "whole"  # names.gpu (nvidia.com/gpu): one device per GPU, its ID the GPU's UUID
    SHARE = "share"  # names.gpu_milli (gpufrag.io/gpu-milli): 1000 devices per GPU


@dataclass(frozen=True, slots=True)
class DevicePluginConfig:
    """``gpufrag device-plugin`` settings; :meth:`validate` names the field to fix."""

    node_name: str
    socket_dir: str = DEFAULT_SOCKET_DIR
    kubelet_socket: str = DEFAULT_KUBELET_SOCKET  # a file name in socket_dir
    kinds: tuple[Kind, ...] = (Kind.WHOLE, Kind.SHARE)
    health_interval_s: float = DEFAULT_HEALTH_INTERVAL_S
    watch_interval_s: float = DEFAULT_WATCH_INTERVAL_S
    register_timeout_s: float = 10.0
    mps: bool = False  # set CUDA_MPS_* limits for shares (an MPS control daemon runs)
    mps_pipe_dir: str = ""  # host dir of the MPS pipes, mounted into share containers
    dev_root: str = "/dev"  # where the plugin sees the host's device nodes
    # A whole-GPU pod with no gpu-indices record (placed by another scheduler, or by
    # gpufrag-scheduler without bind) gets the devices the kubelet chose; off: it is refused.
    kubelet_fallback: bool = True
    control_devices: tuple[str, ...] = CONTROL_DEVICES
    # The node agent and gpufrag inspect read the default key (gpufrag.conventions) only.
    annotation_allocated: str = ANNOTATION_GPU_ALLOCATED
    names: KubeNames = field(default_factory=lambda: DEFAULT_NAMES)

    def resource(self, kind: Kind) -> str:
        return self.names.gpu if kind is Kind.WHOLE else self.names.gpu_milli

    def socket_name(self, kind: Kind) -> str:
        return f"gpufrag-{kind.value}.sock"

    def socket_path(self, kind: Kind) -> str:
        return os.path.join(self.socket_dir, self.socket_name(kind))

    @property
    def kubelet_socket_path(self) -> str:
        return os.path.join(self.socket_dir, self.kubelet_socket)

    def validate(self) -> DevicePluginConfig:
        check_node_name(self.node_name)
        if not os.path.isabs(self.socket_dir):
            raise BadInput(f"{self.socket_dir!r} must be an absolute directory (the kubelet "
                           f"names plugin sockets relative to it)", field="socket_dir")
        if not self.kubelet_socket or "/" in self.kubelet_socket:
            raise BadInput(f"{self.kubelet_socket!r} must be a file name inside socket_dir",
                           field="kubelet_socket")
        if not self.kinds or len(set(self.kinds)) != len(self.kinds):
            raise BadInput("choose 'whole', 'share' or both, each once", field="resources")
        for name, value in (("health_interval_s", self.health_interval_s),
                            ("watch_interval_s", self.watch_interval_s),
                            ("register_timeout_s", self.register_timeout_s)):
            if not value > 0:
                raise BadInput(f"{value} must be > 0 seconds", field=name)
        # sun_path is 108 bytes; grpc needs the whole path in it.
        longest = max(len(self.socket_path(kind)) for kind in self.kinds)
        if longest > 100:
            raise BadInput(f"{self.socket_dir!r} is too long for a unix socket path "
                           f"(plugin socket path {longest} > 100 bytes)", field="socket_dir")
        check_grant_settings(self)
        problem = qualified_name_problem(self.annotation_allocated)
        if problem is not None:
            raise BadInput(problem, field="annotation_allocated")
        for kind in self.kinds:
            # The kubelet refuses a resource outside the default namespace (no "/").
            if "/" not in self.resource(kind):
                raise BadInput(f"{self.resource(kind)!r} is not an extended resource name "
                               f"(domain/name)", field=f"names.{_name_field(kind)}")
        return self

    def require_paths(self) -> DevicePluginConfig:
        """Check, at start, that the directories exist (``validate`` checks only their form).

        Missing directories are not waited for: the kubelet makes its device-plugin directory
        before any DaemonSet pod runs, so a missing one is a wrong mount or flag, and a plugin
        retrying for ever would hide it behind a pod that looks alive."""
        for name, path, what in (("socket_dir", self.socket_dir, "the kubelet's device-plugin "
                                  "directory (hostPath /var/lib/kubelet/device-plugins)"),
                                 ("dev_root", self.dev_root, "where the host's /dev is seen")):
            if not os.path.isdir(path):
                raise BadInput(f"{path!r} is not a directory; it must be {what}", field=name)
        return self

    def with_names(self, names: KubeNames) -> DevicePluginConfig:
        return dataclasses.replace(self, names=names)


def _name_field(kind: Kind) -> str:
    return "gpu" if kind is Kind.WHOLE else "gpu_milli"


def parse_kinds(text: str) -> tuple[Kind, ...]:
    """``"whole,share"`` -> kinds; a bad word is :class:`BadInput` naming the choices."""
    kinds = []
    for word in (w.strip() for w in text.split(",")):
        try:
            kinds.append(Kind(word))
        except ValueError:
            raise BadInput(f"{word!r}: choose from whole (the whole-GPU resource), share "
                           f"(the milli-GPU resource), comma-separated",
                           field="resources") from None
    return tuple(kinds)
