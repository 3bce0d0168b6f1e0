"""The fleet-scale harness: thousands of GPU nodes that cost almost nothing, on the real control
plane (etcd, kube-apiserver, kube-scheduler), with pods drawn from the openb trace.

Why kwok: a fake node of the dev kit is only a Node object, and nothing would mark its pods
Running; a kubelet per node is out of the question at 5,000 nodes on a small machine. kwok
(sigs.k8s.io/kwok, built from its Go module by ``devkit/tools/build kwok``) is one process that
watches the nodes carrying :data:`FLEET_LABEL` and writes what their kubelets would (pod IP,
Running, Ready), so the schedulers and the extender see pods go through their real life cycle.
The nodes themselves are made by :meth:`devkit.controlplane.ControlPlane.create_gpu_node` (GPU
resources and GFD labels, Ready, untainted), so kwok has nothing to initialise and sends no
heartbeats (no node-lifecycle controller runs to read them).

The fleet: ``count`` nodes resampled (seeded) from the openb GPU node list when the trace is
present (products and GPU counts in the trace's proportions), else the seeded synthetic
cluster with the same shape (:mod:`simulations.synthetic`); pods likewise from the openb pod
list or the synthetic mix (less those no node of the fleet could hold even empty), drawn until
``count`` pods or until their GPU demand would pass ``max_demand`` of the fleet's GPUs,
whichever comes first: a pod that can never fit would stay pending and be retried for as long
as the run lasts, which measures the queue, not the scheduler. Which source was used is in
:attr:`Fleet.source`.

Residents (``residents``): pods already running when the measured pods arrive, bound straight
to their nodes (no scheduler), so the 50,000 pods of a large fleet cost their objects and not
an hour of scheduling one by one on a small machine. The GPU ones are the first pods of the
same draw (the measured pods are its last ``pods``), each on a random node that holds it, on
the GPUs the core's rule gives it: the scattered fill of a long-running cluster. The rest of
``residents`` are per-node system pods without GPUs (10m CPU, spread over the nodes): what a
real fleet's daemonsets (device plugin, agent, exporters, network) put on every node, which
the extender watches and caches all the same.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Final

import kubernetes
import numpy as np
import orjson

from defrag.controller.cluster import read_reservations
from defrag.controller.snapshot import UsageSource, build_snapshot
from devkit.controlplane import ControlPlane
from devkit.procs import EXIT_WITH_PARENT_ENV, ComponentProcess, wait_until
from devkit.stack import GROUP_LABEL, gpu_pod
from devkit.toolbuild import build_tool
from gpufrag.conventions import (
    ANNOTATION_GPU_INDICES,
    ANNOTATION_GPU_USAGE,
    HINTS_NAMESPACE,
)
from gpufrag.dataroot import data_root
from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage
from scheduler.core import MILLI_PER_GPU, ClusterState, TargetWorkload
from scheduler.core.feasibility import feasible_mask
from scheduler.core.fragmentation import node_fragmentation
from scheduler.core.gpus import NO_GPU, gpus_for
from scheduler.core.state import PlacementError
from scheduler.core.types import NodeSpec, PodRequest
from scheduler.kube.convert import bound_gpus, container_gpus, controller_ref, node_name_of
from scheduler.kube.watch import NON_TERMINAL_PODS, list_objects
from simulations.defrag_whatif import DEFAULT_GPU_GIB, with_gpu_memory
from simulations.openb import load_nodes, load_pods
from simulations.synthetic import synthetic_nodes, synthetic_pods

# The nodes kwok manages; the stack's group label, so the e2e helpers read them too.
FLEET_GROUP: Final = "fleet"
FLEET_LABEL: Final = f"{GROUP_LABEL}={FLEET_GROUP}"
# The openb trace under the data root (gpufrag.dataroot), settled when the command starts.
OPENB_DIR: Final = data_root() / "openb"
OPENB_NODES: Final = "openb_node_list_gpu_node.csv"
OPENB_PODS: Final = "openb_pod_list_default.csv"
# Pod IPs kwok hands out: room for 50,000 pods, clear of the service range (10.96.0.0/12).
POD_CIDR: Final = "10.128.0.0/14"
DEFAULT_MAX_DEMAND: Final = 0.75
# What kwok does to the fleet's pods (a configuration with no stages makes it exit): a bound pod
# becomes Running and Ready with an IP, as a kubelet would report it; a pod being deleted
# gracefully (an eviction) goes away. kwok manages the pods of the nodes its node controller
# holds, and it runs one only where a node stage exists: the nodes are created Ready, so theirs
# only readies a node that is not (none, unless someone edits one).
_STAGE: Final = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: {name}
spec:
  resourceRef: {{apiGroup: v1, kind: {kind}}}
  selector:
    matchExpressions:
{selector}
  next:
{next}
"""
_NODE_READY: Final = """\
    statusTemplate: |
      conditions:
      - {type: Ready, status: "True", reason: KubeletReady, lastHeartbeatTime: {{ Now | Quote }},
         lastTransitionTime: {{ Now | Quote }}}"""
_POD_RUNNING: Final = """\
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      {{ with PodIPsWith .spec.nodeName false .metadata.uid .metadata.name .metadata.namespace }}
      podIP: {{ index . 0 | Quote }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}"""
KWOK_STAGES: Final = "---\n".join(_STAGE.format(name=name, kind=kind, selector=selector,
                                                  next=then) for name, kind, selector, then in (
    ("node-ready", "Node", "    - {key: '.status.conditions.[] | select( .type == \"Ready\" ) "
     "| .status', operator: NotIn, values: ['True']}", _NODE_READY),
    ("pod-running", "Pod", "    - {key: .metadata.deletionTimestamp, operator: DoesNotExist}\n"
     "    - {key: .status.phase, operator: In, values: [Pending]}", _POD_RUNNING),
    ("pod-delete", "Pod", "    - {key: .metadata.deletionTimestamp, operator: Exists}",
     "    delete: true"),
))
CREATE_THREADS: Final = 8
# The Deployments a defrag cycle may move (every other pod of the fleet is bare, and a bare pod
# is never moved): replicas each holding a share of one GPU.
MOVABLE_REPLICAS: Final = 2
MOVABLE_MILLI: Final = 300
MOVABLE_LABEL: Final = "gpufrag.io/fleet-movable"
RESIDENT_NAMESPACE: Final = "resident"
SYSTEM_POD_CPU_MILLI: Final = 10
SYSTEM_POD_MEMORY_MIB: Final = 16


@dataclass(frozen=True)
class Resident:
    """A pod bound to ``node`` before the run, on ``gpus`` (None: no GPU)."""

    pod: PodRequest
    node: str
    gpus: tuple[int, ...] | None


@dataclass(frozen=True)
class Fleet:
    """The nodes and pods of one scale run, and where they came from."""

    source: str  # "openb" or "synthetic"
    nodes: list[NodeSpec]
    pods: list[PodRequest]
    asked_pods: int
    residents: list[Resident] = field(default_factory=list)

    @property
    def capacity_milli(self) -> int:
        return sum(n.gpu_count for n in self.nodes) * MILLI_PER_GPU

    @property
    def demand_milli(self) -> int:
        return sum(p.gpu_demand_milli for p in self.pods)


def make_fleet(nodes: int, pods: int, *, seed: int = 0, data_dir: Path = OPENB_DIR,
               max_demand: float = DEFAULT_MAX_DEMAND, residents: int = 0) -> Fleet:
    """``nodes`` GPU nodes, up to ``pods`` pods of the openb shape, and ``residents`` pods
    bound before them (see the module doc)."""
    if nodes < 1 or pods < 1 or residents < 0 or not 0 < max_demand <= 1:
        raise ValueError(f"nodes={nodes} and pods={pods} must be >= 1, residents={residents} "
                         f">= 0, max_demand={max_demand} in (0, 1]")
    rng = np.random.default_rng(seed)
    openb = (data_dir / OPENB_NODES).is_file() and (data_dir / OPENB_PODS).is_file()
    if openb:
        trace_nodes = [n for n in load_nodes(data_dir / OPENB_NODES) if n.gpu_count]
        picked = rng.integers(0, len(trace_nodes), size=nodes)
        node_specs = [replace(trace_nodes[int(k)], name=f"fleet-{i:05d}")
                      for i, k in enumerate(picked)]
        trace_pods = load_pods(data_dir / OPENB_PODS)
    else:
        node_specs = [replace(n, name=f"fleet-{i:05d}")
                      for i, n in enumerate(synthetic_nodes(nodes, seed=seed))]
        trace_pods = synthetic_pods(max(pods, 2000), seed=seed)
    node_specs = with_gpu_memory(node_specs, DEFAULT_GPU_GIB)
    # A pod no node of this fleet could hold even empty (its allowed products all missing, or
    # none of them big enough) could never be placed: it is not drawn.
    kinds = list({(n.cpu_milli, n.memory_mib, n.gpu_count, n.gpu_product, n.gpu_memory_mib): n
                  for n in node_specs}.values())
    empty = ClusterState(kinds)
    rows = empty.active_rows()
    products = {n.gpu_product for n in node_specs}
    eligible = [p for p in trace_pods if (not p.gpu_spec or p.gpu_spec & products)
                and feasible_mask(empty, p, rows).any()]
    budget = int(sum(n.gpu_count for n in node_specs) * MILLI_PER_GPU * max_demand)
    chosen: list[PodRequest] = []
    demand = 0
    for k in rng.integers(0, len(eligible), size=pods + residents):
        pod = eligible[int(k)]
        if demand + pod.gpu_demand_milli > budget:
            break
        demand += pod.gpu_demand_milli
        chosen.append(replace(pod, name=f"p-{len(chosen):05d}",
                              gpu_spec=pod.gpu_spec & products))
    measured = max(0, len(chosen) - pods)
    bound = scatter(node_specs, chosen[:measured], rng) if residents else []
    system = [Resident(PodRequest(f"sys-{i:05d}", cpu_milli=SYSTEM_POD_CPU_MILLI,
                                  memory_mib=SYSTEM_POD_MEMORY_MIB,
                                  namespace=RESIDENT_NAMESPACE),
                       node_specs[i % len(node_specs)].name, None)
              for i in range(max(0, residents - len(bound)))]
    return Fleet("openb" if openb else "synthetic", node_specs, chosen[measured:], pods,
                 bound + system)


def scatter(nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], rng: np.random.Generator
            ) -> list[Resident]:
    """Each pod on a random node that holds it (after those before it), on the GPUs the core's
    rule gives it; a pod no node holds any more is left out."""
    state = ClusterState(nodes)
    rows = state.active_rows()
    placed = []
    for pod in pods:
        fits = rows[feasible_mask(state, pod, rows)]
        if fits.size == 0:
            continue
        row = int(fits[rng.integers(0, fits.size)])
        gpus = gpus_for(state, pod, row, NO_GPU)
        resident = replace(pod, namespace=RESIDENT_NAMESPACE)
        state.place(resident, row, gpus)
        placed.append(Resident(resident, state.names[row], gpus))
    return placed


def resident_state(fleet: Fleet) -> ClusterState:
    """The fleet with its residents on their GPUs: where the measured pods start from."""
    state = ClusterState(fleet.nodes)
    for resident in fleet.residents:
        if resident.gpus is not None:
            state.place(resident.pod, state.index[resident.node], resident.gpus)
    return state


def resident_body(resident: Resident) -> dict[str, Any]:
    """A resident as the Pod object it is created as: the measured pods' shape, bound, its
    GPUs recorded as a bind records them."""
    body = pod_body(resident.pod, "default-scheduler")
    body["metadata"]["namespace"] = RESIDENT_NAMESPACE
    body["spec"]["nodeName"] = resident.node
    if resident.gpus:
        body["metadata"]["annotations"][ANNOTATION_GPU_INDICES] = ",".join(
            str(g) for g in resident.gpus)
    return body


def create_residents(plane: ControlPlane, fleet: Fleet, timeout_s: float) -> None:
    """The fleet's residents created (in their own namespace) and Running (kwok runs them)."""
    if not fleet.residents:
        return
    plane.create_namespace(RESIDENT_NAMESPACE)
    create_pods(plane, RESIDENT_NAMESPACE, (resident_body(r) for r in fleet.residents))
    core = kubernetes.client.CoreV1Api(plane.api_client())

    def all_running() -> bool:
        # One pod at most, not the namespace's 50,000, per look.
        answer: Any = core.list_namespaced_pod(RESIDENT_NAMESPACE, limit=1,
                                               field_selector="status.phase!=Running",
                                               _preload_content=False)
        return not orjson.loads(answer.data)["items"]

    wait_until(all_running, timeout_s=timeout_s, what="every resident pod Running (kwok)",
               interval_s=2.0)


def pod_body(pod: PodRequest, scheduler: str) -> dict[str, Any]:
    """``pod`` as a Pod asking for gpufrag's resources (whole GPUs, or a share of one)."""
    share = pod.num_gpu == 1 and pod.gpu_milli < MILLI_PER_GPU
    return gpu_pod(pod.name, gpus=0 if share else pod.num_gpu,
                   milli=pod.gpu_milli if share else 0, cpu=f"{pod.cpu_milli}m",
                   memory=f"{pod.memory_mib}Mi", products=sorted(pod.gpu_spec),
                   scheduler=scheduler)


def create_nodes(plane: ControlPlane, nodes: Sequence[NodeSpec]) -> None:
    """The fleet's Node objects, Ready and labelled for kwok, made in parallel."""
    def create(node: NodeSpec) -> None:
        plane.create_gpu_node(node.name, node.gpu_count, node.gpu_product, node.gpu_memory_mib,
                              cpu_milli=node.cpu_milli, memory_mib=node.memory_mib,
                              labels={GROUP_LABEL: FLEET_GROUP})

    with ThreadPoolExecutor(CREATE_THREADS) as pool:
        list(pool.map(create, nodes))


def start_kwok(plane: ControlPlane, binary: Path | None = None) -> ComponentProcess:
    """kwok managing the fleet's nodes (their pods become Running), logging beside the plane's
    components; stopped with the returned process's ``stop()``."""
    binary = binary or build_tool("kwok")
    config = plane.work_dir / "kwok.yaml"
    # An explicit configuration, never a user's ~/.kwok file.
    config.write_text(KWOK_STAGES)
    log_path = plane.logs_dir / "kwok.log"
    env = {**os.environ, EXIT_WITH_PARENT_ENV: str(os.getpid())}
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(binary), f"--kubeconfig={plane.kubeconfig_path}", f"--config={config}",
             f"--manage-nodes-with-label-selector={FLEET_LABEL}", f"--cidr={POD_CIDR}",
             "-v=WARN"],  # not a line per pod patched
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
    return ComponentProcess(name="kwok", process=process, log_path=log_path, port=0)


def create_movable(plane: ControlPlane, namespace: str, count: int, scheduler: str,
                   timeout_s: float) -> list[str]:
    """``count`` Deployments of :data:`MOVABLE_REPLICAS` replicas asking
    :data:`MOVABLE_MILLI` milli-GPU each, scheduled by ``scheduler``, all Ready (kwok runs
    them); their names."""
    apps: Any = kubernetes.client.AppsV1Api(plane.api_client())  # bodies as JSON dicts
    names = [f"movable-{i:03d}" for i in range(count)]
    for name in names:
        pod = gpu_pod(name, milli=MOVABLE_MILLI, cpu="100m", memory="256Mi",
                      scheduler=scheduler)
        labels = {"app": name, MOVABLE_LABEL: "true"}
        # Spread over the nodes, all Deployments together, as replicas spread for availability
        # are (softly: a full fleet has few nodes with room): once their neighbours finish,
        # each is about alone on its node.
        pod["spec"]["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {MOVABLE_LABEL: "true"}}}]
        body: dict[str, Any] = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": MOVABLE_REPLICAS, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels,
                                               "annotations": pod["metadata"]["annotations"]},
                                  "spec": pod["spec"]}}}
        apps.create_namespaced_deployment(namespace, body)
    try:
        wait_until(lambda: movable_ready(plane, namespace, names), timeout_s=timeout_s,
                   what=f"{count} movable Deployments ready", interval_s=1.0)
    except TimeoutError as e:
        pending = [c.get("message", "") for p in list_pods(plane, namespace, "spec.nodeName=")
                   for c in p.get("status", {}).get("conditions") or []
                   if c.get("type") == "PodScheduled"]
        raise TimeoutError(f"{e}; {len(pending)} pending, the first because: "
                           f"{pending[0] if pending else '-'}") from None
    return names


def movable_ready(plane: ControlPlane, namespace: str, names: Sequence[str]) -> bool:
    """Every one of ``names`` has all its replicas ready."""
    apps = kubernetes.client.AppsV1Api(plane.api_client())
    answer: Any = apps.list_namespaced_deployment(namespace, _preload_content=False)
    ready = {d["metadata"]["name"]: (d.get("status") or {}).get("readyReplicas", 0)
             >= d["spec"]["replicas"] for d in orjson.loads(answer.data)["items"]}
    return all(ready.get(name, False) for name in names)


def finish_neighbours(plane: ControlPlane, namespace: str, fleet: Fleet,
                      timeout_s: float) -> int:
    """Delete the GPU pods without a controller (the row's in ``namespace``, and residents)
    that share a node with a movable replica, as jobs that finished: what leaves a
    long-running cluster's replicas scattered over nodes that are otherwise idle, the layout
    a defrag cycle consolidates. Finished residents leave ``fleet.residents`` too, so the
    fleet's record stays the cluster's. The number deleted."""
    hosts = sorted({node_name_of(p) for p in list_pods(plane, namespace)
                    if controller_ref(p)[1]} - {""})
    done: list[tuple[str, str]] = []
    for host in hosts:
        for ns in (namespace, RESIDENT_NAMESPACE):
            done += [(ns, p["metadata"]["name"])
                     for p in list_pods(plane, ns, f"spec.nodeName={host}")
                     if not controller_ref(p)[1]
                     and any(c.asks_gpu for c in container_gpus(p))]
    core = kubernetes.client.CoreV1Api(plane.api_client())
    for ns, name in done:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    finished = {name for ns, name in done if ns == RESIDENT_NAMESPACE}
    fleet.residents[:] = [r for r in fleet.residents if r.pod.name not in finished]

    def gone() -> bool:
        return all(not list_pods(plane, ns, f"metadata.name={name}") for ns, name in done)

    wait_until(gone, timeout_s=timeout_s, what="finished pods gone", interval_s=0.5)
    return len(done)


def delete_movable(plane: ControlPlane, namespace: str) -> None:
    """The namespace's Deployments deleted (their pods go with the namespace's others)."""
    apps = kubernetes.client.AppsV1Api(plane.api_client())
    apps.delete_collection_namespaced_deployment(namespace)


def list_reservations(plane: ControlPlane) -> list[Mapping[str, Any]]:
    """The GPU reservations held now (none without the CRD)."""
    return read_reservations(plane.api_client(), HINTS_NAMESPACE) or []


def publish_usage(plane: ControlPlane, used_fraction: Callable[[str], float]) -> int:
    """Write on every node holding GPU pods the usage annotation its agent would: each pod on
    each of its GPUs (as recorded at bind, or the core's rule, as the controller reads them)
    using ``used_fraction(pod key)`` of the GPU memory its share reserves there. The number of
    nodes written."""
    core = kubernetes.client.CoreV1Api(plane.api_client())
    nodes, _ = list_objects(core.list_node, what="nodes")
    pods, _ = list_objects(partial(core.list_pod_for_all_namespaces,
                                   field_selector=NON_TERMINAL_PODS), what="pods")
    now = time.time()
    snap, _ = build_snapshot(nodes, pods, [], UsageSource(8, now))
    state = snap.state
    readings = []
    for row in state.active_rows():
        row = int(row)
        spec = state.node_spec(row)
        per_gpu: dict[int, list[PodGpuUsage]] = {}
        for key in sorted(state.pods_on_node[row]):
            placement, info = state.pods[key], snap.pods[key]
            share = min(placement.pod.gpu_milli, MILLI_PER_GPU) / MILLI_PER_GPU
            for g in placement.gpus:
                per_gpu.setdefault(g, []).append(PodGpuUsage(
                    info.namespace, info.name, info.uid,
                    int(spec.gpu_memory_mib * share * used_fraction(key))))
        if per_gpu:
            readings.append(NodeGpuUsage(node=spec.name, timestamp=now, interval_s=15.0,
                                         gpus=tuple(GpuUsage(
                index=g, uuid=f"GPU-{spec.name}-{g}", product=spec.gpu_product,
                memory_used_mib=sum(p.memory_used_mib for p in used),
                memory_total_mib=spec.gpu_memory_mib, utilization_pct=20, pods=tuple(used))
                for g, used in sorted(per_gpu.items()))))

    def write(reading: NodeGpuUsage) -> None:
        core.patch_node(reading.node, {"metadata": {"annotations": {
            ANNOTATION_GPU_USAGE: reading.to_json()}}})

    with ThreadPoolExecutor(CREATE_THREADS) as pool:
        list(pool.map(write, readings))
    return len(readings)


def create_pods(plane: ControlPlane, namespace: str, bodies: Iterable[dict[str, Any]]) -> None:
    core = kubernetes.client.CoreV1Api(plane.api_client())
    with ThreadPoolExecutor(CREATE_THREADS) as pool:
        list(pool.map(lambda body: core.create_namespaced_pod(namespace, body), bodies))


def list_pods(plane: ControlPlane, namespace: str, field_selector: str = ""
              ) -> list[dict[str, Any]]:
    """The namespace's pods as raw JSON: at 50,000 pods the client's models cost minutes."""
    core = kubernetes.client.CoreV1Api(plane.api_client())
    answer: Any = core.list_namespaced_pod(namespace, field_selector=field_selector,
                                           _preload_content=False)
    items: list[dict[str, Any]] = orjson.loads(answer.data)["items"]
    return items


def unschedulable(pod: dict[str, Any]) -> bool:
    """The scheduler has tried ``pod`` and found no node for it."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == "Unschedulable"
               for c in pod.get("status", {}).get("conditions") or [])


def settled(plane: ControlPlane, namespace: str) -> int | None:
    """The number of pods left unbound once every one is bound or found unschedulable."""
    left = list_pods(plane, namespace, "spec.nodeName=")
    return None if not all(unschedulable(p) for p in left) else len(left)


def running_count(plane: ControlPlane, namespace: str) -> int:
    return len(list_pods(plane, namespace, "status.phase=Running"))


def wait_running(plane: ControlPlane, namespace: str, bound: int, timeout_s: float) -> None:
    """Until kwok has marked every bound pod Running."""
    wait_until(lambda: running_count(plane, namespace) >= bound, timeout_s=timeout_s,
               what=f"{bound} bound pods Running (kwok)", interval_s=1.0)


def delete_pods(plane: ControlPlane, namespace: str, timeout_s: float) -> None:
    """Every pod of the namespace gone. One collection delete of thousands of pods can run
    past the API server's request timeout (504) while it goes on deleting: asked again until
    none is left."""
    core = kubernetes.client.CoreV1Api(plane.api_client())

    def gone() -> bool:
        if not list_pods(plane, namespace):
            return True
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0,
                                              _request_timeout=300)
        return not list_pods(plane, namespace)

    wait_until(gone, timeout_s=timeout_s, what="pods gone", interval_s=2.0)


@dataclass(frozen=True)
class Placement:
    """What one scheduler left on the fleet: GPU allocation and FGD fragmentation (percent of
    GPU capacity) of the pods that can run, pods bound and unbound, and ``stranded``: pods
    bound to a node where no GPU can hold them (a scheduler that counts only a node's total
    milli-GPUs can bind a share no single GPU has room for; the device plugin would refuse
    it), or whose GPUs the extender recorded over-committed."""

    allocation_pct: float
    frag_pct: float
    stranded: int
    bound: int
    unbound: int


def placement(plane: ControlPlane, fleet: Fleet, namespace: str, target: TargetWorkload
              ) -> Placement:
    """The fleet laid out in creation order: each bound pod on its node, on the GPUs the
    extender recorded at bind where it did, else on those the core's rule gives it (as
    gpufrag's device plugin would pick for a pod nobody recorded GPUs for), after the fleet's
    residents on theirs."""
    requests = {p.name: p for p in fleet.pods}
    state = resident_state(fleet)
    pods = list_pods(plane, namespace)
    bound = sorted((p for p in pods if p["spec"].get("nodeName")),
                   key=lambda p: str(p["metadata"]["name"]))
    stranded = 0
    for pod in bound:
        request = requests[pod["metadata"]["name"]]
        row = state.index[pod["spec"]["nodeName"]]
        recorded = bound_gpus(pod)
        gpus = recorded if recorded is not None else gpus_for(state, request, row, NO_GPU)
        try:
            state.place(request, row, gpus)
        except (PlacementError, IndexError):
            stranded += 1
    rows = state.active_rows()
    capacity = state.total_gpu_milli
    free = int(state.gpu_free_total(rows).sum())
    frag = float(node_fragmentation(state, target, rows).sum())
    return Placement(allocation_pct=100.0 * (capacity - free) / capacity,
                     frag_pct=100.0 * frag / capacity, stranded=stranded, bound=len(bound),
                     unbound=len(pods) - len(bound))


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """The ``q`` quantile of a Prometheus histogram's cumulative ``(le, count)`` buckets,
    interpolated inside its bucket as PromQL's histogram_quantile does (NaN when empty)."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return math.nan
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            span = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / span
                                                          if span else 1.0)
        lower_bound, lower_count = bound, count
    return lower_bound
