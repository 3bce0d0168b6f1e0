"""Fixtures for the tests on a real node: a kubelet (and containerd + runc, or upstream's fake
CRI where this machine cannot run containers) registered with its own control plane.

The control plane here does not complete pods (``complete_pods=False``): the kubelet does. One
node per machine (the kubelet's device-plugin socket path is machine-wide), so the plane and the
node are session-scoped: started once for all the node's test modules.

Fixtures:
- ``node_plane`` (session): a :class:`devkit.controlplane.ControlPlane` with no pod completer.
- ``node`` (session): a started :class:`devkit.node.Node` named ``node-0``; its runtime is
  ``GPUFRAG_NODE_RUNTIME`` (auto, containerd or fake; default auto) and is printed.
- ``node_namespace`` (function): a fresh namespace on that plane; deleted after, and waited
  for until its pods are gone from the node, so the next test finds the GPUs free.
- ``device_plugin`` (function): ``gpufrag device-plugin`` on recorded NVML readings (two A100s,
  ``GPU_UUIDS``), yielded once it has registered both resources with the node's kubelet (its
  log says so: :func:`wait_registered`); its log's path.
- ``gpufrag_image`` (session): the project's image built here (``devkit.image``: mmdebstrap base
  + buildah, cached) and imported into the node's containerd (``Node.import_project_image``,
  as ``gpufrag dev-cluster up --node`` does); its reference.
- :data:`GPU_ENV_COMMAND` / :func:`container_environment`: a container command that prints its
  GPU environment, and what it printed (its log), for the tests of what a container is given.
- ``node_manifests`` (session): a function rendering a kustomization of ``manifests/`` (e.g.
  ``"overlays/production"``) by kubectl's kustomize with the images replaced by the node's (the
  project's image, the plane's kube-scheduler) and ``imagePullPolicy: Never`` everywhere: the
  node never pulls. ``base_manifests`` (session): ``manifests/base`` rendered so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from devkit.build import BuildError, build_control_plane
from devkit.controlplane import ControlPlane
from devkit.image import ImageBuildError
from devkit.node import Node
from devkit.procs import ComponentProcess, ControlPlaneError, wait_until
from tests import skips
from tests.records import publish_test_key

RUNTIME_ENV = "GPUFRAG_NODE_RUNTIME"
# The device plugin's recorded GPUs (two A100s).
GPU_UUIDS = ["GPU-6f1c1d3e-0000-4000-8000-000000000000", "GPU-6f1c1d3e-0000-4000-8000-000000000001"]
MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"
# The last line GPU_ENV_COMMAND prints: the environment before it is all in the log.
ENV_PRINTED = "gpufrag-env-printed"
# A container command printing the GPU environment it was given (the device plugin's or the
# DRA driver's CDI edits), then staying up.
GPU_ENV_COMMAND = ("env | grep -e NVIDIA_ -e GPUFRAG_ -e CUDA_MPS_ | sort; "
                   f"echo {ENV_PRINTED}; sleep 3600")


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def node(node_plane: ControlPlane) -> Iterator[Node]:
    if os.geteuid() != 0:
        skips.skip(skips.NOT_ROOT, "a real node: kubelet, containerd, cgroups")
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
    node_plane.delete_namespace(name)


def require_containers(node: Node) -> None:
    """Tests of the image need containers that really run."""
    if node.runtime != "containerd":
        skips.skip(skips.NO_CONTAINERS, f"the image runs only where containers run; this node "
                   f"has the {node.runtime} runtime "
                   f"({node.runtime_note or RUNTIME_ENV + ' chose it'})")


@pytest.fixture(scope="session")
def gpufrag_image(node: Node) -> str:
    require_containers(node)
    try:
        built, import_s = node.import_project_image()  # what 'dev-cluster up --node' runs
    except ImageBuildError as exc:
        pytest.fail(f"the project's image could not be built:\n{exc}")
    print(f"\nimage {built.ref}: {'built' if built.cold else 'cached'} in {built.seconds:.1f}s, "
          f"{built.size_bytes / 2**20:.0f} MiB; imported in {import_s:.1f}s (containerd's "
          f"store is kept in {node.containerd_root})")
    return built.ref


Render = Callable[[str], list[dict[str, Any]]]


@pytest.fixture(scope="session")
def node_manifests(node_plane: ControlPlane, node: Node, gpufrag_image: str,
                   tmp_path_factory: pytest.TempPathFactory) -> Render:
    """``render("base")``, ``render("overlays/production")``: that kustomization of
    manifests/ with the node's images, through an overlay of its own."""
    scheduler_image = node.import_kube_scheduler_image()
    images = []
    for shipped, local in ((_shipped_image("gpufrag"), gpufrag_image),
                           (_shipped_image("kube-scheduler"), scheduler_image)):
        name, tag = local.rsplit(":", 1)
        images.append({"name": shipped, "newName": name, "newTag": tag})

    def render(path: str) -> list[dict[str, Any]]:
        overlay = tmp_path_factory.mktemp("node-overlay")
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(MANIFESTS / path, overlay)], "images": images}))
        docs = [d for d in yaml.safe_load_all(
            node_plane.kubectl("kustomize", str(overlay)).stdout) if d]
        for doc in docs:
            for container in _containers(doc):
                container["imagePullPolicy"] = "Never"
        return docs

    return render


@pytest.fixture(scope="session")
def base_manifests(node_manifests: Render) -> list[dict[str, Any]]:
    return node_manifests("base")


def _shipped_image(name: str) -> str:
    """What manifests/base's kustomization turns the image ``name`` into."""
    kustomization = yaml.safe_load((MANIFESTS / "base" / "kustomization.yaml").read_text())
    entry = next(i for i in kustomization["images"] if i["name"] == name)
    return str(entry["newName"])


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec") or {}
    template = (spec.get("jobTemplate", {}).get("spec", spec)).get("template") or {}
    pod = template.get("spec") or {}
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def container_environment(node: Node, namespace: str, pod: str,
                          container: str = "main") -> dict[str, str]:
    """The variables a container running :data:`GPU_ENV_COMMAND` printed, from its log (the
    kubelet's CRI log file: containerd runs it for real)."""
    def printed() -> str | None:
        log = node.container_log(namespace, pod, container)
        return log if ENV_PRINTED in log else None

    log = wait_until(printed, timeout_s=20, what=f"pod {pod}'s environment in its log")
    found = {}
    for line in log.splitlines():
        # CRI log lines: "<time> stdout F <text>".
        text = line.split(" ", 3)[-1]
        key, sep, value = text.partition("=")
        if sep:
            found[key] = value
    return found


def logged_events(log: Path, event: str) -> int:
    """How many times a component logging JSON lines logged ``event``."""
    count = 0
    for line in log.read_text(errors="replace").splitlines():
        try:
            count += json.loads(line).get("event") == event
        except (ValueError, AttributeError):
            continue
    return count


def wait_registered(log: Path, process: subprocess.Popen[bytes], *, before: int = 0,
                    timeout_s: float = 60.0) -> None:
    """Until a device plugin logging to ``log`` has registered both of its resources (whole
    GPUs and shares) with the kubelet ``before`` + 2 times: what every admission of a GPU pod
    relies on. The Node's allocatable may still show a previous plugin's devices until the
    kubelet's next status update, so it is no sign of this plugin's registration."""
    def registered() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the device plugin exited ({process.returncode}):\n"
                                 f"{log.read_text(errors='replace')[-4000:]}")
        return logged_events(log, "registered") >= before + 2

    try:
        wait_until(registered, timeout_s=timeout_s, interval_s=0.1,
                   what="the device plugin to register both resources with the kubelet")
    except TimeoutError:
        print(log.read_text(errors="replace")[-4000:])
        raise


def write_gpu_recording(path: Path) -> Path:
    """The node's recorded GPUs (two A100s, ``GPU_UUIDS``) as an NVML recording at ``path``."""
    path.write_text(json.dumps({"devices": [
        {"name": "NVIDIA A100-SXM4-80GB", "uuid": uuid, "memory_total": 85_899_345_920,
         "samples": [{"gpu": 0, "memory_used": 0}]} for uuid in GPU_UUIDS]}))
    return path


@pytest.fixture
def device_plugin(node: Node, node_plane: ControlPlane, tmp_path: Path) -> Iterator[Path]:
    recording = write_gpu_recording(tmp_path / "nvml.json")
    log = tmp_path / "device-plugin.log"
    publish_test_key(kubernetes.client.CoreV1Api(node_plane.api_client()))
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "gpufrag"), "device-plugin",
             f"--node-name={node.name}",
             f"--socket-dir={node.device_plugin_dir}", f"--nvml-recording={recording}",
             f"--kubeconfig={node_plane.kubeconfig_path}", "--metrics-port=0"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "GPUFRAG_LOG_FORMAT": "json"})
    try:
        wait_registered(log, process)
        yield log
    finally:
        ComponentProcess("device-plugin", process, log, 0).stop()
