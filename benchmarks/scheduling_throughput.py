"""Scheduling throughput on the real control plane: gpufrag-scheduler (kube-scheduler calling
the extender for filter, prioritize and bind) vs the same kube-scheduler without the extender,
in one run, on the same fake cluster.

    python -m benchmarks.scheduling_throughput [--nodes 1000] [--pods 2000]

Both schedulers get the same client QPS (so the API rate limit is not what is compared) and
score every node (percentageOfNodesToScore 100). Pods are created up front; the clock runs from
the first create to the last bind observed. For each run it also prints the CPU each process
spent per pod (etcd, API server, controller manager, each scheduler, the extender, this client):
on a small machine they all share the same cores, so that is where the difference comes from.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes
import orjson

from benchmarks.procstat import cpu_seconds
from devkit.build import build_control_plane
from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.procs import wait_until
from devkit.stack import gpu_pod

QPS = "clientConnection:\n  qps: 1000\n  burst: 2000\n"
PLAIN = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: bench-default
"""


def cpu_by_process(plane: ControlPlane, extender: ExtenderProcess) -> dict[str, float]:
    pids = {name: c.process.pid for name, c in plane.components.items()}
    pids |= {f"scheduler {name}": c.process.pid for name, c in plane.schedulers.items()}
    if extender.process is not None:
        pids["gpufrag extender"] = extender.process.pid
    # With descendants: the extender works in the gunicorn worker it forks.
    cpu = {name: cpu_seconds(pid, descendants=True) for name, pid in pids.items()}
    cpu["this client"] = cpu_seconds(os.getpid())  # the rest are its children
    return cpu


def run(plane: ControlPlane, scheduler: str, pods: list[dict[str, object]], ns: str) -> float:
    core = kubernetes.client.CoreV1Api(plane.api_client())
    bodies = []
    for body in pods:
        body = {**body, "spec": {**body["spec"], "schedulerName": scheduler}}  # type: ignore[dict-item]
        bodies.append(body)
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: core.create_namespaced_pod(ns, b), bodies))

    def all_bound() -> bool:
        # Only the pods still unbound, as raw JSON: listing and deserialising all of them every
        # half second cost the API server and this client more CPU per pod than a scheduler,
        # and more for whichever run takes longer, on the cores the schedulers share.
        answer: Any = core.list_namespaced_pod(ns, field_selector="spec.nodeName=",
                                               _preload_content=False)  # raw: no models
        return not orjson.loads(answer.data)["items"]

    wait_until(all_bound, timeout_s=1800, what=f"{len(pods)} pods bound by {scheduler}",
               interval_s=0.5)
    elapsed = time.perf_counter() - started
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(ns).items, timeout_s=600, what="pods gone")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    args = parser.parse_args()
    binary = build_control_plane()
    rng = random.Random(1)
    with ControlPlane(binary, complete_pods=False) as plane:
        print(f"control plane up in {plane.startup_s:.1f}s; creating {args.nodes} nodes",
              file=sys.stderr)
        products = ["T4", "A10", "V100M32", "G2"]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: plane.create_gpu_node(
                f"bench-{i:05d}", 8, products[i % 4], 16_384, cpu_milli=96_000,
                memory_mib=512 * 1024), range(args.nodes)))
        ns = plane.create_namespace("bench")
        pods = [gpu_pod(f"p-{i:05d}", gpus=1, cpu="2") if rng.random() < 0.5 else
                gpu_pod(f"p-{i:05d}", milli=rng.choice([230, 470, 650, 810]), cpu="2")
                for i in range(args.pods)]
        with tempfile.TemporaryDirectory() as tmp:
            extender = ExtenderProcess(plane, Path(tmp) / "extender.log",
                                extra_args=("--threads", "16")).start()
            plane.start_scheduler("bench-default", PLAIN + QPS)
            plane.start_scheduler("bench-gpufrag", gpufrag_scheduler_config(extender.url) + QPS)
            cpu: dict[str, dict[str, float]] = {}
            try:
                before = cpu_by_process(plane, extender)
                default_s = run(plane, "bench-default", pods, ns)
                middle = cpu_by_process(plane, extender)
                ours_s = run(plane, "gpufrag-scheduler", pods, ns)
                after = cpu_by_process(plane, extender)
            finally:
                extender.stop()
            for label, (start, end) in (("default", (before, middle)),
                                        ("gpufrag", (middle, after))):
                cpu[label] = {k: (end[k] - start.get(k, 0.0)) * 1000 / args.pods for k in end}
    d, o = args.pods / default_s, args.pods / ours_s
    print(f"\n{args.nodes} fake nodes x 8 GPUs, {args.pods} GPU pods (half whole GPUs, half "
          "shares), same kube-scheduler build and client QPS:")
    print(f"  default scheduler (no extender): {default_s:7.1f} s  {d:7.1f} pods/s")
    print(f"  gpufrag-scheduler (extender filter+prioritize+bind): {ours_s:7.1f} s  "
          f"{o:7.1f} pods/s")
    print(f"  ratio gpufrag / default: {o / d:.2f} (target >= 0.5)")
    print("\nCPU per pod (ms), each run including its pods' deletion:")
    print(f"  {'process':<38} {'default run':>11} {'gpufrag run':>11}")
    for name in cpu["gpufrag"]:
        print(f"  {name:<38} {cpu['default'][name]:>11.1f} {cpu['gpufrag'][name]:>11.1f}")
    print(f"  {'total':<38} {sum(cpu['default'].values()):>11.1f} "
          f"{sum(cpu['gpufrag'].values()):>11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
