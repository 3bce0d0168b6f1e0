"""Scheduling throughput with DRA on the real control plane: pods asking their GPUs through
ResourceClaims, kube-scheduler alone (its own allocator) against gpufrag-scheduler with the
extender in DRA mode, in one run, on the same fake cluster and pods.

    python -m benchmarks.dra_throughput [--nodes 1000] [--pods 2000] [--rounds 3]

The cluster is ``scheduling_throughput``'s (fake nodes of 8 GPUs, the same pod shapes: half
whole GPUs, half shares of 230, 470, 650 or 810 milli), with a ResourceSlice per node
published the way gpufrag's DRA driver builds it (``node.dra.slices``: one pool per node, one
device per GPU with consumable ``milli`` and ``memory``), the driver's DeviceClass, and a
ResourceClaimTemplate per shape. Each pod names its shape's template; the resourceclaim
controller makes its claim, and kube-scheduler's allocator allocates it in both rows.

Rows (each with its own scheduler process, started before its run and stopped after):

- ``default-dra``: kube-scheduler alone, its DRA allocator choosing node and device (the 1.0
  reference: issue 45's "the default scheduler with the same DRA driver");
- ``gpufrag-decide-dra``: gpufrag-scheduler, the extender with ``dra.enabled`` and its deciding
  filter (FGD chooses the node, each node scored for the GPU first fit gives there, that GPU
  assumed; docs/dra.md), asked about every pod (no ``managedResources``: a DRA pod requests
  none).

Measured as ``scheduling_throughput`` measures (its rounds, clock and CPU accounting): pods/s
per row, the gpufrag row over the default one within each round (median round), and the
extender's CPU per pod, total and by thread. Between runs the claims of the pods deleted must
be gone too, or the next run's allocator would find their devices in use. No target: issue 45
asks for the figure and the extender's cost.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes

from benchmarks import results
from benchmarks.scheduling_throughput import (
    GPU_MEMORY_MIB,
    GPUS_PER_NODE,
    PRODUCTS,
    Row,
    create_nodes,
    extender_threads,
    measure_rows,
    pod_shapes,
    print_cpu,
    print_rates,
)
from devkit.build import build_control_plane
from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from node.dra.slices import build_slice
from node.gpus import Gpu
from scheduler.core.types import MILLI_PER_GPU
from scheduler.kube.claims import DRIVER_NAME

ROWS = {
    "default-dra": Row("default-dra", "default kube-scheduler + DRA (no extender)",
                       baseline="default-dra", dra=True),
    "gpufrag-decide-dra": Row("gpufrag-decide-dra",
                              "gpufrag (dra.enabled): filter decides + bind, DRA",
                              settings=("dra.enabled=true",), baseline="default-dra", dra=True),
}


def publish_slices(plane: ControlPlane, nodes: list[str]) -> None:
    """Each node's ResourceSlice, as gpufrag's DRA driver would publish it there."""
    client = plane.api_client()
    core: Any = kubernetes.client.CoreV1Api(client)  # dict bodies
    resource: Any = kubernetes.client.ResourceV1Api(client)

    def publish(i: int) -> None:
        name = nodes[i]
        gpus = [Gpu(g, f"GPU-{name}-{g}", PRODUCTS[i % len(PRODUCTS)], GPU_MEMORY_MIB)
                for g in range(GPUS_PER_NODE)]
        resource.create_resource_slice(build_slice(
            name, DRIVER_NAME, gpus, {}, node_uid=core.read_node(name).metadata.uid))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(publish, range(len(nodes))))
    resource.create_device_class({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": DRIVER_NAME},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]}})


def template_name(milli: int) -> str:
    return "whole" if milli == MILLI_PER_GPU else f"share-{milli}"


def create_templates(plane: ControlPlane, ns: str, shapes: set[int]) -> None:
    resource: Any = kubernetes.client.ResourceV1Api(plane.api_client())  # dict bodies
    for milli in sorted(shapes):
        exactly: dict[str, Any] = {"deviceClassName": DRIVER_NAME}
        if milli != MILLI_PER_GPU:  # a whole GPU names no milli: it takes all of it
            exactly["capacity"] = {"requests": {"milli": str(milli)}}
        resource.create_namespaced_resource_claim_template(ns, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": template_name(milli)},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}})


def claim_pod(name: str, milli: int) -> dict[str, Any]:
    """A pod asking its GPU through its shape's template (the scheduler is set per run)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpu",
                                         "resourceClaimTemplateName": template_name(milli)}],
                     "containers": [{"name": "main", "image": "gpufrag-e2e:none",
                                     "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                                   "claims": [{"name": "gpu"}]}}]}}


def claims_gone(plane: ControlPlane, ns: str) -> Callable[[], None]:
    """Wait until the namespace holds no ResourceClaim (the resourceclaim controller deletes a
    deleted pod's claims after it)."""
    resource = kubernetes.client.ResourceV1Api(plane.api_client())

    def settle() -> None:
        wait_until(lambda: not resource.list_namespaced_resource_claim(ns, limit=1).items,
                   timeout_s=600, what="the deleted pods' claims gone")

    return settle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3,
                        help="every row once per round, the order rotated each round")
    results.add_arguments(parser, "dra_throughput")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.nodes < 1 or args.pods < 1:
        parser.error("--nodes, --pods and --rounds must be at least 1")
    start = results.Start.now()
    rows = list(ROWS.values())
    binary = build_control_plane()
    with ControlPlane(binary, complete_pods=False) as plane, \
            tempfile.TemporaryDirectory() as tmp:
        print(f"control plane up in {plane.startup_s:.1f}s; creating {args.nodes} nodes and "
              "their ResourceSlices", file=sys.stderr)
        nodes = create_nodes(plane, args.nodes)
        publish_slices(plane, nodes)
        ns = plane.create_namespace("bench")
        shapes = pod_shapes(args.pods)
        create_templates(plane, ns, set(shapes))
        pods = [claim_pod(f"p-{i:05d}", milli) for i, milli in enumerate(shapes)]
        measured = measure_rows(plane, rows, pods, ns, args.rounds, Path(tmp),
                                settle=claims_gone(plane, ns))
    figures = print_rates(rows, measured.times, args.nodes, args.pods)
    print(f"  load average at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"(1 / 5 / 15 min) on {os.cpu_count()} CPUs")
    for name, count in measured.refused.items():
        print(f"  {name}: {count} binds refused in all rounds (and retried by kube-scheduler)")
    print_cpu(rows, measured.cpu, args.rounds)
    for row in rows:
        ms = measured.cpu[row.name].get("extender")
        if ms is not None:
            print(f"  {row.name}: extender CPU per pod {ms:.2f} ms")
            figures.append(results.Figure(f"{row.name}: extender CPU per pod (mean of rounds)",
                                          round(ms, 2), "ms"))
        figures.append(results.Figure(
            f"{row.name}: kube-scheduler CPU per pod (mean of rounds)",
            round(measured.cpu[row.name].get("kube-scheduler", 0.0), 2), "ms"))
    figures += extender_threads(measured.threads)
    results.record(args, "dra_throughput", start, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
