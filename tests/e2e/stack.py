"""Pieces of the gpufrag stack for end-to-end tests: the extender as a real subprocess, the
gpufrag-scheduler configuration, GPU pods, and waits on the real API server.

Shared by the e2e modules so each test states only its scenario.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes

from gpufrag import conventions as cv
from gpufrag.devcluster import ControlPlane, free_port, wait_until
from scheduler.core import ClusterState
from scheduler.kube.cache import ClusterCache

SCHEDULER = cv.SCHEDULER_NAME
GROUP_LABEL = "e2e.gpufrag.io/group"

# Why weight 200: see manifests/base/scheduler-config.yaml (one extender point outweighs all
# default score plugins together, so the extender's ranking decides).
SCHEDULER_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: {name}
extenders:
  - urlPrefix: {url}
    filterVerb: filter
    prioritizeVerb: prioritize
{bind}    weight: 200
    nodeCacheCapable: true
    httpTimeout: 5s
    ignorable: {ignorable}
    managedResources:
      - name: nvidia.com/gpu
        ignoredByScheduler: false
      - name: gpufrag.io/gpu-milli
        ignoredByScheduler: true
"""


def scheduler_config(url: str, *, ignorable: bool = False, bind: bool = True,
                     name: str = SCHEDULER) -> str:
    return SCHEDULER_CONFIG.format(name=name, url=url, ignorable=str(ignorable).lower(),
                                   bind="    bindVerb: bind\n" if bind else "")


@dataclass
class Extender:
    """``gpufrag extender`` watching the control plane, in its own process, on a free port."""

    control_plane: ControlPlane
    log_path: Path
    extra_args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> Extender:
        env = {**os.environ, "GPUFRAG_LOG_FORMAT": "json"}
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpufrag.cli", "extender", "--kubeconfig",
             str(self.control_plane.kubeconfig_path), "--host", "127.0.0.1", "--port",
             str(self.port), "--set", "maintenance_interval_s=1", *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        wait_until(self._ready, timeout_s=timeout_s, what=f"extender ready on {self.url}")
        return self

    def _ready(self) -> bool | None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"extender exited with {self.process.returncode}:\n"
                               + self.log_path.read_text()[-3000:])
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as reply:
                return reply.status == 200 or None
        except OSError:
            return None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def log_events(self, event: str) -> Iterator[dict[str, Any]]:
        """The extender's JSON log lines for one event (verb), oldest first."""
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("event") == event:
                    yield record

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as reply:
            return str(reply.read().decode())


def gpu_pod(name: str, *, gpus: int = 0, milli: int = 0, cpu: str = "1", memory: str = "1Gi",
            products: Iterable[str] = (), model: str = "", version: str = "",
            scheduler: str = SCHEDULER, group: str = "") -> dict[str, Any]:
    """A bare pod asking for whole GPUs (``gpus``) or a GPU share (``milli``)."""
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        requests[cv.RESOURCE_GPU] = str(gpus)
    if milli:
        requests[cv.RESOURCE_GPU_MILLI] = str(milli)
    labels = {k: v for k, v in ((cv.LABEL_MODEL, model), (cv.LABEL_MODEL_VERSION, version)) if v}
    annotations = {cv.ANNOTATION_GPU_SPEC: "|".join(products)} if products else {}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "gpufrag-e2e:none",
                        "resources": {"requests": requests, "limits": {
                            k: v for k, v in requests.items() if k not in ("cpu", "memory")}}}],
        "terminationGracePeriodSeconds": 0,
    }
    if group:
        spec["nodeSelector"] = {GROUP_LABEL: group}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": spec}


def bound_node(core: kubernetes.client.CoreV1Api, namespace: str, name: str,
               timeout_s: float = 60.0) -> str:
    def check() -> str | None:
        pod = core.read_namespaced_pod(name, namespace)
        return pod.spec.node_name or None

    return wait_until(check, timeout_s=timeout_s, what=f"pod {namespace}/{name} bound")


def make_nodes(plane: ControlPlane, group: str, layout: Mapping[str, int], *, per_product: int,
               gpus: int = 8) -> list[str]:
    """``per_product`` nodes of each product (``layout`` maps product -> GPU memory MiB)."""
    names = []
    for product, memory in layout.items():
        for i in range(per_product):
            name = f"{group}-{product.lower()}-{i}"
            plane.create_gpu_node(name, gpus, product, memory, cpu_milli=128_000,
                                  memory_mib=1024 * 1024, labels={GROUP_LABEL: group})
            names.append(name)
    return names


def delete_nodes(plane: ControlPlane, names: Iterable[str]) -> None:
    core = kubernetes.client.CoreV1Api(plane.api_client())
    for name in names:
        try:
            core.delete_node(name)
        except kubernetes.client.ApiException as e:
            if e.status != 404:
                raise


def cluster_state(plane: ControlPlane, group: str) -> ClusterState:
    """The group's nodes and their pods as the extender's cache reads them (same converters)."""
    api = plane.api_client()
    core = kubernetes.client.CoreV1Api(api)
    nodes = [api.sanitize_for_serialization(n) for n in
             core.list_node(label_selector=f"{GROUP_LABEL}={group}").items]
    names = {n["metadata"]["name"] for n in nodes}
    pods = [api.sanitize_for_serialization(p) for p in core.list_pod_for_all_namespaces().items
            if p.spec.node_name in names]
    cache = ClusterCache()
    cache.load(nodes, pods)
    return cache.state
