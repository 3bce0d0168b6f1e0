"""Fixtures for the tests on a real node: a kubelet (and containerd + runc, or upstream's fake
CRI where this machine cannot run containers) registered with its own control plane.

The control plane here does not complete pods (``complete_pods=False``): the kubelet does. One
node per machine (the kubelet's device-plugin socket path is machine-wide), so these fixtures are
module-scoped and the node is started once per module.

Fixtures:
- ``node_plane`` (module): a :class:`devkit.controlplane.ControlPlane` with no pod completer.
- ``node`` (module): a started :class:`devkit.node.Node` named ``node-0``; its runtime is
  ``GPUFRAG_NODE_RUNTIME`` (auto, containerd or fake; default auto) and is printed.
- ``node_namespace`` (function): a fresh namespace on that plane, deleted after.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import kubernetes
import pytest

from devkit.build import BuildError, build_control_plane
from devkit.controlplane import ControlPlane
from devkit.node import Node
from devkit.procs import ControlPlaneError

RUNTIME_ENV = "GPUFRAG_NODE_RUNTIME"


@pytest.fixture(scope="module")
def node_plane() -> Iterator[ControlPlane]:
    try:
        binary = build_control_plane()
    except BuildError as exc:
        pytest.fail(f"the control plane and kubelet could not be built:\n{exc}")
    try:
        with ControlPlane(binary, complete_pods=False) as plane:
            yield plane
    except ControlPlaneError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def node(node_plane: ControlPlane) -> Iterator[Node]:
    if os.geteuid() != 0:
        pytest.skip("a real node (kubelet, containerd, cgroups) needs root")
    n = Node(node_plane, "node-0", runtime=os.environ.get(RUNTIME_ENV, "auto"))
    try:
        n.start()
    except ControlPlaneError as exc:
        pytest.fail(str(exc))
    print(f"\nnode {n.name}: runtime {n.runtime} {n.runtime_note}; Ready in {n.startup_s:.1f}s")
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture
def node_namespace(node_plane: ControlPlane) -> Iterator[str]:
    name = node_plane.create_namespace(f"node-{uuid.uuid4().hex[:8]}")
    yield name
    core = kubernetes.client.CoreV1Api(node_plane.api_client())
    core.delete_namespace(name, grace_period_seconds=0)
