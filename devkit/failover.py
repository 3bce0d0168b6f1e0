"""gpufrag-scheduler in its supported HA topology on the local control plane: replicas of
kube-scheduler with its own leader election (a Lease), each with the extender as its sidecar.

The dev kit's other schedulers run with leader election off (one replica each, see
:func:`devkit.controlplane.scheduler_config`); here it is on, because what is measured is what
happens when the leader dies mid-bind: its extender dies with it (a sidecar shares the pod), the
standby's kube-scheduler takes the Lease once it expires, and its own extender, which has been
watching all along, decides from then on. :func:`run_failover` kills the leader ``kills`` times
while pods keep arriving, and counts what a failover must never do: lose a pod (left pending
while it fits), give a GPU twice (the extender's recorded GPUs over-committed), or hand out a
GPU a reservation holds: before the first kill it reserves a few free whole GPUs, as a defrag
cycle does for a replacement on its way, for an owner that never comes, and counts the pods
given one of them by any leader.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

import kubernetes
import numpy as np
import yaml

from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.fleet import (
    Fleet,
    create_pods,
    list_pods,
    placement,
    pod_body,
    resident_state,
    settled,
    unschedulable,
)
from devkit.procs import (
    EXIT_WITH_PARENT_ENV,
    ComponentProcess,
    free_port,
    http_get,
    insecure_tls,
    signal_group,
    wait_until,
)
from gpufrag.conventions import HINTS_NAMESPACE, SCHEDULER_NAME
from scheduler.core import MILLI_PER_GPU, TargetWorkload
from scheduler.kube import reservations as rsv
from scheduler.kube.convert import bound_gpus, node_name_of
from scheduler.kube.reservations import Reservation

LEASE_NAME: Final = "gpufrag-scheduler"
LEASE_NAMESPACE: Final = "kube-system"
# kube-scheduler's defaults: what a cluster that sets nothing fails over in.
LEADER_ELECTION: Final = {"leaderElect": True, "resourceLock": "leases",
                          "resourceName": LEASE_NAME, "resourceNamespace": LEASE_NAMESPACE,
                          "leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "2s"}
ACQUIRED: Final = "Successfully acquired lease"
# Whole GPUs reserved through the kills, and for how long.
HELD_GPUS: Final = 4
HOLD_S: Final = 3600.0


@dataclass
class Replica:
    """One replica: kube-scheduler and its extender sidecar, started and killed together."""

    name: str
    extender: ExtenderProcess
    scheduler: ComponentProcess

    def leading(self) -> bool:
        return self.scheduler.running() and ACQUIRED in self.scheduler.log_path.read_text(
            errors="replace")

    def kill(self) -> None:
        """SIGKILL both, as a node dying or the pod's OOM kill would."""
        signal_group(self.scheduler.process.pid, signal.SIGKILL)
        if self.extender.process is not None:
            self.extender.process.kill()
        self.scheduler.process.wait(10)
        self.extender.stop()

    def stop(self) -> None:
        self.scheduler.stop()
        self.extender.stop()


def start_replica(plane: ControlPlane, name: str, folder: Path) -> Replica:
    """A replica whose kube-scheduler runs for the Lease (it may be the standby)."""
    extender = ExtenderProcess(plane, folder / f"{name}-extender.log", log_level="info").start()
    config = yaml.safe_load(gpufrag_scheduler_config(extender.url))
    config["clientConnection"] = {"kubeconfig": str(plane.kubeconfig_path), "qps": 1000,
                                  "burst": 2000}
    config["leaderElection"] = LEADER_ELECTION
    config["percentageOfNodesToScore"] = 100
    config_path = folder / f"{name}-scheduler.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    log_path = folder / f"{name}-scheduler.log"
    kubeconfig = str(plane.kubeconfig_path)
    env = {**os.environ, EXIT_WITH_PARENT_ENV: str(os.getpid())}
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(plane.binary), "kube-scheduler", f"--config={config_path}",
             f"--authentication-kubeconfig={kubeconfig}",
             f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
             f"--secure-port={port}", f"--cert-dir={folder / (name + '-certs')}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
    scheduler = ComponentProcess(name=name, process=process, log_path=log_path, port=port)
    try:
        wait_until(lambda: http_get(f"https://127.0.0.1:{port}/healthz",
                                    context=insecure_tls(), token=None)[0] == 200,
                   timeout_s=60, what=f"{name}'s kube-scheduler healthy")
    except BaseException:
        scheduler.stop()
        extender.stop()
        raise
    return Replica(name, extender, scheduler)


@dataclass
class FailoverResult:
    """What ``kills`` leader deaths did: seconds from each kill to the first bind after it,
    pods lost (pending though they fit), GPUs given twice, pods bound, and the reserved GPUs
    held through the kills and the pods given one of them."""

    first_bind_s: list[float] = field(default_factory=list)
    lost: int = 0
    double_assigned: int = 0
    bound: int = 0
    pods: int = 0
    reserved: int = 0
    reserved_taken: int = 0


def hold_gpus(plane: ControlPlane, fleet: Fleet, count: int) -> list[Reservation]:
    """Reservations of ``count`` whole GPUs free now (after the fleet's residents), one per
    node, on the nodes with the most GPUs, for an owner that never comes, expiring in an hour."""
    state = resident_state(fleet)
    custom = kubernetes.client.CustomObjectsApi(plane.api_client())
    held: list[Reservation] = []
    for node in sorted(fleet.nodes, key=lambda n: (-n.gpu_count, n.name)):
        free = np.flatnonzero(state.gpu_free[state.index[node.name], :node.gpu_count]
                              == MILLI_PER_GPU)
        if free.size == 0:
            continue
        i = len(held)
        reservation = Reservation(
            name=f"failover-hold-{i}", node=node.name, gpus=(int(free[-1]),),
            gpu_milli=MILLI_PER_GPU, owner_uid=f"failover-absent-owner-{i}",
            owner_kind="ReplicaSet", owner_name="absent", namespace="absent",
            expires=time.time() + HOLD_S, replaces=f"absent/absent-{i}")
        custom.create_namespaced_custom_object(rsv.GROUP, rsv.VERSION, HINTS_NAMESPACE,
                                               rsv.PLURAL, rsv.body(reservation))
        held.append(reservation)
        if len(held) == count:
            break
    return held


def release_gpus(plane: ControlPlane, held: list[Reservation]) -> None:
    custom = kubernetes.client.CustomObjectsApi(plane.api_client())
    for reservation in held:
        with contextlib.suppress(kubernetes.client.ApiException):
            custom.delete_namespaced_custom_object(rsv.GROUP, rsv.VERSION, HINTS_NAMESPACE,
                                                   rsv.PLURAL, reservation.name)


def on_held_gpus(pods: list[dict[str, Any]], held: list[Reservation]) -> int:
    """The pods whose GPUs, as the extender recorded them at bind, include a held one."""
    taken = {(r.node, g) for r in held for g in r.gpus}
    return sum(1 for pod in pods
               if any((node_name_of(pod), g) in taken for g in bound_gpus(pod) or ()))


def _bound(plane: ControlPlane, namespace: str) -> int:
    return len(list_pods(plane, namespace, "spec.nodeName!="))


def _bound_past(plane: ControlPlane, namespace: str, floor: int) -> bool:
    return _bound(plane, namespace) > floor


class _Arrivals(threading.Thread):
    """Pods created one at a time, ``per_s`` a second, while the leaders die."""

    def __init__(self, plane: ControlPlane, namespace: str, bodies: list[dict[str, Any]],
                 per_s: float) -> None:
        super().__init__(name="fleet-arrivals", daemon=True)
        self.plane, self.namespace, self.bodies, self.per_s = plane, namespace, bodies, per_s
        self.stop_event = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        for i, body in enumerate(self.bodies):
            # Paced on the clock (an Event's wait, so stop() ends it at once).
            if self.stop_event.wait(max(0.0, started + i / self.per_s - time.monotonic())):
                return
            create_pods(self.plane, self.namespace, [body])


def run_failover(plane: ControlPlane, fleet: Fleet, namespace: str, folder: Path, *,
                 kills: int, per_s: float) -> FailoverResult:
    """Two replicas; the leader killed ``kills`` times while pods arrive, each time restarted
    as the standby once the other has taken over."""
    held = hold_gpus(plane, fleet, HELD_GPUS)
    replicas = {name: start_replica(plane, f"{name}-0", folder) for name in ("a", "b")}
    generation = {"a": 0, "b": 0}
    result = FailoverResult(pods=len(fleet.pods), reserved=len(held))
    bodies = [pod_body(p, SCHEDULER_NAME) for p in fleet.pods]
    arrivals = _Arrivals(plane, namespace, bodies, per_s)
    try:
        wait_until(lambda: any(r.leading() for r in replicas.values()), timeout_s=60,
                   what="a gpufrag-scheduler leader")
        arrivals.start()
        for _ in range(kills):
            leader = next(n for n, r in replicas.items() if r.leading())
            standby = next(n for n in replicas if n != leader)
            floor = _bound(plane, namespace)
            # Kill mid-stream: only once this leader has bound something.
            wait_until(partial(_bound_past, plane, namespace, floor), timeout_s=120,
                       what="the leader binding pods", interval_s=0.1)
            killed_at = time.monotonic()
            replicas[leader].kill()
            wait_until(replicas[standby].leading, timeout_s=120,
                       what=f"{standby} taking the lease", interval_s=0.1)
            took = _bound(plane, namespace)
            wait_until(partial(_bound_past, plane, namespace, took), timeout_s=120,
                       what="the new leader's first bind", interval_s=0.05)
            result.first_bind_s.append(time.monotonic() - killed_at)
            generation[leader] += 1
            replicas[leader] = start_replica(plane, f"{leader}-{generation[leader]}", folder)
        arrivals.join()
        # A pod still pending, and not found unschedulable, after this long is lost.
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: settled(plane, namespace) is not None,
                       timeout_s=120 + len(bodies), what="every pod bound or unschedulable",
                       interval_s=0.5)
        left = list_pods(plane, namespace, "spec.nodeName=")
        placed = placement(plane, fleet, namespace, TargetWorkload.from_pods(fleet.pods))
        result.bound, result.double_assigned = placed.bound, placed.stranded
        # Lost: pending though the scheduler never found it unschedulable, or gone.
        result.lost = (sum(1 for pod in left if not unschedulable(pod))
                       + len(bodies) - len(list_pods(plane, namespace)))
        result.reserved_taken = on_held_gpus(list_pods(plane, namespace), held)
    finally:
        arrivals.stop_event.set()
        arrivals.join(30)
        for replica in replicas.values():
            replica.stop()
        release_gpus(plane, held)
    core = kubernetes.client.CoreV1Api(plane.api_client())
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    return result
