"""The run: the before cluster, gpufrag-scheduler, stand-ins under load, the agent, one defrag.

Every gpufrag component runs one way, as in a cluster: its own ``gpufrag <command>`` process
(the extender behind kube-scheduler, ``gpufrag agent`` per node, ``gpufrag defrag``), and the
demo learns what each did only through the Kubernetes API (:mod:`devkit.demo.observe`): pods
and their GPUs, the scheduler's Scheduled Events, evictions and placement hints, and the
agent's usage annotation on each Node. No component's log or output is parsed; their logs and
the defrag controller's printed plan are kept under ``logs/`` for people to read.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

import kubernetes

from defrag.controller.measure import measure
from defrag.controller.snapshot import UsageSource, build_snapshot
from devkit.build import build_control_plane
from devkit.controlplane import ControlPlane
from devkit.demo.before import LegacyPod, spread_placement
from devkit.demo.coldloads import ColdLoads
from devkit.demo.load import STANDIN_MODEL, LoadResult, StandIn, _round, run_load
from devkit.demo.nvml_replay import (
    FakeProcRoot,
    GpuPod,
    live_model_memory,
    recorded_gpus,
    write_recording,
)
from devkit.demo.observe import ClusterObserver, ObservedMove, SeenPod
from devkit.demo.scenario import (
    BATCH_PODS,
    DEPLOYMENTS,
    MILLI_PER_GPU,
    BatchPod,
    ModelDeployment,
    NodeShape,
    node_layout,
)
from devkit.demo.summary import DemoOptions, DemoSummary, Phase, summary_table, write_plot
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.procs import wait_until
from devkit.stack import install_reservations_crd
from gpufrag import conventions as cv
from gpufrag.conventions import DEFAULT_NAMES
from gpufrag.errors import BadInput
from gpufrag.gpu_usage import NodeGpuUsage, parse
from gpufrag.nvml import GpuReadError, NoGpuError, NvmlApi, NvmlReader
from scheduler.core import TargetWorkload
from scheduler.kube.binder import KubeBinder
from scheduler.kube.convert import bound_gpus

NODE_LABEL = "demo.gpufrag.io/node"  # on every demo node, to tell them from others
WAIT_S = 90.0
AGENT_TIMEOUT_S = 60.0  # one 'gpufrag agent --once': start, one NVML reading, one patch


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and where its log is."""


class Demo:
    """One run of the demo against ``plane``; everything it starts is stopped by :meth:`close`
    (also on an exception or Ctrl-C)."""

    def __init__(self, options: DemoOptions, plane: ControlPlane, *, owns_plane: bool,
                 out: TextIO, nvml: NvmlApi | None = None) -> None:
        self.options = options
        self.plane = plane
        self.owns_plane = owns_plane
        self.out = out
        self.nvml = nvml  # the live NVML binding; None: pynvml (tests pass a recorded fake)
        self.started = time.monotonic()
        # Typed as Any: the client's models make every field Optional and its methods want
        # model objects where the API takes plain manifests (dicts) just as well.
        self.api: Any = plane.api_client()
        self.core: Any = kubernetes.client.CoreV1Api(self.api)
        self.apps: Any = kubernetes.client.AppsV1Api(self.api)
        self.policy: Any = kubernetes.client.PolicyV1Api(self.api)
        self.namespace = "gpufrag-demo" if owns_plane else f"gpufrag-demo-{uuid.uuid4().hex[:6]}"
        self.nodes = node_layout(options.nodes)
        self.shapes = dict(self.nodes)
        self.logs_dir = options.out / "logs"
        self.work_dir = Path(tempfile.mkdtemp(prefix="gpufrag-demo-"))
        # Per fake node, what its agent reads: --nvml-recording and --proc-root.
        self.agent_dir = self.work_dir / "agent"
        self.procs: dict[str, FakeProcRoot] = {}
        self.observer: ClusterObserver | None = None
        self.extender: ExtenderProcess | None = None
        self.scheduler_process = f"gpufrag-demo-{uuid.uuid4().hex[:6]}"
        self.standins: list[StandIn] = []
        self.created_nodes: list[str] = []
        self.created_hints_namespace = False
        self.model_used_mib = {d.name: d.used_mib for d in DEPLOYMENTS}
        self.gpu_memory_source = "recorded"
        self.phases_s: dict[str, float] = {}
        self._phase_started = time.monotonic()
        self._legacy_counts = ColdLoads()
        self._scheduled_seen = 0  # Scheduled Events counted by the scale-up

    # -- narration -------------------------------------------------------------------------

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", file=self.out, flush=True)

    def detail(self, message: str) -> None:
        print(f"          {message}", file=self.out, flush=True)

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases_s[name] = round(now - self._phase_started, 1)
        self._phase_started = now

    # -- the steps -------------------------------------------------------------------------

    def run(self) -> DemoSummary:
        self.options.out.mkdir(parents=True, exist_ok=True)
        # A fresh logs/ each run: the steps read the extender's and the stand-ins' logs back.
        shutil.rmtree(self.logs_dir, ignore_errors=True)
        self.logs_dir.mkdir(parents=True)
        self._make_nodes()
        # Watching from before the first pod exists: every bind, eviction and hint is seen.
        self.observer = ClusterObserver(self.plane.new_api_client(), self.namespace).start()
        legacy = self._legacy_state()
        self.standins = [StandIn.start(d.name, self.logs_dir / f"serve-{d.name}.log")
                         for d in DEPLOYMENTS]
        self.lap("before_state")

        self._start_gpufrag_scheduler()
        scale_up = self._scale_up(legacy)
        self.lap("gpufrag_scheduler")

        self._ready_standins()
        self.lap("serving")

        self._publish_usage("before")
        before_measure, before_layout = self._measure()
        before_load = self._load("before")
        before = Phase(before_measure, before_layout, before_load, self._legacy_counts.as_dict(),
                       "spread placement")
        self.lap("measure_before")

        defrag = self._defrag()
        self._wait_deployments()
        self._wait_scheduled(self._scheduled_seen + sum(1 for m in defrag["moves"]
                                                        if m["landed_on"]))
        replacements = self._count_replacements(scale_up)
        self.lap("defrag")

        self._publish_usage("after")
        after_measure, after_layout = self._measure()
        after_load = self._load("after")
        after = Phase(after_measure, after_layout, after_load, replacements.as_dict(),
                      "gpufrag-scheduler")
        self.lap("measure_after")

        summary = DemoSummary(
            options=self.options,
            nodes=[{"name": n, "product": s.product, "gpus": s.gpus,
                    "gpu_memory_mib": s.gpu_memory_mib} for n, s in self.nodes],
            gpu_memory_source=self.gpu_memory_source, before=before, after=after,
            deployments=self._deployment_status(), defrag=defrag,
            standins=[{"deployment": s.deployment, "url": s.url, "model": STANDIN_MODEL,
                       "model_load_s": _round(s.load_s, 3)} for s in self.standins],
            phases_s=self.phases_s, runtime_s=time.monotonic() - self.started,
            extender_url=self.extender.url if self.extender is not None else "",
            namespace=self.namespace)
        self._report(summary)
        return summary

    def _make_nodes(self) -> None:
        existing = {n.metadata.name for n in self.core.list_node().items}
        clash = sorted(existing & {name for name, _ in self.nodes})
        if clash:
            raise DemoError(f"nodes {', '.join(clash)} already exist on this cluster; remove "
                            "them or run the demo on its own control plane")
        self.plane.create_namespace(self.namespace)
        if cv.HINTS_NAMESPACE not in {n.metadata.name for n in self.core.list_namespace().items}:
            self.plane.create_namespace(cv.HINTS_NAMESPACE)
            self.created_hints_namespace = True
        for name, shape in self.nodes:
            self.plane.create_gpu_node(name, shape.gpus, shape.product, shape.gpu_memory_mib,
                                       cpu_milli=96_000, memory_mib=512 * 1024,
                                       labels={NODE_LABEL: "true"})
            self.created_nodes.append(name)
        counts: dict[NodeShape, int] = {}
        for _, shape in self.nodes:
            counts[shape] = counts.get(shape, 0) + 1
        self.say(f"1/6 cluster: {len(self.nodes)} fake GPU nodes on the local control plane "
                 f"({self.plane.server}): " + ", ".join(
                     f"{n} x {s.product} ({s.gpus} GPUs, {s.gpu_memory_mib // 1024} GiB)"
                     for s, n in counts.items()))

    def _legacy_state(self) -> ColdLoads:
        """Batch pods and the Deployments' first replicas, bound where spreading puts them."""
        rng = random.Random(self.options.seed)
        for d in DEPLOYMENTS:
            self.apps.create_namespaced_deployment(self.namespace, deployment_manifest(d))
            self.policy.create_namespaced_pod_disruption_budget(self.namespace, {
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": d.name},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": d.name}}}})
        pending = wait_until(lambda: self._pending_replicas(), timeout_s=WAIT_S,
                             what="the Deployments' first replicas to be created")
        batch = [LegacyPod(f"batch/{b.name}", whole=b.gpus) for b in BATCH_PODS]
        replicas = [LegacyPod(key, milli=d.gpu_milli, products=d.products)
                    for key, d in sorted(pending.items())]
        rng.shuffle(batch)
        rng.shuffle(replicas)
        placed = spread_placement(self.nodes, batch + replicas, rng)

        for b in BATCH_PODS:
            node, gpus = placed[f"batch/{b.name}"]
            self.core.create_namespaced_pod(self.namespace, batch_pod_manifest(b, node, gpus))
        binder = KubeBinder(self.api, DEFAULT_NAMES)
        counts = ColdLoads()
        for pod in replicas:  # in placement order: the order the cold loads happened
            node, gpus = placed[pod.key]
            name, uid = pod.key.split("/")
            binder.bind(self.namespace, name, uid, node, gpus)
            d = pending[pod.key]
            counts.place(node, (d.model, d.version))
        self._legacy_counts = counts
        self._wait_running(sum(d.legacy_replicas for d in DEPLOYMENTS) + len(BATCH_PODS))
        spread = len({placed[p.key] for p in replicas})
        self.say(f"   before: {len(BATCH_PODS)} batch pods ({sum(b.gpus for b in BATCH_PODS)} "
                 f"whole GPUs) and {len(replicas)} replicas of {len(DEPLOYMENTS)} model "
                 f"Deployments bound directly where a spreading scheduler puts them "
                 f"({spread} GPUs opened for {len(replicas)} GPU shares); "
                 f"{counts.avoided} of {counts.placements} replicas landed warm")
        return counts

    def _pending_replicas(self) -> dict[str, ModelDeployment] | None:
        """uid-keyed ``name/uid`` -> Deployment of every pod, once all first replicas exist."""
        by_app = {d.name: d for d in DEPLOYMENTS}
        found: dict[str, ModelDeployment] = {}
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            d = by_app.get((pod.metadata.labels or {}).get("app", ""))
            if d is not None and not pod.spec.node_name:
                found[f"{pod.metadata.name}/{pod.metadata.uid}"] = d
        wanted = sum(d.legacy_replicas for d in DEPLOYMENTS)
        return found if len(found) == wanted else None

    def _start_gpufrag_scheduler(self) -> None:
        # The defrag cycle reserves each replacement's GPU before it evicts: the CRD first.
        install_reservations_crd(self.plane)
        self.extender = ExtenderProcess(self.plane, self.logs_dir / "extender.log")
        self.extender.start()
        self.plane.start_scheduler(self.scheduler_process,
                                   gpufrag_scheduler_config(self.extender.url))
        self.say(f"   gpufrag-scheduler: kube-scheduler + gpufrag extender (filter, prioritize, "
                 f"bind) at {self.extender.url}; log {self.extender.log_path}")

    def _scale_up(self, legacy: ColdLoads) -> ColdLoads:
        self.say("2/6 traffic grows: the model Deployments scale up; gpufrag-scheduler places "
                 "the new replicas (FGD + model-version affinity)")
        for d in DEPLOYMENTS:
            self.apps.patch_namespaced_deployment_scale(d.name, self.namespace,
                                                        {"spec": {"replicas": d.replicas}})
        self._wait_running(sum(d.replicas for d in DEPLOYMENTS) + len(BATCH_PODS))
        self._wait_scheduled(sum(d.replicas - d.legacy_replicas for d in DEPLOYMENTS))
        counts = legacy.phase()
        for node, d, warm in self._binds(counts, since=0):
            self.detail(f"{d.name:<7} {d.model}:{d.version} -> {node:<12} "
                        f"{'warm: ran this version already' if warm else 'cold load'}")
        self._scheduled_seen = len(self._observer().scheduled())
        self.say(f"   cold loads avoided by affinity: {counts.avoided} of {counts.placements} "
                 f"new replicas (spread placement: {legacy.avoided} of {legacy.placements})")
        return counts

    def _observer(self) -> ClusterObserver:
        assert self.observer is not None, "run() starts the observer first"
        return self.observer

    def _wait_scheduled(self, count: int) -> None:
        """kube-scheduler records a Scheduled Event once a bind succeeded (through the
        extender here); the event reaches the API server a moment later: wait for it."""
        observer = self._observer()
        wait_until(lambda: len(observer.scheduled()) >= count or None, timeout_s=30,
                   what=f"{count} Scheduled Events from {cv.SCHEDULER_NAME} in "
                        f"{self.namespace}")

    def _bound(self, uid: str) -> SeenPod:
        """The pod as the watch saw it once bound (the Event can arrive before the watch)."""
        observer = self._observer()

        def bound() -> SeenPod | None:
            pod = observer.pod(uid)
            return pod if pod is not None and pod.node else None

        return wait_until(bound, timeout_s=30, what=f"the pod watch to see pod {uid} bound")

    def _binds(self, counts: ColdLoads, since: int) -> Iterator[tuple[str, ModelDeployment, bool]]:
        """gpufrag-scheduler's binds in this namespace (its Scheduled Events) from the
        ``since``-th on, in bind order, counted into ``counts``; the node is the pod's
        ``spec.nodeName``."""
        by_app = {d.name: d for d in DEPLOYMENTS}
        for scheduled in self._observer().scheduled()[since:]:
            pod = self._bound(scheduled.pod_uid)
            d = by_app.get(pod.app)
            if d is not None:
                yield pod.node, d, counts.place(pod.node, (d.model, d.version))

    def _count_replacements(self, counts: ColdLoads) -> ColdLoads:
        """Add the defrag cycle's replacements to the scale-up's count: together they are what
        gpufrag-scheduler placed."""
        for node, d, warm in self._binds(counts, since=self._scheduled_seen):
            self.detail(f"replacement {d.name:<7} -> {node:<12} "
                        f"{'warm: ran this version already' if warm else 'cold load'}")
        return counts

    def _ready_standins(self) -> None:
        for s in self.standins:
            s.wait_ready()
        self.say(f"3/6 serving: {len(self.standins)} x 'gpufrag serve --model {STANDIN_MODEL}' "
                 "stand in for the Deployments' pods (real HTTP, dynamic batching, ONNX model "
                 "on this machine)")
        for s in self.standins:
            self.detail(f"{s.deployment:<7} {s.url}/v2/models/{s.deployment}  "
                        f"(model loaded in {s.load_s:.3f}s)")

    def _live_memory(self) -> None:
        """With a GPU here, a stand-in's live NVML reading replaces its model's recorded
        figure (it is what that model's replicas would use)."""
        reader = NvmlReader(self.nvml)
        try:
            reader.open()
        except (NoGpuError, GpuReadError) as e:
            self.detail(f"no GPU on this machine ({e}):")
            self.detail("GPU memory comes from RECORDED NVML readings (per-model figures): one "
                        "--nvml-recording file per node, read by that node's agent")
            return
        try:
            readings = reader.read()
        finally:
            reader.close()
        live = live_model_memory(readings, {s.deployment: s.process.pid for s in self.standins})
        self.model_used_mib.update(live)
        names = ", ".join(sorted({r.product for r in readings}))
        if live:
            self.gpu_memory_source = "nvml (live, stand-ins) + recorded"
            self.detail(f"GPU present ({names}): live NVML readings of the stand-ins set "
                        f"{', '.join(f'{k}={v} MiB' for k, v in sorted(live.items()))}; "
                        "the other figures are recorded")
        else:
            self.detail(f"GPU present ({names}) but the stand-ins run on the CPU: GPU memory "
                        "comes from RECORDED NVML readings, one --nvml-recording file per node")

    def _publish_usage(self, phase: str) -> None:
        """Run ``gpufrag agent --once`` per node, each its own process as on a DaemonSet's
        node, then read what they published: the usage annotation on each Node.

        Per node the demo first writes what that agent reads there: the recorded NVML
        readings (``--nvml-recording``: one process per pod on each of its GPUs) and a proc
        root whose cgroup files name those processes' pods (``--proc-root``); the agent maps
        pid -> cgroup -> pod UID -> pod (listed from the API server) itself.
        """
        if phase == "before":
            self.say("4/6 GPU memory: 'gpufrag agent --once --nvml-recording' per node publishes "
                     f"the {cv.ANNOTATION_GPU_USAGE} annotation (NVML -> pid -> cgroup -> pod)")
            self._live_memory()
        pods = self._gpu_pods()
        started = time.time()
        commands = []
        for node, shape in self.nodes:
            proc = self.procs.setdefault(node, FakeProcRoot(self.agent_dir / node / "proc"))
            recording = write_recording(
                self.agent_dir / node / "nvml.json",
                recorded_gpus(node, shape, pods.get(node, []), proc.pid_of))
            commands.append((node, self.agent_command(node, recording, proc.root)))
        workers = max(1, min(len(commands), os.cpu_count() or 2))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="demo-agent") as pool:
            codes = list(pool.map(lambda c: (c[0], self._run_agent(*c)), commands))
        failed = [f"{node} (exit {code}, log {self._agent_log(node)})"
                  for node, code in codes if code != 0]
        if failed:
            raise DemoError(f"the node agent failed on {', '.join(failed)}")
        published = self._published_usage(since=started)
        attributed = {p.uid for usage in published.values() for g in usage.gpus for p in g.pods}
        expected = sum(len(v) for v in pods.values())
        self.detail(f"{len(published)} agents published (read back from the Nodes): "
                    f"{len(attributed)} of {expected} GPU pods attributed, "
                    f"{sum(g.memory_used_mib for u in published.values() for g in u.gpus):,} "
                    f"MiB in use ({phase} the defrag cycle); logs "
                    f"{self.logs_dir / 'agent-<node>.log'}")

    def agent_command(self, node: str, recording: Path, proc_root: Path) -> list[str]:
        """``gpufrag agent`` for one fake node: once, on its recording, against this cluster."""
        return [sys.executable, "-m", "gpufrag.cli", "agent", "--node-name", node, "--once",
                "--metrics-port", "0", "--kubeconfig", str(self.plane.kubeconfig_path),
                "--proc-root", str(proc_root), "--nvml-recording", str(recording)]

    def _agent_log(self, node: str) -> Path:
        return self.logs_dir / f"agent-{node}.log"

    def _run_agent(self, node: str, command: Sequence[str]) -> int:
        env = {**os.environ, "GPUFRAG_LOG_FORMAT": "json"}
        with self._agent_log(node).open("ab") as log:
            try:
                done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      stdin=subprocess.DEVNULL, timeout=AGENT_TIMEOUT_S,
                                      check=False)
            except subprocess.TimeoutExpired:
                return -1
        return done.returncode

    def _published_usage(self, since: float) -> dict[str, NodeGpuUsage]:
        """node -> the usage its agent published (the Node's annotation), each read at or
        after ``since``: the agents exit only once their patch is made, so anything else is
        a fault, not a wait."""
        found: dict[str, NodeGpuUsage] = {}
        problems = []
        for n in self.core.list_node(label_selector=f"{NODE_LABEL}=true").items:
            name = n.metadata.name
            text = (n.metadata.annotations or {}).get(cv.ANNOTATION_GPU_USAGE)
            if not text:
                problems.append(f"{name}: no {cv.ANNOTATION_GPU_USAGE} annotation")
                continue
            try:
                usage = parse(text, source=f"node {name} annotation {cv.ANNOTATION_GPU_USAGE}")
            except BadInput as e:
                problems.append(str(e))
                continue
            if usage.timestamp < since - 1.0:  # 1 s: the clocks are the same, the floats not
                problems.append(f"{name}: the usage is from before this run of the agents")
            found[name] = usage
        if problems:
            raise DemoError("the agents' published usage is not there: " + "; ".join(problems))
        return found

    def _gpu_pods(self) -> dict[str, list[GpuPod]]:
        """node -> the demo's pods on it, with their GPUs (as the binder recorded them) and
        recorded memory per GPU."""
        by_app = {d.name: d for d in DEPLOYMENTS}
        batch = {b.name: b for b in BATCH_PODS}
        found: dict[str, list[GpuPod]] = {}
        for item in self.core.list_namespaced_pod(self.namespace).items:
            pod = self.api.sanitize_for_serialization(item)
            meta, node = item.metadata, item.spec.node_name
            gpus = bound_gpus(pod, DEFAULT_NAMES)
            if not node or meta.deletion_timestamp is not None or not gpus:
                continue
            d = by_app.get((meta.labels or {}).get("app", ""))
            if d is not None:
                used = self.model_used_mib[d.name]
            elif meta.name in batch:
                used = int(batch[meta.name].used_fraction * self.shapes[node].gpu_memory_mib)
            else:
                continue
            found.setdefault(node, []).append(GpuPod(meta.uid, gpus, used))
        return found

    def _measure(self) -> tuple[dict[str, Any], dict[str, list[int]]]:
        """Idle memory and fragmentation with the defrag controller's own functions, on what the API
        server holds for the demo's nodes (the agent's annotations included)."""

        nodes = [self.api.sanitize_for_serialization(n) for n in
                 self.core.list_node(label_selector=f"{NODE_LABEL}=true").items]
        names = {n["metadata"]["name"] for n in nodes}
        pods = [self.api.sanitize_for_serialization(p)
                for p in self.core.list_pod_for_all_namespaces().items
                if p.spec.node_name in names]
        snap, problems = build_snapshot(nodes, pods, [], UsageSource(8, time.time()))
        if problems or snap.notes:
            raise DemoError("the cluster could not be read as the defrag controller reads it: "
                            + "; ".join([*problems, *(n.reason for n in snap.notes)]))
        state = snap.state
        workload = TargetWorkload.from_pods([p.pod for p in state.pods.values()])
        summary = measure(state, snap.usage, workload).summary.as_dict()
        layout = {name: [int(MILLI_PER_GPU - f)
                         for f in state.gpu_free[state.index[name], :self.shapes[name].gpus]]
                  for name, _ in self.nodes}
        return summary, layout

    def _load(self, phase: str) -> LoadResult:
        targets = [(s.url, s.deployment) for s in self.standins]
        result = run_load(targets, rate_per_target=self.options.rate_per_s,
                          seconds=self.options.load_s,
                          seed=self.options.seed + (0 if phase == "before" else 1))
        self.detail(f"load ({phase}): {result.requests} requests, open loop at "
                    f"{self.options.rate_per_s * len(targets):.0f}/s for "
                    f"{self.options.load_s:.0f}s: p50 {result.p50_ms:.1f} ms, p99 "
                    f"{result.p99_ms:.1f} ms, {result.errors} errors, mean batch "
                    f"{result.mean_batch:.2f}")
        return result

    def _wait_pdbs(self) -> None:
        def allowed() -> bool | None:
            for d in DEPLOYMENTS:
                status = self.policy.read_namespaced_pod_disruption_budget_status(
                    d.name, self.namespace).status
                if status is None or (status.disruptions_allowed or 0) < 1:
                    return None
            return True

        wait_until(allowed, timeout_s=WAIT_S, what="the disruption controller to count the "
                                                   "Deployments' ready pods")

    def _defrag(self) -> dict[str, Any]:
        """One ``gpufrag defrag`` cycle as a CronJob would run it, seen from the cluster: the
        hints it wrote, the pods it evicted, where each replacement was bound. Its printed
        plan (triggered nodes, why other pods were not moved, its own predictions) goes to
        ``logs/defrag-plan.txt`` for people to read; the demo does not parse it."""
        self._wait_pdbs()
        self.say("5/6 one defrag cycle: 'gpufrag defrag' (not a dry run) plans moves, writes "
                 "placement hints, evicts through the Eviction API; the extender follows the "
                 "hints")
        observer = self._observer()
        since = observer.mark()
        command = [sys.executable, "-m", "gpufrag.cli", "defrag", "--kubeconfig",
                   str(self.plane.kubeconfig_path), "--namespaces", self.namespace,
                   "--max-evictions-total", "8",
                   "--max-evictions-per-node", "2", "--max-evictions-per-namespace", "8",
                   "--bind-timeout-s", str(int(WAIT_S)),
                   # The demo's workloads keep the default right-sizing mode (recommend): no
                   # replacement reserves less, so only consolidating moves are on offer.
                   "--move-not-actionable"]
        log_path = self.logs_dir / "defrag.log"
        plan_path = self.logs_dir / "defrag-plan.txt"
        env = {**os.environ, "GPUFRAG_LOG_FORMAT": "json"}
        with log_path.open("ab") as log, plan_path.open("wb") as plan:
            done = subprocess.run(command, stdout=plan, stderr=log, env=env,
                                  stdin=subprocess.DEVNULL, timeout=600, check=False)
        moves = self._observed_moves(since, wait=done.returncode == 0)
        owners = {p.owner_uid for p in observer.pods() if p.owner_uid}
        started = [h for h in observer.hints(since) if h.owner_uid in owners]
        landed = sum(1 for m in moves if m.on_hint)
        live = [p for p in observer.pods() if p.live]
        self.detail(f"{'pod':<30} {'GPU':>5} {'from':<12} {'hinted':<12} {'landed on':<12} "
                    "source GPU")
        rows = []
        for m in moves:
            d = next((d for d in DEPLOYMENTS if d.name == m.evicted.app), None)
            milli = d.gpu_milli if d is not None else 0
            emptied = not any(p.node == m.evicted.node and set(p.gpus) & set(m.evicted.gpus)
                              for p in live)
            self.detail(f"{m.evicted.name:<30} {milli:>4}m {m.evicted.node:<12} "
                        f"{','.join(m.hinted) or '-':<12} {m.landed_on or 'not bound':<12} "
                        f"{'emptied' if emptied else 'shared':<10}"
                        + ("  hint followed" if m.on_hint else ""))
            rows.append({"pod": m.evicted.key, "uid": m.evicted.uid, "gpu_milli": milli,
                         "source": m.evicted.node, "source_gpus": list(m.evicted.gpus),
                         "target": m.hinted[0] if m.hinted else "", "hinted": list(m.hinted),
                         "landed_on": m.landed_on,
                         "replacement": m.replacement.key if m.replacement else "",
                         "outcome": ("landed" if m.on_hint else "landed elsewhere"
                                     if m.landed_on else "not bound"),
                         "source_gpus_emptied": emptied})
        refused = max(0, len(started) - len(moves))
        self.say(f"   defrag exit {done.returncode}: {len(started)} moves started (a placement "
                 f"hint each), {len(moves)} pods evicted"
                 + (f", {refused} refused" if refused else "")
                 + f", {landed} replacements landed on the hinted node (seen through the API "
                 f"server); its plan: {plan_path}, log {log_path}")
        return {"exit_code": done.returncode, "moves_planned": len(started),
                "evictions": len(moves), "moves": rows, "landed_on_hint": landed,
                "hints": [{"owner_uid": h.owner_uid, "node": h.node} for h in started],
                "plan_file": str(plan_path), "log": str(log_path)}

    def _observed_moves(self, since: int, *, wait: bool) -> list[ObservedMove]:
        """The cycle's moves once the pod watch has caught up with the cluster (every pod a
        fresh list shows is seen, every pod gone is seen gone) and, when ``wait`` (the cycle
        finished), each evicted pod's hint and bound replacement are seen too: the controller
        writes the hint before it evicts and returns only once the replacement is bound."""
        observer = self._observer()

        def settled() -> list[ObservedMove] | None:
            listed = {p.metadata.uid for p in self.core.list_namespaced_pod(self.namespace).items}
            seen = {p.uid for p in observer.pods() if not p.deleted}
            moves = observer.moves(since)
            if listed != seen or (wait and not all(m.hinted and m.landed_on for m in moves)):
                return None
            return moves

        return wait_until(settled, timeout_s=WAIT_S,
                          what="the pod and hint watches to see the defrag cycle's hints, "
                               "evictions and bound replacements")

    def _wait_running(self, count: int) -> None:
        def settled() -> bool | None:
            pods = self.core.list_namespaced_pod(self.namespace).items
            live = [p for p in pods if p.metadata.deletion_timestamp is None]
            running = [p for p in live if p.spec.node_name and p.status is not None
                       and p.status.phase == "Running"]
            return (len(running) == len(live) == count) or None

        wait_until(settled, timeout_s=WAIT_S, what=f"{count} running pods in {self.namespace}")

    def _wait_deployments(self) -> None:
        def full() -> bool | None:
            for d in DEPLOYMENTS:
                status = self.apps.read_namespaced_deployment_status(d.name,
                                                                     self.namespace).status
                if (status.ready_replicas or 0) != d.replicas or (
                        status.available_replicas or 0) != d.replicas:
                    return None
            return True

        wait_until(full, timeout_s=WAIT_S, what="every Deployment back at full replicas")
        self._wait_running(sum(d.replicas for d in DEPLOYMENTS) + len(BATCH_PODS))

    def _deployment_status(self) -> list[dict[str, Any]]:
        rows = []
        for d in DEPLOYMENTS:
            status = self.apps.read_namespaced_deployment_status(d.name, self.namespace).status
            rows.append({"name": d.name, "model": d.model, "version": d.version,
                         "gpu_milli": d.gpu_milli, "replicas": d.replicas,
                         "ready_replicas": status.ready_replicas or 0,
                         "available_replicas": status.available_replicas or 0,
                         "used_mib": self.model_used_mib[d.name]})
        return rows

    def _report(self, summary: DemoSummary) -> None:
        out = self.options.out
        (out / "demo_summary.json").write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
        write_plot(summary, out / "demo.png")
        self.say("6/6 before / after the defrag cycle (measured from the API server with the "
                 "defrag controller's functions):")
        print(summary_table(summary), file=self.out)
        print(f"  GPU memory: {summary.gpu_memory_source} NVML readings, through the node agent."
              f"\n  p99: {len(self.standins)} gpufrag serve stand-ins on this machine, which the "
              "defrag cycle does not move; it shows\n  the serving path stayed healthy, and its "
              "change is this machine's noise, not a placement effect.", file=self.out)
        self.say(f"wrote {out / 'demo_summary.json'} and {out / 'demo.png'} "
                 f"(runtime {summary.runtime_s:.0f}s)")

    # -- keep running, teardown --------------------------------------------------------------

    def wait_for_interrupt(self) -> None:
        kubectl = self.plane.binary.parent / "kubectl"
        print(f"\nthe cluster keeps running; Ctrl-C stops everything.\n"
              f"  export KUBECONFIG={self.plane.kubeconfig_path}\n"
              f"  {kubectl} -n {self.namespace} get pods -o wide\n"
              f"  {kubectl} get nodes -L {cv.LABEL_GPU_PRODUCT}", file=self.out, flush=True)
        for s in self.standins:
            print(f"  curl {s.url}/v2/models/{s.deployment}", file=self.out)
        node, _ = self.nodes[0]
        proc = self.procs.get(node)
        if proc is not None:  # the agent as the demo ran it, to try by hand
            print("  " + " ".join(self.agent_command(node, self.agent_dir / node / "nvml.json",
                                                     proc.root)), file=self.out)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(1.0)
        print("stopping everything the demo started ...", file=self.out, flush=True)

    def close(self) -> None:
        """Stop what this run started; on a shared control plane also delete what it made."""
        for s in self.standins:
            with contextlib.suppress(Exception):
                s.stop()
        with contextlib.suppress(Exception):
            self.plane.stop_scheduler(self.scheduler_process)
        if self.extender is not None:
            with contextlib.suppress(Exception):
                self.extender.stop()
        if self.observer is not None:
            with contextlib.suppress(Exception):
                self.observer.stop()
        if not self.owns_plane:
            with contextlib.suppress(kubernetes.client.ApiException):
                self.core.delete_namespace(self.namespace)
            for name in self.created_nodes:
                with contextlib.suppress(kubernetes.client.ApiException):
                    self.core.delete_node(name)
            if self.created_hints_namespace:
                with contextlib.suppress(kubernetes.client.ApiException):
                    self.core.delete_namespace(cv.HINTS_NAMESPACE)
        shutil.rmtree(self.work_dir, ignore_errors=True)


def deployment_manifest(d: ModelDeployment) -> dict[str, Any]:
    labels = {"app": d.name, cv.LABEL_MODEL: d.model, cv.LABEL_MODEL_VERSION: d.version}
    annotations = {cv.ANNOTATION_GPU_SPEC: "|".join(d.products)} if d.products else {}
    milli = str(d.gpu_milli)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": d.name, "labels": labels},
        "spec": {"replicas": d.legacy_replicas, "selector": {"matchLabels": {"app": d.name}},
                 "template": {"metadata": {"labels": labels, "annotations": annotations},
                              "spec": {
                                  "schedulerName": cv.SCHEDULER_NAME,
                                  "terminationGracePeriodSeconds": 0,
                                  "containers": [{
                                      "name": "server",
                                      "image": f"gpufrag-demo/{d.model}:{d.version}",
                                      "resources": {
                                          "requests": {"cpu": "1", "memory": "2Gi",
                                                       cv.RESOURCE_GPU_MILLI: milli},
                                          "limits": {cv.RESOURCE_GPU_MILLI: milli}}}]}}},
    }


def batch_pod_manifest(b: BatchPod, node: str, gpus: tuple[int, ...]) -> dict[str, Any]:
    whole = str(b.gpus)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": b.name, "labels": {"demo.gpufrag.io/kind": "batch"},
                     "annotations": {cv.ANNOTATION_GPU_INDICES: ",".join(map(str, gpus))}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "gpufrag-demo/batch:latest",
                                 "resources": {"requests": {"cpu": "4", "memory": "16Gi",
                                                            cv.RESOURCE_GPU: whole},
                                               "limits": {cv.RESOURCE_GPU: whole}}}]},
    }


def run_demo(options: DemoOptions, *, plane: ControlPlane | None = None,
             out: TextIO | None = None, nvml: NvmlApi | None = None,
             progress: TextIO | None = None) -> DemoSummary:
    """Run the demo; on its own control plane (built and started here, stopped at the end)
    unless ``plane`` is given, in which case only what the demo made is removed."""
    out = out if out is not None else sys.stdout
    with contextlib.ExitStack() as stack:
        owns = plane is None
        if plane is None:
            binary = build_control_plane(progress=progress if progress is not None else sys.stderr)
            started = time.monotonic()
            print("starting the local control plane (etcd, kube-apiserver, controller-manager, "
                  "kube-scheduler) ...", file=out, flush=True)
            plane = stack.enter_context(ControlPlane(binary))
            print(f"control plane up in {time.monotonic() - started:.1f}s", file=out, flush=True)
        demo = Demo(options, plane, owns_plane=owns, out=out, nvml=nvml)
        stack.callback(demo.close)
        summary = demo.run()
        if options.keep_running:
            demo.wait_for_interrupt()
        return summary
    raise AssertionError("unreachable")  # pragma: no cover  (mypy: the with block returns)
