"""``gpufrag defrag`` end to end against the real control plane.

Scenario: a deliberately fragmented cluster of fake GPU nodes. One 16 GiB T4 node holds two bare
700-milli pods (a 300-milli leftover on each GPU); three 32 GiB V100 nodes each hold one
300-milli replica — of Deployment ``web`` (2 replicas, PDB minAvailable 1) or ``api`` (1
replica) — that uses 2 GiB of the 9.6 GiB it reserves. Usage is reported as the node agent would:
the ``gpufrag.io/gpu-usage`` annotation, written on the Nodes directly. The initial layout is made
with real schedulers by uncordoning one node at a time.

Who binds: when the extender's end-to-end harness (``tests/e2e/stack.py``) is present, the pods
use gpufrag-scheduler (kube-scheduler + our extender), and every replacement must land on the
node its placement hint names. Otherwise they use an upstream kube-scheduler profile that packs
``gpufrag.io/gpu-milli`` (MostAllocated), and the test checks that each hint was written and each
eviction happened — landing "via the hint" is only claimed with the extender running.

Checked after one cycle: fragmentation ratio and idle GiB drop and whole GPUs come free (read
back from the API server through the same converters), every Deployment is back at full replicas,
the PDB never had fewer than minAvailable ready pods, the bare pods are untouched, the hints are
cleaned up; and ``--dry-run`` changes nothing at all (no hint, no reservation, no annotation).

Reservations (the GPUReservation CRD from manifests/base, installed before the extender
starts): every move's capacity is reserved before the first eviction, each reservation is
deleted once its replacement is bound, and — with the extender binding — a competing pod that
fits only the reserved GPUs, created the moment the first eviction is seen (while reservations
are held), never takes a reserved GPU, while each replacement lands on its reserved GPU.
Right-sizing: the cycle publishes each sampled workload's recommendation on its Deployment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from defrag.controller.budget import evictions_within
from defrag.controller.convergence import parse_state
from defrag.controller.measure import Summary, measure
from defrag.controller.snapshot import UsageSource, build_snapshot
from defrag.rightsizing.recommender import parse as parse_recommendation
from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.procs import wait_until
from devkit.stack import install_reservations_crd
from gpufrag import conventions as cv
from gpufrag.cli import main as gpufrag
from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage
from scheduler.core import TargetWorkload
from scheduler.kube import reservations as rsv

pytestmark = pytest.mark.e2e

T4, V100 = "Tesla-T4", "Tesla-V100-SXM2-32GB"
T4_MIB, V100_MIB = 16_384, 32_768
SINK = "dfg-t4"
SOURCES = ("dfg-v100-1", "dfg-v100-2", "dfg-v100-3")
NODES = (SINK, *SOURCES)
USED_MIB = 2048  # what each replica really uses
ANCHOR_USED_MIB = 11_000
WAIT_S = 90.0
PACKING = "gpufrag-e2e-packing"
PACKING_CONFIG = f"""\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: {PACKING}
    plugins:
      score:
        disabled:
          - name: NodeResourcesBalancedAllocation
          - name: PodTopologySpread
    pluginConfig:
      - name: NodeResourcesFit
        args:
          scoringStrategy:
            type: MostAllocated
            resources:
              - name: {cv.RESOURCE_GPU_MILLI}
                weight: 1
"""




@dataclass
class Binder:
    scheduler: str
    via_extender: bool


def reservations(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """The reservations made for replacements of pods in ``namespace`` (this module's; the
    session's other modules may hold their own in the same place)."""
    custom = kubernetes.client.CustomObjectsApi(plane.api_client())
    items: list[dict[str, Any]] = custom.list_namespaced_custom_object(
        rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE, rsv.PLURAL)["items"]
    return [o for o in items
            if ((o.get("spec") or {}).get("replaces") or {}).get("namespace") == namespace]


@pytest.fixture(scope="module")
def binder(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Binder]:
    """gpufrag-scheduler with the extender, or (``GPUFRAG_E2E_DEFRAG_BINDER=packing``) a
    packing profile of kube-scheduler alone, to check the controller without the hints."""
    install_reservations_crd(control_plane)
    if os.environ.get("GPUFRAG_E2E_DEFRAG_BINDER") == "packing":
        control_plane.start_scheduler(PACKING, PACKING_CONFIG)
        yield Binder(PACKING, via_extender=False)
        control_plane.stop_scheduler(PACKING)
        return
    extender = ExtenderProcess(control_plane, tmp_path_factory.mktemp("defrag") / "extender.log")
    extender.start()
    control_plane.start_scheduler(cv.SCHEDULER_NAME, gpufrag_scheduler_config(extender.url))
    try:
        yield Binder(cv.SCHEDULER_NAME, via_extender=True)
    finally:
        control_plane.stop_scheduler(cv.SCHEDULER_NAME)
        extender.stop()


# ------------------------------------------------------------------------------ objects
def pod_spec(scheduler: str, milli: int, node: str = "") -> dict[str, Any]:
    pinned = {"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}
    return {**pinned, "schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
            "containers": [{
        "name": "main", "image": "gpufrag-e2e:none",
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi",
                                   cv.RESOURCE_GPU_MILLI: str(milli)},
                      "limits": {cv.RESOURCE_GPU_MILLI: str(milli)}}}]}


def deployment(name: str, replicas: int, scheduler: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": pod_spec(scheduler, 300)}}}


@dataclass
class Cluster:
    plane: ControlPlane
    namespace: str
    binder: Binder
    core: Any
    apps: Any
    anchors: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (uid, node)

    def pods(self) -> list[dict[str, Any]]:
        api = self.plane.api_client()
        return [api.sanitize_for_serialization(p)
                for p in self.core.list_namespaced_pod(self.namespace).items]

    def layout(self) -> dict[str, tuple[str, str]]:
        """uid -> (name, node) of every pod in the namespace."""
        return {p["metadata"]["uid"]: (p["metadata"]["name"], p["spec"].get("nodeName", ""))
                for p in self.pods()}

    def cordon(self, *, allow: str | None) -> None:
        for name in NODES:
            self.core.patch_node(name, {"spec": {"unschedulable": name != allow and allow != "*"}})

    def running(self, prefix: str, count: int) -> list[dict[str, Any]]:
        """Wait until exactly ``count`` pods whose name starts with ``prefix`` are bound and
        Running (and none is on its way out)."""
        def ready() -> list[dict[str, Any]] | None:
            pods = [p for p in self.pods() if p["metadata"]["name"].startswith(prefix)]
            done = [p for p in pods if p["spec"].get("nodeName")
                    and not p["metadata"].get("deletionTimestamp")
                    and (p.get("status") or {}).get("phase") == "Running"]
            return done if len(done) == count == len(pods) else None

        found: list[dict[str, Any]] = wait_until(ready, timeout_s=WAIT_S,
                                                 what=f"{count} running {prefix} pods")
        return found

    def running_on(self, prefix: str, nodes: list[str]) -> None:
        """Wait until the ``prefix`` pods (a controller's) run on exactly ``nodes``.

        The layout is built by cordoning, and the scheduler learns of a cordon through its own
        node watch: a pod created right after the patch can still race it onto a node that
        was meant to be closed. Such a pod is deleted and its controller makes another."""
        for _ in range(5):
            wanted = list(nodes)
            misplaced = []
            for pod in self.running(prefix, len(nodes)):
                node = pod["spec"]["nodeName"]
                if node in wanted:
                    wanted.remove(node)
                else:
                    misplaced.append(pod["metadata"]["name"])
            if not misplaced:
                return
            for name in misplaced:
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        raise AssertionError(f"{prefix} pods not on {nodes} after 5 tries")

    def publish_usage(self) -> None:
        """Write each node's usage annotation as the agent would: replicas use 2 GiB, anchors
        11,000 MiB, on the GPU recorded at bind (or the core's rule, as the controller reads)."""
        api = self.plane.api_client()
        nodes = [api.sanitize_for_serialization(n) for n in
                 (self.core.read_node(name) for name in NODES)]
        snap, _ = build_snapshot(nodes, self.pods(), [], UsageSource(8, time.time()))
        for name in NODES:
            row = snap.state.index[name]
            per_gpu: dict[int, list[PodGpuUsage]] = {0: [], 1: []}
            for key in sorted(snap.state.pods_on_node[row]):
                info = snap.pods[key]
                used = ANCHOR_USED_MIB if info.name.startswith("anchor") else USED_MIB
                for g in snap.state.pods[key].gpus:
                    per_gpu[g].append(PodGpuUsage(info.namespace, info.name, info.uid, used))
            total = T4_MIB if name == SINK else V100_MIB
            reading = NodeGpuUsage(node=name, timestamp=time.time(), interval_s=15.0, gpus=tuple(
                GpuUsage(index=g, uuid=f"GPU-{name}-{g}", product=T4 if name == SINK else V100,
                         memory_used_mib=sum(p.memory_used_mib for p in pods),
                         memory_total_mib=total, utilization_pct=20, pods=tuple(pods))
                for g, pods in per_gpu.items()))
            self.core.patch_node(name, {"metadata": {"annotations": {
                cv.ANNOTATION_GPU_USAGE: reading.to_json()}}})

    def measure(self) -> Summary:
        api = self.plane.api_client()
        nodes = [api.sanitize_for_serialization(self.core.read_node(n)) for n in NODES]
        snap, problems = build_snapshot(nodes, self.pods(), [], UsageSource(8, time.time()))
        assert problems == []
        requests = [p.pod for p in snap.state.pods.values()]
        return measure(snap.state, snap.usage, TargetWorkload.from_pods(requests)).summary

    def hints(self) -> Mapping[str, str]:
        try:
            cm = self.core.read_namespaced_config_map(cv.HINTS_CONFIGMAP, cv.HINTS_NAMESPACE)
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return {}
            raise
        return dict(cm.data or {})


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, binder: Binder) -> Iterator[Cluster]:
    api = control_plane.api_client()
    core, apps = kubernetes.client.CoreV1Api(api), kubernetes.client.AppsV1Api(api)
    namespace = control_plane.create_namespace(f"e2e-defrag-{int(time.time()) % 100000}")
    control_plane.ensure_namespace(cv.HINTS_NAMESPACE)
    for name in NODES:
        sink = name == SINK
        control_plane.create_gpu_node(name, 2, T4 if sink else V100, T4_MIB if sink else V100_MIB,
                                      cpu_milli=16_000, memory_mib=64 * 1024)
    c = Cluster(control_plane, namespace, binder, core, apps)
    try:
        scheduler = binder.scheduler
        c.cordon(allow=SINK)
        for i in range(2):
            core.create_namespaced_pod(namespace, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"anchor-{i}"},
                "spec": pod_spec(scheduler, 700, node=SINK)})  # bare: pinned, never raced
        for anchor in c.running("anchor", 2):
            c.anchors[anchor["metadata"]["name"]] = (anchor["metadata"]["uid"],
                                                      anchor["spec"]["nodeName"])
        c.cordon(allow=SOURCES[0])
        apps.create_namespaced_deployment(namespace, deployment("web", 1, scheduler))
        c.running_on("web", [SOURCES[0]])
        c.cordon(allow=SOURCES[1])
        apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 2}})
        c.running_on("web", [SOURCES[0], SOURCES[1]])
        c.cordon(allow=SOURCES[2])
        apps.create_namespaced_deployment(namespace, deployment("api", 1, scheduler))
        c.running_on("api", [SOURCES[2]])
        c.cordon(allow="*")
        kubernetes.client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(namespace, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
        policy = kubernetes.client.PolicyV1Api(api)
        wait_until(lambda: (policy.read_namespaced_pod_disruption_budget_status(
            "web", namespace).status.disruptions_allowed == 1) or None, timeout_s=WAIT_S,
            what="the disruption controller to count web's pods")
        c.publish_usage()
        yield c
    finally:
        with suppress(kubernetes.client.ApiException):
            core.delete_namespace(namespace)
        for name in NODES:
            with suppress(kubernetes.client.ApiException):
                core.delete_node(name)


def run_defrag(cluster: Cluster, *extra: str, capsys: pytest.CaptureFixture[str],
               move_not_actionable: bool = True) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """One cycle, its JSON plan and result. The scenario's workloads are in the default mode
    (recommend): no right-sizing can reclaim their idle memory, so the cycle moves them only
    with --move-not-actionable (consolidating, as a descheduler would). Two replicas packed
    into the sink leave it 20% idle: inside the default hysteresis band (15% to 25%), which no
    landing may lift an off node into, since a node's own pods swing across it within hours.
    The anchors here use a fixed amount, so the band is closed (--threshold-off 0.25)."""
    flags = ["--move-not-actionable"] if move_not_actionable else []
    code = gpufrag(["defrag", "--kubeconfig", str(cluster.plane.kubeconfig_path),
                    "--namespaces", cluster.namespace, "--output", "json", "--threshold-off",
                    "0.25",
                    "--max-evictions-total", "3", "--max-evictions-per-node", "2",
                    "--bind-timeout-s", str(int(WAIT_S)), *flags, *extra])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{")]
    plan = next(d for d in lines if d["kind"] == "plan")
    result = next(d for d in lines if d["kind"] == "result")
    return code, plan, result


COMPETITOR = "competitor"


def competitor_pod(scheduler: str) -> dict[str, Any]:
    """A bare 300-milli pod that fits only a T4 (the sink, whose two 300-milli leftovers are
    what the moves are planned into)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": COMPETITOR, "annotations": {cv.ANNOTATION_GPU_SPEC: T4}},
        "spec": pod_spec(scheduler, 300)}


@dataclass
class PodTrace:
    """Resource versions (etcd's revision: one global order) of what happened to a pod."""

    name: str = ""
    deleting_rv: int = 0  # first seen with a deletionTimestamp (or deleted)
    bound_rv: int = 0  # first seen bound
    node: str = ""
    gpus: str = ""


class Watcher(threading.Thread):
    """While the cycle runs: the fewest ready ``web`` pods (polled), every hint ever written,
    every GPUReservation event and what happened to every pod of the namespace, in etcd order.

    Hints, reservations and pods are followed with real watches, each started from the resource
    version of a list made before the cycle, so every write is delivered: a hint or reservation
    lives only until its replacement is bound, which can be shorter than any polling interval.
    With ``competitor``, the moment the first evicted pod is marked for deletion a competing pod
    is created (the plan is committed then: every reservation exists)."""

    def __init__(self, cluster: Cluster, *, competitor: bool = False) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        api = cluster.plane.new_api_client()
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.stop_event = threading.Event()
        self.fewest_ready_web = 99
        self.hints_seen: set[tuple[str, str]] = set()
        self.errors: list[str] = []
        self.polls = 0  # successful ones: what the PDB check rests on
        # name -> (ADDED rv, spec), name -> DELETED rv
        self.reserved: dict[str, tuple[int, dict[str, Any]]] = {}
        self.released: dict[str, int] = {}
        self.pods: dict[str, PodTrace] = {}  # uid -> trace
        self.competitor = competitor
        self.competitor_rv = 0
        listing = self.core.list_namespaced_config_map(cv.HINTS_NAMESPACE,
                                                       field_selector=self._selector)
        for cm in listing.items:
            self._record(cm.data)
        rv_reservations = self.custom.list_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE, rsv.PLURAL)
        assert reservations(cluster.plane, cluster.namespace) == [], "reservations left over"
        rv_pods = self.core.list_namespaced_pod(cluster.namespace).metadata.resource_version
        self._threads = [
            threading.Thread(target=self._watch_hints,
                             args=(listing.metadata.resource_version,), daemon=True),
            threading.Thread(target=self._follow, daemon=True, args=(
                self._reservation_event, self.custom.list_namespaced_custom_object,
                (rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE, rsv.PLURAL),
                rv_reservations["metadata"]["resourceVersion"])),
            threading.Thread(target=self._follow, daemon=True, args=(
                self._pod_event, self.core.list_namespaced_pod, (cluster.namespace,), rv_pods)),
        ]

    _selector = f"metadata.name={cv.HINTS_CONFIGMAP}"

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        super().start()

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        for thread in self._threads:
            thread.join(timeout)

    def _follow(self, handle: Any, call: Any, args: tuple[Any, ...], resource_version: str
                ) -> None:
        """Deliver every event of ``call(*args)`` from ``resource_version`` on to ``handle``."""
        watch = kubernetes.watch.Watch()
        while not self.stop_event.is_set():
            try:
                for event in watch.stream(call, *args, resource_version=resource_version,
                                          timeout_seconds=1):
                    obj = event["raw_object"]
                    resource_version = obj["metadata"]["resourceVersion"]
                    handle(event["type"], obj, int(resource_version))
            except Exception as e:  # reported by the test, never a dead thread
                self.errors.append(repr(e))
                self.stop_event.wait(0.2)

    def _reservation_event(self, kind: str, obj: dict[str, Any], rv: int) -> None:
        name = obj["metadata"]["name"]
        if kind == "ADDED":
            self.reserved[name] = (rv, obj["spec"])
        elif kind == "DELETED":
            self.released[name] = rv

    def _pod_event(self, kind: str, obj: dict[str, Any], rv: int) -> None:
        meta = obj["metadata"]
        trace = self.pods.setdefault(meta["uid"], PodTrace(meta["name"]))
        if (kind == "DELETED" or meta.get("deletionTimestamp")) and not trace.deleting_rv:
            trace.deleting_rv = rv
            if self.competitor and not self.competitor_rv:  # the first eviction: compete now
                made = self.core.create_namespaced_pod(
                    self.cluster.namespace, competitor_pod(self.cluster.binder.scheduler))
                self.competitor_rv = int(made.metadata.resource_version)
        node = (obj.get("spec") or {}).get("nodeName")
        if node and not trace.bound_rv:
            trace.bound_rv, trace.node = rv, node
            trace.gpus = (meta.get("annotations") or {}).get(cv.ANNOTATION_GPU_INDICES, "")

    def _record(self, data: dict[str, str] | None) -> None:
        for owner, text in (data or {}).items():
            for entry in json.loads(text):
                self.hints_seen.add((owner, entry["node"]))

    def _watch_hints(self, resource_version: str) -> None:
        watch = kubernetes.watch.Watch()
        while not self.stop_event.is_set():
            try:
                for event in watch.stream(self.core.list_namespaced_config_map,
                                          cv.HINTS_NAMESPACE, field_selector=self._selector,
                                          resource_version=resource_version,
                                          timeout_seconds=1):
                    obj = event["object"]
                    resource_version = obj.metadata.resource_version
                    self._record(obj.data)
            except Exception as e:  # reported by the test, never a dead thread
                self.errors.append(repr(e))
                self.stop_event.wait(0.2)

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self._poll()
                self.polls += 1
            except Exception as e:  # reported by the test, never a dead thread
                self.errors.append(repr(e))
            self.stop_event.wait(0.05)

    def _poll(self) -> None:
        pods = self.core.list_namespaced_pod(self.cluster.namespace,
                                             label_selector="app=web").items
        ready = sum(1 for p in pods if p.metadata.deletion_timestamp is None
                    and p.status is not None and p.status.phase == "Running"
                    and any(c.type == "Ready" and c.status == "True"
                            for c in p.status.conditions or []))
        self.fewest_ready_web = min(self.fewest_ready_web, ready)


def recommendation_on(cluster: Cluster, deployment: str) -> str | None:
    annotations = cluster.apps.read_namespaced_deployment(
        deployment, cluster.namespace).metadata.annotations or {}
    value: str | None = annotations.get(cv.ANNOTATION_GPU_RECOMMENDATION)
    return value


def test_a_dry_run_then_one_cycle_then_a_rerun(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """The scenario, in its order (one test, so that no random order can run the real cycle
    before the dry run that needs the fragmented cluster): a dry run changes nothing, one cycle
    defragments and keeps every promise, a second cycle continues from the live state."""
    dry_run_changes_nothing(cluster, capsys)
    moves = one_cycle_defragments_and_keeps_every_promise(cluster, capsys)
    the_state_remembers_the_moves_for_the_next_run(cluster, moves, capsys)
    a_rerun_continues_from_the_live_state(cluster, capsys)


def dry_run_changes_nothing(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    before_layout, before_hints = cluster.layout(), cluster.hints()
    before = cluster.measure()
    watcher = Watcher(cluster)
    watcher.start()
    try:
        code, plan, result = run_defrag(cluster, "--dry-run", capsys=capsys)
    finally:
        watcher.stop_event.set()
        watcher.join(10)
    # It would reserve every move and publish recommendations; it writes neither.
    assert watcher.reserved == {} and reservations(cluster.plane, cluster.namespace) == [], \
        watcher.errors
    assert {p["workload"].split("/")[-1] for p in result["rightsizing"]["published"]} == {
        "web", "api"}
    assert recommendation_on(cluster, "web") is None
    assert recommendation_on(cluster, "api") is None
    assert code == 0 and plan["dry_run"] and result["dry_run"]
    assert len(plan["moves"]) >= 2
    assert all(m["outcome"] == "landed" for m in result["moves"])  # as planned, in the model
    assert gpufrag(["defrag", "--kubeconfig", str(cluster.plane.kubeconfig_path),
                    "--namespaces", cluster.namespace, "--dry-run",
                    "--move-not-actionable"]) == 0
    table = capsys.readouterr().out
    assert "defrag plan (dry run):" in table and "defrag cycle summary (dry run" in table
    # By default the V100 nodes are not actionable: their idle memory is the recommend-mode
    # replicas', which no right-sizing reclaims. They are named, and nothing is moved.
    code, plan, _ = run_defrag(cluster, "--dry-run", capsys=capsys, move_not_actionable=False)
    assert code == 0 and plan["moves"] == []
    holders = {w.split(" ")[0].split("/")[-1] for ws in plan["not_actionable"].values()
               for w in ws}
    assert {"web", "api"} <= holders, plan["not_actionable"]
    # A dry run writes nothing, and what the API server accepted is read back at once: no wait.
    assert cluster.layout() == before_layout
    assert cluster.hints() == before_hints
    assert cluster.measure() == before


def test_inspect_shows_every_placement_and_a_reservation_as_created(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """``gpufrag inspect`` against the live cluster: each pod on the node and GPUs its record
    names, with its share, and a reservation on the GPU it holds with its expiry."""
    custom = kubernetes.client.CustomObjectsApi(cluster.plane.api_client())
    expires = time.time() + 600
    hold = rsv.Reservation(name="inspect-hold", node=SINK, gpus=(0,), gpu_milli=200,
                           owner_uid="owner-inspect", owner_kind="ReplicaSet",
                           owner_name="inspect", namespace=cluster.namespace, expires=expires,
                           replaces=f"{cluster.namespace}/gone")
    custom.create_namespaced_custom_object(rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE,
                                           rsv.PLURAL, rsv.body(hold))
    try:
        capsys.readouterr()
        assert gpufrag(["inspect", "--kubeconfig", str(cluster.plane.kubeconfig_path),
                        "-o", "json"]) == 0
        data = json.loads(capsys.readouterr().out)
    finally:
        custom.delete_namespaced_custom_object(rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE,
                                               rsv.PLURAL, "inspect-hold")
    shown = {(h["pod"], n["node"], g["index"], h["milli"])
             for n in data["nodes"] for g in n["gpus"] for h in g["holders"] if "pod" in h}
    ours = {s for s in shown if s[0].startswith(f"{cluster.namespace}/")}
    placed = {}
    for pod in cluster.pods():
        meta, spec = pod["metadata"], pod["spec"]
        milli = int(spec["containers"][0]["resources"]["requests"][cv.RESOURCE_GPU_MILLI])
        placed[f"{cluster.namespace}/{meta['name']}"] = (spec["nodeName"], milli)
        recorded = (meta.get("annotations") or {}).get(cv.ANNOTATION_GPU_INDICES)
        if recorded:  # the GPU its record names (a pinned pod has none: the default rule's)
            assert {(g, m) for k, _, g, m in ours if k.endswith(f"/{meta['name']}")} == {
                (int(gpu), milli) for gpu in recorded.split(",")}
    assert {k: (node, m) for k, node, _, m in ours} == placed
    (sink,) = [n for n in data["nodes"] if n["node"] == SINK]
    held = [h for h in sink["gpus"][0]["holders"] if "reservation" in h]
    assert held == [{"reservation": "inspect-hold", "milli": 200,
                     "expires": rsv.rfc3339(expires)}]


def test_inspect_summary_and_plot_read_the_same_cluster(
        cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``gpufrag inspect --summary --plot FILE`` against the live cluster: the same nodes, idle
    ratio and trigger as the per-node view, every GPU counted once, the defrag state read from
    the hints ConfigMap (or said why not), and an SVG with a row per node."""
    kubeconfig = str(cluster.plane.kubeconfig_path)
    capsys.readouterr()
    assert gpufrag(["inspect", "--kubeconfig", kubeconfig, "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    picture = tmp_path / "fleet.svg"
    assert gpufrag(["inspect", "--kubeconfig", kubeconfig, "--summary", "--plot",
                    str(picture), "-o", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    summary = found["summary"]
    assert summary["nodes"] == len(data["nodes"]) == found["plot"]["nodes"]
    assert summary["gpus"] == sum(len(n["gpus"]) for n in data["nodes"])
    assert sum(summary["gpus_by_part"].values()) == pytest.approx(summary["gpus"], abs=0.01)
    assert summary["nodes_over_trigger"] == [
        n["node"] for n in data["nodes"] if n["trigger"] == "over"]
    assert summary["free_whole_gpus"] == data["cluster"]["free_whole_gpus"]
    # the hints ConfigMap is read: a count, or why it holds no state yet; never a refusal
    assert "may not get it" not in summary["evictions"]["detail"], summary["evictions"]
    assert summary["free_whole_gpus_gained"]["value"] is None
    svg = picture.read_text()
    assert all(f">{n['node']}<" in svg for n in data["nodes"])


def test_kubectl_runs_inspect_as_its_gpufrag_plugin(cluster: Cluster) -> None:
    """The real kubectl finds the installed ``kubectl-gpufrag`` entry point on PATH and runs
    ``inspect`` through it (kubectl forwards no global flag to a plugin: KUBECONFIG is read)."""
    scripts = Path(sys.executable).parent
    assert (scripts / "kubectl-gpufrag").exists(), "pip install -e . installs the entry point"
    env = {**os.environ, "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(cluster.plane.kubeconfig_path)}
    result = subprocess.run([str(cluster.plane.binary), "kubectl", "gpufrag", "inspect",
                             "--node", SINK, "-o", "json"], capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    (node,) = json.loads(result.stdout)["nodes"]
    assert node["node"] == SINK and len(node["gpus"]) == 2


def one_cycle_defragments_and_keeps_every_promise(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    before = cluster.measure()
    before_layout = cluster.layout()
    watcher = Watcher(cluster, competitor=cluster.binder.via_extender)
    watcher.start()
    try:
        code, plan, result = run_defrag(cluster, capsys=capsys)
    finally:
        watcher.stop_event.set()
        watcher.join(10)
    assert code == 0, result
    moves = plan["moves"]
    # The plan: small replicas off the V100 nodes, at most one web replica (its PDB allows one).
    assert len(moves) >= 2 and {m["source"] for m in moves} <= set(SOURCES)
    assert sum(1 for m in moves if m["pod"].split("/")[1].startswith("web")) <= 1
    assert SINK in {m["target"] for m in moves}
    assert result["ok"] and len(result["moves"]) == len(moves)

    # Each evicted pod is gone, its owner wrote a hint that named the planned target, and the
    # hint is gone again.
    evicted = {m["uid"] for m in moves}  # deletions complete asynchronously (pod completer)
    wait_until(lambda: not evicted & set(cluster.layout()) or None, timeout_s=WAIT_S,
               what="evicted pods gone")
    layout = {uid: v for uid, v in cluster.layout().items() if v[0] != COMPETITOR}
    for move in moves:  # (a failed watch can only make a hint look missed: say so)
        assert (move["owner_uid"], move["target"]) in watcher.hints_seen, watcher.errors
    assert not set(cluster.hints()) & {m["owner_uid"] for m in moves}
    if cluster.binder.via_extender:
        for outcome in result["moves"]:
            assert outcome["outcome"] == "landed" and outcome["landed_on"] == outcome["target"]

    # Reservations: one per move, on its target GPUs, all made before the first eviction, each
    # deleted once its replacement was bound (none left).
    assert not watcher.errors, watcher.errors
    specs = {f"{sp['replaces']['namespace']}/{sp['replaces']['name']}": (rv, sp)
             for rv, sp in watcher.reserved.values()}
    assert set(specs) == {m["pod"] for m in moves}
    for move in moves:
        spec = specs[move["pod"]][1]
        assert (spec["node"], spec["gpus"], spec["owner"]["uid"]) == (
            move["target"], move["target_gpus"], move["owner_uid"])
    first_eviction = min(watcher.pods[m["uid"]].deleting_rv for m in moves)
    assert max(rv for rv, _ in specs.values()) < first_eviction
    assert set(watcher.released) == set(watcher.reserved)
    assert reservations(cluster.plane, cluster.namespace) == []
    if cluster.binder.via_extender:
        # Each replacement took its reserved GPU; the competitor, created during the first
        # eviction, took none of them.
        by_name = {t.name: t for t in watcher.pods.values()}
        held: set[tuple[str, str]] = set()
        for outcome, move in zip(result["moves"], moves, strict=True):
            trace = by_name[outcome["replacement"].split("/")[1]]
            spec = specs[move["pod"]][1]
            assert (trace.node, trace.gpus) == (spec["node"], ",".join(map(str, spec["gpus"])))
            held |= {(spec["node"], str(g)) for g in spec["gpus"]}
        assert watcher.competitor_rv, "the competing pod was never created"
        # It was pending while at least one reservation still held its GPU (moves run one at a
        # time, so it exists before the last replacement is bound, usually before the first).
        assert watcher.competitor_rv < max(by_name[o["replacement"].split("/")[1]].bound_rv
                                           for o in result["moves"] if o["target"] == SINK)
        competitor = cluster.core.read_namespaced_pod(COMPETITOR, cluster.namespace)
        where = (competitor.spec.node_name or "",
                 (competitor.metadata.annotations or {}).get(cv.ANNOTATION_GPU_INDICES, ""))
        assert where not in held, f"the competitor took a reserved GPU: {where}"
        cluster.core.delete_namespaced_pod(COMPETITOR, cluster.namespace,
                                           grace_period_seconds=0)
        wait_until(lambda: all(p["metadata"]["name"] != COMPETITOR for p in cluster.pods())
                   or None, timeout_s=WAIT_S, what="the competitor gone")

    # Right-sizing: each Deployment carries the recommendation the cycle published, from the
    # 2 GiB its replicas use.
    for name in ("web", "api"):
        text = recommendation_on(cluster, name)
        assert text is not None, f"no recommendation on Deployment {name}"
        rec = parse_recommendation(text)["*"]
        # p95 of one hourly peak (2,048) x 1.15 + 256 MiB, in thousandths of a 32 GiB GPU: far
        # below the 300 milli (9,830 MiB) each replica reserves.
        assert (rec.peak_mib, rec.memory_mib, rec.milli) == (USED_MIB, 2612, 80)

    # Bare pods untouched; every Deployment back at full replicas; the PDB held.
    for name, (uid, node) in cluster.anchors.items():
        assert layout[uid] == (name, node)
    web, api = cluster.running("web", 2), cluster.running("api", 1)
    assert len(web) == 2 and len(api) == 1

    def full_replicas() -> bool | None:
        # Status lags the pods: the ReplicaSet, then the Deployment controller update it.
        for name, replicas in (("web", 2), ("api", 1)):
            status = cluster.apps.read_namespaced_deployment_status(name,
                                                                    cluster.namespace).status
            if not status.ready_replicas == replicas == status.available_replicas:
                return None
        return True

    wait_until(full_replicas, timeout_s=WAIT_S, what="web and api ready at full replicas")
    assert watcher.polls > 0, watcher.errors
    assert watcher.fewest_ready_web >= 1
    assert len(layout) == len(before_layout)

    # Read back from the API server (usage republished as the agent would): less fragmentation,
    # less reserved-but-unused memory, more whole GPUs free.
    cluster.publish_usage()
    after = cluster.measure()
    assert after.frag_ratio < before.frag_ratio
    assert after.idle_gib < before.idle_gib
    assert after.free_whole_gpus >= before.free_whole_gpus + 2
    assert after.idle_ratio < before.idle_ratio
    assert result["after"]["free_whole_gpus"] == after.free_whole_gpus
    return list(moves)


def the_state_remembers_the_moves_for_the_next_run(
        cluster: Cluster, moves: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """The defrag state annotation, read back from the API server, holds each move's source
    and target (the node cooldown) and the cycle's evictions (the daily budget); the next run
    reads them: its daily budget counts the evictions already made."""
    hints = cluster.core.read_namespaced_config_map(cv.HINTS_CONFIGMAP, cv.HINTS_NAMESPACE)
    state = parse_state((hints.metadata.annotations or {}).get(cv.ANNOTATION_DEFRAG_STATE))
    assert {m["source"] for m in moves} <= set(state.sources)
    assert {m["target"] for m in moves} <= set(state.targets)
    assert evictions_within(state.evictions, time.time()) >= len(moves)
    code, plan, _ = run_defrag(cluster, "--dry-run", "--max-evictions-per-day-pct", "0",
                               capsys=capsys)
    assert code == 0 and plan["moves"] == []
    daily = plan["daily_budget"]
    assert daily["spent"] >= len(moves) and daily["allowed"] == daily["left"] == 0
    assert daily["running_gpu_pods"] >= 3  # web x2 and api, Running


def a_rerun_continues_from_the_live_state(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """Idempotent: a second cycle plans from what is there now and never undoes the first."""
    before = cluster.measure()
    code, plan, result = run_defrag(cluster, capsys=capsys)
    assert code == 0 and result["ok"]
    cluster.publish_usage()
    after = cluster.measure()
    assert after.free_whole_gpus >= before.free_whole_gpus
    assert after.frag_gpus <= before.frag_gpus + 1e-9
    assert all(m["source"] != SINK for m in plan["moves"])

