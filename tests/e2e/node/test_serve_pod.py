"""``gpufrag serve`` from the project's image, in a pod on the real node, as manifests/base's
serving example runs it (its probes, user, read-only root, init container, grace period).

Through the pod IP: the v2 protocol answers, Prometheus metrics scrape, and every log line is
JSON. Deleting the pod under an open-loop load goes through the kubelet (preStop, SIGTERM, grace
period) and loses no accepted request: each request ends as a 200, a clean 503 with Retry-After,
or a connection that was never accepted (refused: a client's cue to try another endpoint) -
never a reset, an EOF or a timeout on an accepted connection. Once the listener has closed, the
kubelet tears the pod's network down, and a request then may meet "no route to host" even past
its handshake; that is counted as unreachable, and allowed only after the listener closed.
As shipped, the endpoint turns not ready first, the preStop sleep holds SIGTERM back while
requests are still answered, then the server drains and closes its listener; with the hook
removed, the server's own drain delay does the waiting (readiness 503 first, answers still in
between).
"""

from __future__ import annotations

import errno
import http.client
import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.controlplane import ControlPlane
from devkit.node import Node
from devkit.procs import wait_until

MODEL = "resnet-small"
PORT = 8000
RATE_PER_S = 20.0   # open loop: request i is sent at i / RATE_PER_S, whatever came back
DELETE_AT_S = 3.0   # the pod is deleted this long into the load
LOAD_S = 12.0       # past the preStop (5 s), the queue's drain and the exit (~8.2 s in)
SERVER_DRAIN = "server-drain-delay"
UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH}  # the route to the pod's IP is gone


def serving_pod(manifests: list[dict[str, Any]], node: Node, *,
                server_drain: bool = False) -> dict[str, Any]:
    """The serving example's pod, fitted to this node: bound to it directly (no
    gpufrag-scheduler here), the small built-in model, no GPU share and CPU requests that fit
    two cores, and the model cache on an emptyDir instead of the machine's disk. Its
    lifecycle, arguments and grace period stay as shipped. With ``server_drain``, the preStop
    hook is removed and so is ``--drain-delay-s=0``: the server's own drain delay (default 5 s)
    waits out the endpoint's removal instead, the alternative docs/serving.md gives."""
    deployment = next(d for d in manifests
                      if d["kind"] == "Deployment" and d["metadata"]["name"] == "resnet-serving")
    spec = json.loads(json.dumps(deployment["spec"]["template"]["spec"]))
    spec.pop("schedulerName", None)
    spec["nodeName"] = node.name
    server = next(c for c in spec["containers"] if c["name"] == "server")
    server["args"] = [f"--model=builtin:{MODEL}" if a.startswith("--model=") else a
                      for a in server["args"]]
    if server_drain:
        assert "--drain-delay-s=0" in server["args"] and server.pop("lifecycle")["preStop"]
        server["args"].remove("--drain-delay-s=0")
    server["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"},
                           "limits": {"cpu": "2", "memory": "2Gi"}}
    spec["volumes"] = [{"name": v["name"], "emptyDir": {}} if "hostPath" in v else v
                       for v in spec["volumes"]]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "serving", "labels": deployment["spec"]["template"]["metadata"]
                         ["labels"]}, "spec": spec}


def _ready(pod: kubernetes.client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _request(ip: str, method: str, path: str, body: bytes | None = None,
             timeout_s: float = 30.0) -> tuple[str, int | None, dict[str, str], bytes]:
    """One request on a new connection: ("refused", ...) when the connection was never
    accepted, ("unreachable", ...) when the pod's network was gone (no route to it), ("lost",
    ...) when it was accepted and no whole answer came, else ("answered", status)."""
    conn = http.client.HTTPConnection(ip, PORT, timeout=1.0)
    try:
        try:
            conn.connect()
        except OSError:
            return "refused", None, {}, b""
        assert conn.sock is not None
        conn.sock.settimeout(timeout_s)
        try:
            conn.request(method, path, body=body,
                         headers={"Content-Type": "application/json"} if body else {})
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, OSError) and exc.errno in UNREACHABLE:
                return "unreachable", None, {"error": repr(exc)}, b""
            return "lost", None, {"error": repr(exc)}, b""
        return "answered", response.status, dict(response.getheaders()), data
    finally:
        conn.close()


def _infer_body(ip: str) -> bytes:
    """A one-image request for the model's input, as its v2 metadata describes it."""
    kind, status, _, data = _request(ip, "GET", f"/v2/models/{MODEL}")
    assert (kind, status) == ("answered", 200), data
    (tensor,) = json.loads(data)["inputs"]
    shape = [1 if d == -1 else d for d in tensor["shape"]]
    count = 1
    for d in shape:
        count *= d
    return json.dumps({"inputs": [{"name": tensor["name"], "shape": shape,
                                   "datatype": tensor["datatype"], "data": [0.5] * count}]}
                      ).encode()


@dataclass
class Outcome:
    sent_s: float
    kind: str = ""
    status: int | None = None
    retry_after: str | None = None
    error: str | None = None


def _service(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The serving example's Service: its EndpointSlice shows when the endpoint stops being
    ready (the endpoint-slice controller, not the pod, decides that)."""
    service = next(d for d in manifests
                   if d["kind"] == "Service" and d["metadata"]["name"] == "resnet-serving")
    return {**service, "metadata": {"name": "resnet-serving"}}


@pytest.fixture
def serving(request: pytest.FixtureRequest, node: Node, node_plane: ControlPlane,
            node_namespace: str, gpufrag_image: str,
            base_manifests: list[dict[str, Any]]) -> tuple[str, kubernetes.client.V1Pod]:
    """The serving pod and its Service, Ready; ``request.param`` (optional) is
    :data:`SERVER_DRAIN` for the variant without the preStop hook."""
    core = kubernetes.client.CoreV1Api(node_plane.api_client())
    core.create_namespaced_service(node_namespace, _service(base_manifests))
    core.create_namespaced_pod(node_namespace, serving_pod(
        base_manifests, node, server_drain=getattr(request, "param", None) == SERVER_DRAIN))

    def ready() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod("serving", node_namespace)
        assert pod.status.phase != "Failed", pod.status
        return pod if pod.status.phase == "Running" and _ready(pod) else None

    try:
        pod = wait_until(ready, timeout_s=120, what="the serving pod to pass its probes")
    except Exception:
        print(node.container_log(node_namespace, "serving", "server"))
        raise
    return node_namespace, pod


def _endpoint_ready(discovery: kubernetes.client.DiscoveryV1Api, namespace: str,
                    ip: str) -> bool | None:
    """The Service's endpoint for ``ip``: ready (True), not ready or gone (False), or not yet
    published (None)."""
    slices = discovery.list_namespaced_endpoint_slice(
        namespace, label_selector="kubernetes.io/service-name=resnet-serving").items
    endpoints = [e for s in slices for e in (s.endpoints or []) if ip in (e.addresses or [])]
    if not endpoints:
        return False if slices else None
    return all(bool(e.conditions and e.conditions.ready) for e in endpoints)


def test_serve_answers_v2_and_metrics_through_the_pod_ip(
        node: Node, serving: tuple[str, kubernetes.client.V1Pod]) -> None:
    namespace, pod = serving
    ip = pod.status.pod_ip
    body = _infer_body(ip)
    for _ in range(3):
        kind, status, _, data = _request(ip, "POST", f"/v2/models/{MODEL}/infer", body)
        assert (kind, status) == ("answered", 200), data
    (output,) = json.loads(data)["outputs"]
    assert output["shape"] == [1, 10] and len(output["data"]) == 10

    kind, status, headers, data = _request(ip, "GET", "/metrics")
    assert (kind, status) == ("answered", 200)
    assert headers["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(data.decode())}
    assert "gpufrag_serving_queue_depth" in families, sorted(families)
    requests_total = [s.value for name, f in families.items() if name.startswith(
        "gpufrag_serving_request") for s in f.samples if s.name.endswith("_count")]
    assert requests_total and max(requests_total) >= 3, requests_total

    # Every line the container wrote is one JSON object (no runtime banner, no colours).
    log = node.container_log(namespace, "serving", "server")
    lines = [line.split(" ", 3)[3] for line in log.splitlines() if line.count(" ") >= 3]
    assert lines
    not_json = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert not_json == [], not_json[:5]


def test_serve_in_the_image_needs_no_cache_setting(
        node: Node, node_plane: ControlPlane, node_namespace: str,
        base_manifests: list[dict[str, Any]]) -> None:
    """The image's user has HOME=/nonexistent on a read-only root: with no cache setting and
    no cache volume, a built-in model is generated under the temp dir (the /tmp emptyDir)."""
    manifest = serving_pod(base_manifests, node)
    manifest["metadata"]["name"] = "no-cache-dir"
    server = next(c for c in manifest["spec"]["containers"] if c["name"] == "server")
    server["env"] = [e for e in server["env"] if e["name"] != "GPUFRAG_MODEL_CACHE_DIR"]
    server["volumeMounts"] = [m for m in server["volumeMounts"] if m["mountPath"] == "/tmp"]
    manifest["spec"].pop("initContainers")
    core = kubernetes.client.CoreV1Api(node_plane.api_client())
    core.create_namespaced_pod(node_namespace, manifest)

    def ready() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod("no-cache-dir", node_namespace)
        assert pod.status.phase != "Failed", pod.status
        return pod if _ready(pod) else None

    try:
        pod = wait_until(ready, timeout_s=120, what="the pod with no cache setting to be Ready")
    except Exception:
        print(node.container_log(node_namespace, "no-cache-dir", "server"))
        raise
    kind, status, _, _ = _request(pod.status.pod_ip, "POST", f"/v2/models/{MODEL}/infer",
                                  _infer_body(pod.status.pod_ip))
    assert (kind, status) == ("answered", 200)
    events = [json.loads(line.split(" ", 3)[3]) for line in
              node.container_log(node_namespace, "no-cache-dir", "server").splitlines()]
    (fallback,) = [e for e in events if e["event"] == "model_cache_fallback"]
    assert fallback["path"].startswith("/tmp/"), fallback


def _prestop_sleep_s(pod: kubernetes.client.V1Pod) -> int | None:
    """The server container's preStop ``sleep`` action, as the API server stored it."""
    (server,) = [c for c in pod.spec.containers if c.name == "server"]
    hook = server.lifecycle.pre_stop if server.lifecycle else None
    return int(hook.sleep.seconds) if hook is not None and hook.sleep is not None else None


@pytest.mark.parametrize("serving", [None, SERVER_DRAIN], ids=["as-shipped", SERVER_DRAIN],
                         indirect=True)
def test_deleting_the_pod_under_load_loses_no_accepted_request(
        node: Node, node_plane: ControlPlane, serving: tuple[str, kubernetes.client.V1Pod]) -> None:
    namespace, pod = serving
    ip = pod.status.pod_ip
    body = _infer_body(ip)
    core = kubernetes.client.CoreV1Api(node_plane.api_client())
    discovery = kubernetes.client.DiscoveryV1Api(node_plane.api_client())
    wait_until(lambda: _endpoint_ready(discovery, namespace, ip), timeout_s=30,
               what="the Service's endpoint to be ready")
    prestop_s = _prestop_sleep_s(pod)
    total = int(LOAD_S * RATE_PER_S)
    outcomes = [Outcome(i / RATE_PER_S) for i in range(total)]
    marks: dict[str, float] = {}
    stop = threading.Event()
    started = time.monotonic()

    def send(outcome: Outcome) -> None:
        kind, status, headers, _ = _request(ip, "POST", f"/v2/models/{MODEL}/infer", body)
        outcome.kind, outcome.status = kind, status
        outcome.retry_after = headers.get("Retry-After")
        outcome.error = headers.get("error")

    def watch_readiness() -> None:
        while not stop.is_set():
            kind, status, _, _ = _request(ip, "GET", "/v2/health/ready", timeout_s=2)
            now = time.monotonic() - started
            if kind == "answered" and status == 503:
                marks.setdefault("ready_503", now)
            elif kind != "answered" and "deleted" in marks:
                marks.setdefault("listener_closed", now)
            time.sleep(0.05)

    def watch_endpoint() -> None:
        while not stop.is_set():
            if "deleted" in marks and _endpoint_ready(discovery, namespace, ip) is False:
                marks.setdefault("endpoint_not_ready", time.monotonic() - started)
                return
            time.sleep(0.1)

    watchers = [threading.Thread(target=watch_readiness, daemon=True),
                threading.Thread(target=watch_endpoint, daemon=True)]
    for watcher in watchers:
        watcher.start()
    with ThreadPoolExecutor(max_workers=64) as pool:
        for outcome in outcomes:
            delay = started + outcome.sent_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if "deleted" not in marks and outcome.sent_s >= DELETE_AT_S:
                # Marked when asked: the kubelet may signal the server before the API
                # server's answer reaches us.
                marks["deleted"] = time.monotonic() - started
                core.delete_namespaced_pod("serving", namespace)
            pool.submit(send, outcome)
    stop.set()
    for watcher in watchers:
        watcher.join(timeout=5)

    by_kind = Counter(o.kind for o in outcomes)
    assert {"endpoint_not_ready", "listener_closed"} <= set(marks), marks
    # When the server saw SIGTERM: its readiness 503, or (with no delay the drain can be
    # quicker than the watcher's poll) the listener gone.
    stopping = marks.get("ready_503", marks["listener_closed"])
    # Readiness turns false first: with the preStop sleep (as shipped) the endpoint's, while
    # the server is not told yet; without it the server's (503 at SIGTERM, then its delay).
    not_ready_at = marks["endpoint_not_ready"] if prestop_s else marks["ready_503"]
    after_503 = [o for o in outcomes
                 if o.kind == "answered" and o.status == 200 and o.sent_s > not_ready_at]
    print(f"\n{total} requests at {RATE_PER_S:g}/s, preStop sleep {prestop_s}: "
          f"{dict(by_kind)}; statuses {dict(Counter(o.status for o in outcomes if o.status))}; "
          f"marks (s) { {k: round(v, 2) for k, v in marks.items()} }; 200s after readiness "
          f"false: {len(after_503)}")
    lost = [o for o in outcomes if o.kind == "lost"]
    assert lost == [], lost[:5]
    # No route to the pod is its network's teardown, which starts only after the server has
    # stopped accepting; before that it would be a request lost on an accepted connection.
    early = [o for o in outcomes
             if o.kind == "unreachable" and o.sent_s <= marks["listener_closed"]]
    assert early == [], early[:5]
    bad = [o for o in outcomes if o.kind == "answered" and not (
        o.status == 200 or (o.status == 503 and o.retry_after))]
    assert bad == [], bad[:5]
    assert marks["deleted"] < not_ready_at < marks["listener_closed"], marks
    assert marks["endpoint_not_ready"] < marks["listener_closed"], marks
    if prestop_s:
        # The hook held SIGTERM back for its whole sleep, after the endpoint turned not ready.
        assert marks["endpoint_not_ready"] < stopping, marks
        assert stopping - marks["deleted"] >= prestop_s - 0.5, marks
    else:
        assert _prestop_sleep_s(pod) is None
    assert after_503, "nothing was answered while the endpoint was being removed"
    assert by_kind["answered"] > 0 and by_kind["refused"] > 0, by_kind  # both phases seen
