"""Peak memory of the extender and the admission webhook under big but valid bodies, and
under malformed ones, each against its own memory limit in the manifests.

A component killed for memory answers nobody, so its peak resident memory, for any input and
any concurrency its server lets in, must stay under the container's limit with a margin
(:data:`MARGIN`). Each case starts the component afresh as its own process (the peak is the
process's own ``VmHWM`` from ``/proc/<pid>/status``, never the benchmark's), sends its
requests, and reads the peak and the memory still held once they are answered:

- the extender (``gpufrag extender --cluster-snapshot``, 5,000 synthetic nodes, the
  production server, ``filter.answer: feasible`` so that a filter answers every node that
  passes), sent as kube-scheduler sends an extender with ``nodeCacheCapable: false``: a
  filter with full Node objects for every node (~50 MB: labels, conditions, images, as a
  kubelet writes them), alone, 2 and 8 at once; a prioritize with the same body; and a
  prioritize and a filter whose ``NodeNames`` list alone is ~50 MB (names the cluster does
  not have: the answer is larger than the body);
- the admission webhook (``gpufrag admission --insecure-http``, its API server a closed
  port, so lookups fail as fast as they can), sent rounds of malformed AdmissionReviews up to
  its body limit over many connections at once (JSON made of millions of empty objects,
  deep nesting, long strings, cut-off documents, ...).

Prints one line per case and writes its figures through :mod:`benchmarks.results`: each case's
peak RSS against its target (peak <= limit x (1 - MARGIN)), its settled RSS and its requests
that got no answer (target 0); the run is met only when every case is.

    python -m benchmarks.memory_peak [--nodes 5000] [--results PATH | --no-results]
        [--cases filter-nodes-1,...] [--fuzz-rounds 4]
"""

from __future__ import annotations

import argparse
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from benchmarks import results
from benchmarks.extender_latency import build_cluster, free_port, stop_server, wait_ready
from scheduler.kube.quantity import parse_quantity
from scheduler.kube.snapshot import read_snapshot

ROOT = Path(__file__).resolve().parent.parent
EXTENDER_MANIFEST = ROOT / "manifests" / "base" / "scheduler.yaml"
WEBHOOK_MANIFEST = ROOT / "manifests" / "components" / "rightsizing" / "admission-webhook.yaml"
# The share of a limit a peak may not eat into: what the container holds beside the process
# (page cache of its files, a second interpreter for an exec probe) and a heap's growth from
# one release to the next.
MARGIN = 0.2
WEBHOOK_BODY_BYTES = 3 * 1024 * 1024 - 64  # just under the webhook's body limit
IMAGES_PER_NODE = 48  # a kubelet reports up to 50 of a node's images
# Set from the manifests in main() (and left out with --no-manifest-env).
EXTENDER_ENV: dict[str, str] = {}
WEBHOOK_ENV: dict[str, str] = {}


def memory_limit_mib(manifest: Path, container: str) -> float:
    """``resources.limits.memory`` of ``container`` in the Deployment of ``manifest``, MiB."""
    for doc in yaml.safe_load_all(manifest.read_text()):
        if not isinstance(doc, dict) or doc.get("kind") != "Deployment":
            continue
        for spec in doc["spec"]["template"]["spec"]["containers"]:
            if spec["name"] == container:
                return float(parse_quantity(spec["resources"]["limits"]["memory"])) / 2**20
    raise LookupError(f"no container {container!r} with a memory limit in {manifest}")


def container_env(manifest: Path, container: str) -> dict[str, str]:
    """The plain ``env`` values (no ``valueFrom``) of ``container`` in ``manifest``'s
    Deployment, such as the allocator's settings: each component runs here as it would there."""
    for doc in yaml.safe_load_all(manifest.read_text()):
        if not isinstance(doc, dict) or doc.get("kind") != "Deployment":
            continue
        for spec in doc["spec"]["template"]["spec"]["containers"]:
            if spec["name"] == container:
                return {e["name"]: str(e["value"]) for e in spec.get("env") or ()
                        if "value" in e}
    raise LookupError(f"no container {container!r} in {manifest}")


def status_mib(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of process ``pid`` (MiB)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}


def full_node(node: Mapping[str, Any], i: int) -> dict[str, Any]:
    """``node`` (a minimal v1 Node) as a kubelet writes one: conditions, addresses, node
    info and ``IMAGES_PER_NODE`` images (~10 KB of JSON)."""
    name = node["metadata"]["name"]
    images = [{"names": [f"registry.example/team-{i % 40}/model-{j}@sha256:{i * 1000 + j:064x}",
                         f"registry.example/team-{i % 40}/model-{j}:v{j}.{i % 7}"],
               "sizeBytes": 1_000_000_000 + 7919 * j} for j in range(IMAGES_PER_NODE)]
    conditions = [{"type": kind, "status": "False", "reason": f"Kubelet{kind}",
                   "message": f"kubelet has no {kind}", "lastHeartbeatTime": "2025-01-01T00:00:00Z",
                   "lastTransitionTime": "2025-01-01T00:00:00Z"}
                  for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")]
    conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                       "message": "kubelet is posting ready status",
                       "lastHeartbeatTime": "2025-01-01T00:00:00Z",
                       "lastTransitionTime": "2025-01-01T00:00:00Z"})
    meta = {**node["metadata"], "uid": f"{i:08x}-0000-4000-8000-{i:012x}",
            "resourceVersion": str(100_000 + i), "creationTimestamp": "2025-01-01T00:00:00Z",
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"}}
    status = {**node["status"], "conditions": conditions,
              "addresses": [{"type": "InternalIP", "address": f"10.{i >> 16 & 255}.{i >> 8 & 255}"
                                                              f".{i & 255}"},
                            {"type": "Hostname", "address": name}],
              "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
              "nodeInfo": {"machineID": f"{i:032x}", "systemUUID": f"{i:032x}",
                           "bootID": f"{i:032x}", "kernelVersion": "6.1.0-28-amd64",
                           "osImage": "Debian GNU/Linux 12 (bookworm)",
                           "containerRuntimeVersion": "containerd://1.7.24",
                           "kubeletVersion": "v1.32.0", "kubeProxyVersion": "v1.32.0",
                           "operatingSystem": "linux", "architecture": "amd64"},
              "images": images}
    return {**node, "metadata": meta, "spec": {"podCIDR": f"10.244.{i % 256}.0/24"},
            "status": status}


def small_pod() -> dict[str, Any]:
    """A pod every node passes (no GPU: not the extender's to judge), so a filter's answer
    echoes every Node it was sent: the largest answer a body can ask for."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "namespace": "bench", "uid": "probe-uid"},
            "spec": {"schedulerName": "gpufrag", "containers": [
                {"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m"}}}]}}


def gpu_pod() -> dict[str, Any]:
    """A GPU-share pod: prioritize scores it on every node."""
    pod = small_pod()
    pod["spec"]["containers"][0]["resources"]["requests"]["gpufrag.io/gpu-milli"] = "250"
    return pod


def extender_bodies(snapshot: Path, target_bytes: int) -> dict[str, bytes]:
    """Request bodies: full Nodes for every node of ``snapshot``; NodeNames of about
    ``target_bytes`` (names the cluster does not have)."""
    nodes = read_snapshot(snapshot).nodes
    items = [full_node(n, i) for i, n in enumerate(nodes)]
    with_nodes = {"Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    names = [f"gone-{i:07d}" for i in range(target_bytes // 15)]
    with_names = {"Nodes": None, "NodeNames": names}
    return {"nodes-cpu": orjson.dumps({"Pod": small_pod(), **with_nodes}),
            "nodes-gpu": orjson.dumps({"Pod": gpu_pod(), **with_nodes}),
            "names-gpu": orjson.dumps({"Pod": gpu_pod(), **with_names})}


@dataclass(frozen=True)
class Case:
    name: str
    component: str  # extender | webhook
    path: str
    body: str  # a key of the bodies
    concurrent: int
    rounds: int = 1
    what: str = ""


@dataclass
class Result:
    case: str
    component: str
    what: str
    concurrent: int
    requests: int
    statuses: dict[str, int]
    body_mib: float
    answer_mib_max: float
    idle_rss_mib: float
    peak_rss_mib: float
    settled_rss_mib: float
    limit_mib: float
    target_mib: float
    memory_met: bool  # the peak under the target
    met: bool  # and every request answered (a reset or refused connection sent less load)
    seconds: float
    errors: list[str] = field(default_factory=list)


EXTENDER_CASES = [
    Case("filter-nodes-1", "extender", "/filter", "nodes-cpu", 1,
         what="filter, full Nodes for every node, all pass (answer echoes them)"),
    Case("filter-nodes-2", "extender", "/filter", "nodes-cpu", 2, what="the same, 2 at once"),
    Case("filter-nodes-8", "extender", "/filter", "nodes-cpu", 8, what="the same, 8 at once"),
    Case("prioritize-nodes-1", "extender", "/prioritize", "nodes-gpu", 1,
         what="prioritize, full Nodes for every node"),
    Case("prioritize-names-1", "extender", "/prioritize", "names-gpu", 1,
         what="prioritize, a NodeNames list of unknown names (answer > body)"),
    Case("filter-names-2", "extender", "/filter", "names-gpu", 2,
         what="filter, a NodeNames list of unknown names, 2 at once"),
]
WEBHOOK_CASES = [
    Case("webhook-fuzz", "webhook", "/mutate", "fuzz", 16, rounds=4,
         what="malformed reviews up to the body limit, 16 connections at once"),
]


def fuzz_bodies(size: int = WEBHOOK_BODY_BYTES) -> list[bytes]:
    """Malformed AdmissionReviews of about ``size`` bytes: what parses into the most objects
    per byte, what the review's checks walk, and what is not JSON at all."""

    def fill(head: bytes, unit: bytes, tail: bytes) -> bytes:
        count = (size - len(head) - len(tail)) // (len(unit) + 1)
        return head + b",".join([unit] * count) + tail

    review = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'
    pod_create = (review + b'{"uid":"u","kind":{"kind":"Pod"},"operation":"CREATE",'
                  b'"namespace":"n","object":')
    keys = b",".join(b'"k%07d":0' % i for i in range((size - 200) // 13))
    return [
        fill(b"[", b"{}", b"]"),
        fill(b"[", b"[]", b"]"),
        fill(review + b"[", b"{}", b"]}"),
        fill(pod_create + b'{"spec":{"containers":[', b"{}", b"]}}}}"),
        fill(pod_create + b'{"metadata":{"ownerReferences":[', b"{}", b"]}}}}"),
        fill(pod_create + b'{"spec":{"containers":[',
             b'{"resources":{"requests":{"gpufrag.io/gpu-milli":"1e99999"}}}', b"]}}}}"),
        review + b'{"object":{' + keys + b"}}}",
        fill(b"[", b"0.5", b"]"),
        fill(b"[", b'"\\u00e9"', b"]"),
        b'{"request":"' + b"x" * (size - 20) + b'"}',
        b"[" * 2000 + b"]" * 2000,
        fill(pod_create + b'{"spec":{"containers":[', b"{}", b"]}}}}")[: size // 2],
        b'{"request":NaN}',
        os.urandom(size),
    ]


def post(port: int, path: str, body: bytes, timeout_s: float) -> tuple[int, int]:
    """Status and answer length of one POST on a connection of its own."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, len(response.read())
    finally:
        conn.close()


def run_case(case: Case, pid: int, port: int, bodies: list[bytes], limit_mib: float,
             timeout_s: float) -> Result:
    idle = status_mib(pid)["VmRSS"]
    statuses: dict[str, int] = {}
    errors: list[str] = []
    answer_max = 0
    began = time.perf_counter()
    lock = threading.Lock()

    def one(i: int) -> None:
        nonlocal answer_max
        try:
            status, size = post(port, case.path, bodies[i % len(bodies)], timeout_s)
        except OSError as e:
            status, size = 0, 0
            with lock:
                errors.append(f"{type(e).__name__}: {e}")
        with lock:
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            answer_max = max(answer_max, size)

    total = case.concurrent * case.rounds * (len(bodies) if case.component == "webhook" else 1)
    with ThreadPoolExecutor(case.concurrent) as pool:
        list(pool.map(one, range(total)))
    seconds = time.perf_counter() - began
    time.sleep(1.0)  # what a released answer gives back, it has given by now
    after = status_mib(pid)
    target = limit_mib * (1 - MARGIN)
    peak = after["VmHWM"]
    return Result(case.name, case.component, case.what, case.concurrent, total, statuses,
                  round(max(len(b) for b in bodies) / 2**20, 1), round(answer_max / 2**20, 1),
                  round(idle, 1), round(peak, 1), round(after["VmRSS"], 1), round(limit_mib),
                  round(target), peak <= target, peak <= target and not errors,
                  round(seconds, 2), errors[:3])


def start_extender(snapshot: Path, port: int, threads: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gpufrag.cli", "extender", "--cluster-snapshot",
               str(snapshot), "--host", "127.0.0.1", "--port", str(port), "--no-bind",
               "--threads", str(threads), "--log-level", "warning",
               "--set", "hints.enabled=false", "--set", "filter.answer=feasible"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env=os.environ | EXTENDER_ENV)
    return wait_ready(server, port, 600, "extender")


def start_webhook(folder: Path, port: int) -> subprocess.Popen[bytes]:
    """The webhook, its API server a port nothing listens on (every lookup fails at once)."""
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(orjson.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}).decode())
    command = [sys.executable, "-m", "gpufrag.cli", "admission", "--insecure-http",
               "--host", "127.0.0.1", "--port", str(port), "--kubeconfig", str(kubeconfig),
               "--log-level", "warning"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env=os.environ | WEBHOOK_ENV)
    return wait_ready(server, port, 120, "webhook", path="/healthz")


def one_server(start: Callable[[int], subprocess.Popen[bytes]], case: Case,
               bodies: list[bytes], limit_mib: float, timeout_s: float) -> Result:
    port = free_port()
    server = start(port)
    try:
        return run_case(case, server.pid, port, bodies, limit_mib, timeout_s)
    finally:
        stop_server(server)


def print_result(r: Result) -> None:
    statuses = " ".join(f"{k}x{v}" for k, v in sorted(r.statuses.items()))
    print(f"{r.case:<20} body {r.body_mib:>5.1f} MiB  answer {r.answer_mib_max:>5.1f} MiB  "
          f"idle {r.idle_rss_mib:>6.1f}  peak {r.peak_rss_mib:>7.1f}  settled "
          f"{r.settled_rss_mib:>6.1f}  limit {r.limit_mib:>5.0f} (target <= {r.target_mib:.0f})"
          f"  {'met' if r.memory_met else 'MISSED'}  [{statuses}] {r.seconds:.1f} s"
          + (f"  NOT ALL ANSWERED ({r.statuses.get('0', 0)} connection errors, first: "
             f"{r.errors[0]})" if r.errors else ""), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=8, help="the extender's threads")
    parser.add_argument("--names-mib", type=float, default=50.0,
                        help="size of the NodeNames bodies (MiB)")
    parser.add_argument("--fuzz-rounds", type=int, default=4)
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    parser.add_argument("--no-manifest-env", action="store_true",
                        help="run the components without their manifests' env values")
    results.add_arguments(parser, "memory_peak")
    args = parser.parse_args(argv)
    start = results.Start.now()
    if not args.no_manifest_env:
        EXTENDER_ENV.update(container_env(EXTENDER_MANIFEST, "extender"))
        WEBHOOK_ENV.update(container_env(WEBHOOK_MANIFEST, "admission"))
    cases = [*EXTENDER_CASES, *(Case(c.name, c.component, c.path, c.body, c.concurrent,
                                     args.fuzz_rounds, c.what) for c in WEBHOOK_CASES)]
    if args.cases:
        wanted = set(args.cases.split(","))
        unknown = wanted - {c.name for c in cases}
        if unknown:
            parser.error(f"--cases: no case {sorted(unknown)}; cases: "
                         f"{', '.join(c.name for c in cases)}")
        cases = [c for c in cases if c.name in wanted]
    limits = {"extender": memory_limit_mib(EXTENDER_MANIFEST, "extender"),
              "webhook": memory_limit_mib(WEBHOOK_MANIFEST, "admission")}
    measured: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="gpufrag-memory-") as tmp:
        folder = Path(tmp)
        if any(c.component == "extender" for c in cases):
            cluster = build_cluster(args.nodes, 0.75, 1, folder)
            bodies = extender_bodies(cluster.snapshot, int(args.names_mib * 2**20))
            for case in (c for c in cases if c.component == "extender"):
                measured.append(one_server(
                    lambda port: start_extender(cluster.snapshot, port, args.threads), case,
                    [bodies[case.body]], limits["extender"], args.timeout_s))
                print_result(measured[-1])
            del bodies
        for case in (c for c in cases if c.component == "webhook"):
            measured.append(one_server(lambda port: start_webhook(folder, port), case,
                                       fuzz_bodies(), limits["webhook"], args.timeout_s))
            print_result(measured[-1])
    figures: list[results.Figure] = []
    for r in measured:
        figures += [
            results.Figure(f"{r.case} ({r.component}, limit {r.limit_mib:g} MiB): peak RSS",
                           r.peak_rss_mib, "MiB", results.Target("<=", r.target_mib)),
            results.Figure(f"{r.case}: settled RSS", r.settled_rss_mib, "MiB")]
    # A refused or reset request sent less load than the case says: no case may have one.
    figures.append(results.Figure(
        f"requests not answered, all cases ({sum(r.requests for r in measured)} sent)",
        sum(r.statuses.get("0", 0) for r in measured), "", results.Target("<=", 0)))
    memory_met = all(r.memory_met for r in measured)
    print(f"{'met' if memory_met else 'MISSED'}: every peak under its limit x {1 - MARGIN:g}"
          + ("" if all(r.met for r in measured) or not memory_met
             else "; but not every request was answered"))
    notes = [f"{component} env: " + " ".join(f"{k}={v}" for k, v in sorted(env.items()))
             for component, env in (("extender", EXTENDER_ENV), ("webhook", WEBHOOK_ENV))]
    recorded = results.record(args, "memory_peak", start, figures, notes)
    return 0 if recorded.verdict == "met" else 1


if __name__ == "__main__":
    sys.exit(main())
