"""docs/operations.md's "Diagnose a live process" on the real node: ``kubectl debug`` attaches an
ephemeral container from the profiler image (``devkit.image.build_profiler_image``: the Debian
base with py-spy) to a running ``gpufrag serve`` pod, sharing the server container's process
namespace (``--target``), and ``py-spy dump --pid 1`` prints the server's Python stacks as the
server's own user with no capability (as another user it is refused); the server keeps passing
its probes and answering.

The pod is manifests/base's serving example, fitted to this node as tests/e2e/node/
test_serve_pod.py fits it: its pod-level ``runAsUser: 65532``, ``runAsNonRoot`` and
``RuntimeDefault`` seccomp profile apply to the ephemeral container too.
"""

from __future__ import annotations

import http.client
import re
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from devkit.image import ImageBuildError, build_profiler_image
from devkit.node import Node
from devkit.procs import wait_until
from tests.e2e.node.test_serve_pod import PORT, serving_pod

POD = "serving"
TARGET = "server"
# docs/operations.md's record, in the folded ("raw") format that this test can read; py-spy's
# progress lines go to a file of their own, printed only when it fails.
RECORD = ("py-spy record --pid 1 --duration 2 --rate 50 --idle --format raw "
          "--output /tmp/profile.txt >/tmp/py-spy.log 2>&1 || { cat /tmp/py-spy.log; exit 1; }; "
          "cat /tmp/profile.txt")


@pytest.fixture(scope="module")
def profiler_image(node: Node, gpufrag_image: str) -> str:
    """The profiler image, built (cached) and imported into the node's containerd."""
    try:
        built = build_profiler_image()
    except ImageBuildError as exc:
        pytest.fail(f"the profiler image could not be built:\n{exc}")
    node.import_image(built.archive)
    return built.ref


def _health_status(ip: str) -> int:
    conn = http.client.HTTPConnection(ip, PORT, timeout=10)
    try:
        conn.request("GET", "/v2/health/ready")
        return conn.getresponse().status
    finally:
        conn.close()


def _debug(node_plane: ControlPlane, namespace: str, image: str, name: str, profile: str,
           *command: str, custom: Path | None = None
           ) -> kubernetes.client.V1ContainerStateTerminated:
    """``kubectl debug`` as docs/operations.md gives it, without ``-it`` (attaching goes
    through the kubelet, which the dev kit's API server cannot reach: :func:`_logs`): the
    ephemeral container ``name`` runs ``command`` beside the server; its terminated state."""
    node_plane.kubectl("debug", POD, f"--namespace={namespace}", f"--image={image}",
                       "--image-pull-policy=Never", f"--target={TARGET}",
                       f"--profile={profile}", f"--container={name}",
                       *([f"--custom={custom}"] if custom else []), "--", *command)
    core = kubernetes.client.CoreV1Api(node_plane.api_client())

    def terminated() -> kubernetes.client.V1ContainerStateTerminated | None:
        pod = core.read_namespaced_pod(POD, namespace)
        for status in pod.status.ephemeral_container_statuses or []:
            if status.name == name and status.state and status.state.terminated:
                return status.state.terminated
        return None

    try:
        state: kubernetes.client.V1ContainerStateTerminated = wait_until(
            terminated, timeout_s=90, what=f"the ephemeral container {name} to finish")
    except Exception:
        for event in core.list_namespaced_event(namespace).items:
            print(f"event {event.involved_object.name}: {event.reason}: {event.message}")
        print(core.read_namespaced_pod(POD, namespace).status.ephemeral_container_statuses)
        raise
    return state


def _ready_since(pod: kubernetes.client.V1Pod) -> Any:
    """When the pod last turned Ready (None when it is not)."""
    return next((c.last_transition_time for c in pod.status.conditions or []
                 if c.type == "Ready" and c.status == "True"), None)


def test_py_spy_in_an_ephemeral_container_dumps_and_records_a_live_server(
        node: Node, node_plane: ControlPlane, node_namespace: str, profiler_image: str,
        base_manifests: list[dict[str, Any]], tmp_path: Path) -> None:
    core = kubernetes.client.CoreV1Api(node_plane.api_client())
    core.create_namespaced_pod(node_namespace, serving_pod(base_manifests, node))

    def ready() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod(POD, node_namespace)
        assert pod.status.phase != "Failed", pod.status
        return pod if pod.status.phase == "Running" and _ready_since(pod) else None

    try:
        pod = wait_until(ready, timeout_s=120, what="the serving pod to pass its probes")
    except Exception:
        print(node.container_log(node_namespace, POD, TARGET))
        raise
    ip: str = pod.status.pod_ip
    ready_since = _ready_since(pod)

    # The documented profile, restricted: no capability, the pod's uid (65532, the server's),
    # and py-spy reads the server's memory all the same (the same user may ptrace its own
    # processes; this node's kernel has no Yama LSM to narrow that, see docs/operations.md).
    state = _debug(node_plane, node_namespace, profiler_image, "py-spy", "restricted",
                   "sh", "-c", "id -u; grep CapEff /proc/self/status; exec py-spy dump --pid 1")
    dump = _logs(node, node_namespace, "py-spy")
    assert state.exit_code == 0, (state, dump)
    assert re.search(r"^65532\nCapEff:\s+0+\n", dump), dump
    assert re.search(r"^Process 1: \S*python3? \S*/gpufrag serve ", dump, re.M), dump
    # The server's main thread, from the console script down to the serve command's main.
    assert re.search(r"^Thread \d+ \(\w+\): \"MainThread\"$", dump, re.M), dump
    assert re.search(r"^ +main \((?:\S*/)?serving/cli\.py:\d+\)$", dump, re.M), dump
    assert re.search(r"^ +main \((?:\S*/)?gpufrag/cli\.py:\d+\)$", dump, re.M), dump

    # The control: the same profile as another user (kubectl debug's --custom) is refused.
    other_user = tmp_path / "other-user.yaml"
    other_user.write_text("securityContext:\n  runAsUser: 1000\n")
    state = _debug(node_plane, node_namespace, profiler_image, "py-spy-other-user",
                   "restricted", "py-spy", "dump", "--pid", "1", custom=other_user)
    refused = _logs(node, node_namespace, "py-spy-other-user")
    assert state.exit_code != 0 and "Permission Denied" in refused, (state, refused)

    # kubectl's default profile (general) adds SYS_PTRACE; a record of two seconds (idle
    # threads included: the server is idle) written in the container and printed to its log.
    state = _debug(node_plane, node_namespace, profiler_image, "py-spy-record", "general",
                   "sh", "-c", RECORD)
    record = _logs(node, node_namespace, "py-spy-record")
    assert state.exit_code == 0, (state, record)
    samples = [line for line in record.splitlines() if "main (serving/cli.py:" in line]
    assert samples and all(re.search(r";.* \d+$", line) for line in samples), record

    pod = core.read_namespaced_pod(POD, node_namespace)
    specs = {c.name: c for c in pod.spec.ephemeral_containers}
    assert {c.target_container_name for c in specs.values()} == {TARGET}
    assert specs["py-spy"].security_context.capabilities.drop == ["ALL"]
    assert specs["py-spy-record"].security_context.capabilities.add == ["SYS_PTRACE"]

    # The server was paused for the dump and sampled for the record, nothing more: Ready all
    # along (the condition never changed), never restarted, answering.
    assert _ready_since(pod) == ready_since, pod.status.conditions
    (server,) = [c for c in pod.status.container_statuses if c.name == TARGET]
    assert server.ready and server.restart_count == 0, server
    assert _health_status(ip) == 200


def _logs(node: Node, namespace: str, container: str) -> str:
    """What an ephemeral container wrote: its CRI log file, read on the node, without the
    time, stream and tag of each line (``kubectl logs`` reads the same file through the
    kubelet, which the dev kit's API server cannot reach: its Node has no address)."""
    text = ""
    for line in node.container_log(namespace, POD, container).splitlines():
        _, _, tag, content = [*line.split(" ", 3), "", ""][:4]  # "time stream tag content"
        text += content + ("\n" if tag == "F" else "")
    return text
