"""The DRA driver's settings: one frozen dataclass, validated once at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpufrag.conventions import dns_subdomain_problem
from gpufrag.errors import BadInput
from node.daemon import check_node_name
from node.dra.api import PLUGINS_DIR, PLUGINS_REGISTRY_DIR
from node.dra.slices import slice_name
from node.gpus import CONTROL_DEVICES, check_grant_settings
from node.health import DEFAULT_HEALTH_INTERVAL_S
from scheduler.kube.claims import DRIVER_NAME

__all__ = ["DRIVER_NAME", "DraConfig"]
# CDI's kind (vendor/class) of the devices this driver writes; CDI device IDs are
# "<kind>=<name>". Runtimes read specs from /etc/cdi and /var/run/cdi by default.
CDI_KIND = "gpufrag.io/gpu"
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_METRICS_PORT = 9403  # beside the device plugin's 9402
SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; grpc needs the whole path in it


@dataclass(frozen=True, slots=True)
class DraConfig:
    """``gpufrag dra-plugin`` settings; :meth:`validate` names the field to fix."""

    node_name: str
    driver_name: str = DRIVER_NAME
    registry_dir: str = PLUGINS_REGISTRY_DIR  # the kubelet watches it for registration sockets
    plugins_dir: str = PLUGINS_DIR  # the driver's own socket lives in <plugins_dir>/<driver>/
    cdi_dir: str = DEFAULT_CDI_DIR
    mps: bool = False  # set CUDA_MPS_* limits for shares (an MPS control daemon runs)
    mps_pipe_dir: str = ""  # host dir of the MPS pipes, mounted into share containers
    dev_root: str = "/dev"  # where the driver sees the host's device nodes
    control_devices: tuple[str, ...] = CONTROL_DEVICES
    publish_interval_s: float = 30.0  # how often the slice is checked against the API
    health_interval_s: float = DEFAULT_HEALTH_INTERVAL_S  # how often each GPU's health is read

    @property
    def registration_socket_path(self) -> str:
        return os.path.join(self.registry_dir, f"{self.driver_name}-reg.sock")

    @property
    def plugin_socket_path(self) -> str:
        return os.path.join(self.plugins_dir, self.driver_name, "dra.sock")

    @property
    def partitions_dir(self) -> str:
        """Where the MIG instances made for each claim are recorded (node.dra.partitions):
        beside the socket, on the host, so a restarted driver finds them."""
        return os.path.join(self.plugins_dir, self.driver_name, "partitions")

    def validate(self) -> DraConfig:
        check_node_name(self.node_name)
        problem = dns_subdomain_problem(self.driver_name)
        if problem is not None or len(self.driver_name) > 63:  # DriverNameMaxLength
            raise BadInput(f"{self.driver_name!r} is not a DRA driver name (a DNS subdomain of "
                           f"at most 63 characters): {problem or 'too long'}",
                           field="driver_name")
        name = slice_name(self.node_name, self.driver_name)
        if dns_subdomain_problem(name) is not None:
            raise BadInput(f"the slice name {name!r} (<node>-<driver>) is longer than an object "
                           f"name may be (253); choose a shorter --driver-name",
                           field="driver_name")
        for name, path in (("registry_dir", self.registry_dir),
                           ("plugins_dir", self.plugins_dir), ("cdi_dir", self.cdi_dir)):
            if not os.path.isabs(path):
                raise BadInput(f"{path!r} must be an absolute directory", field=name)
        for name, path in (("registry_dir", self.registration_socket_path),
                           ("plugins_dir", self.plugin_socket_path)):
            if len(path) > SOCKET_PATH_MAX:
                raise BadInput(f"{path!r} is too long for a unix socket path "
                               f"({len(path)} > {SOCKET_PATH_MAX} bytes)", field=name)
        check_grant_settings(self)
        for name, value in (("publish_interval_s", self.publish_interval_s),
                            ("health_interval_s", self.health_interval_s)):
            if not value > 0:
                raise BadInput(f"{value} must be > 0 seconds", field=name)
        return self
