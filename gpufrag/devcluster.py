"""A real Kubernetes control plane on 127.0.0.1, for the end-to-end tests and for trying by hand.

Why real components instead of a fake API: the parts of gpufrag that talk to Kubernetes lean on
behaviour a fake would have to re-implement and would get subtly wrong — the scheduler's extender
calls and binding, the Eviction API and PodDisruptionBudgets, Deployment roll-outs, server-side
validation of the manifests. So the harness runs the upstream binaries (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler; built by ``tests/e2e/cluster/build`` into one multi-call
binary) as child processes, each in its own process group, in a temporary directory.

There is no kubelet. Nodes are plain Node objects whose status the harness writes
(:meth:`ControlPlane.create_gpu_node`), and a :class:`PodCompleter` thread stands in for the
kubelet's two visible effects: bound pods become Running and Ready, and pods being deleted go
away (grace period 0), so Deployments, PDBs and evictions behave as on a live cluster.

Use it as a context manager::

    with ControlPlane(build_control_plane()) as cp:
        cp.create_gpu_node("gpu-0", gpus=8, product="NVIDIA-A100-SXM4-80GB", gpu_memory_mib=81920)
        core = kubernetes.client.CoreV1Api(cp.api_client())

or from the shell: ``gpufrag dev-cluster up`` (foreground, Ctrl-C stops it; ``--detach`` to run
it in the background) and ``gpufrag dev-cluster down``.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Final, Protocol, TypeVar

import kubernetes
import yaml

from gpufrag.conventions import (
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY_MIB,
    LABEL_GPU_PRODUCT,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY_MIB,
    RESOURCE_GPU_MILLI,
    SCHEDULER_NAME,
)
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK

T = TypeVar("T")

# The build script lives with the tests; this module finds it from a source checkout.
REPO_ROOT: Final = Path(__file__).resolve().parent.parent
BUILD_SCRIPT: Final = REPO_ROOT / "tests" / "e2e" / "cluster" / "build"
# A prebuilt binary to use instead of running the build script (e.g. built once for many runs).
BINARY_ENV: Final = "GPUFRAG_CONTROLPLANE_BINARY"
# Keep the temporary directory (logs, etcd data, kubeconfig) after stop, for post-mortems.
KEEP_DIR_ENV: Final = "GPUFRAG_KEEP_CONTROLPLANE_DIR"
# Read by the multi-call binary (set to our pid): exit once that process is gone, so a
# SIGKILLed test run leaves no orphaned API server behind (see main.go).
EXIT_WITH_PARENT_ENV: Final = "GPUFRAG_EXIT_WITH_PARENT"

DEFAULT_SCHEDULER_NAME: Final = "default-scheduler"
SERVICE_CLUSTER_IP_RANGE: Final = "10.96.0.0/12"
ADVERTISE_ADDRESS: Final = "192.0.2.1"
# Without a node-lifecycle controller nothing would ever lift the not-ready taint that the
# TaintNodesByCondition admission plugin puts on every new Node (see create_gpu_node).
NOT_READY_TAINT: Final = "node.kubernetes.io/not-ready"
# Controllers switched off: the node-lifecycle controller would mark every node NotReady and
# evict its pods, because fake nodes send no heartbeats. Everything else (deployment, replicaset,
# disruption, garbage collector, service accounts, namespaces, ...) runs as on a real cluster.
CONTROLLERS: Final = "*,-node-lifecycle-controller"

LOG_TAIL_LINES: Final = 40
_MERGE_PATCH: Final = "application/merge-patch+json"
_STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"


class ProgressSink(Protocol):
    """Where the build's progress lines go (sys.stderr, or pytest's terminal reporter)."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class ControlPlaneError(RuntimeError):
    """A component could not be started or answered wrongly; the message carries its log tail."""


class BuildError(ControlPlaneError):
    """The control-plane build failed; the message carries the build's own output."""


# --------------------------------------------------------------------------------------------
# Building


def build_control_plane(
    script: Path = BUILD_SCRIPT,
    *,
    timeout_s: float | None = None,
    progress: ProgressSink | None = None,
) -> Path:
    """Run the build script (a no-op when its cache is warm) and return the binary's path.

    ``GPUFRAG_CONTROLPLANE_BINARY``, when set, wins: the path is checked and returned unbuilt.
    The build's stderr is streamed to ``progress`` when given, because a cold build takes tens of
    minutes and silence for that long looks like a hang.
    """
    preset = os.environ.get(BINARY_ENV)
    if preset:
        binary = Path(preset)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise BuildError(f"{BINARY_ENV}={preset!r} is not an executable file; unset it to "
                             f"build with {script}")
        return binary
    if not script.is_file():
        raise BuildError(f"build script {script} not found: run from a source checkout of gpufrag, "
                         f"or set {BINARY_ENV} to a binary built by tests/e2e/cluster/build")
    started = time.monotonic()
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    err_lines: list[str] = []

    def pump_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            if progress is not None:
                progress.write(line)
                progress.flush()

    pump = threading.Thread(target=pump_stderr, name="build-stderr", daemon=True)
    pump.start()
    assert proc.stdout is not None
    try:
        out = proc.stdout.read()
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pump.join(timeout=5)
        raise BuildError(f"control-plane build did not finish in {timeout_s:.0f}s; last output:\n"
                         + "".join(err_lines[-LOG_TAIL_LINES:])) from None
    pump.join(timeout=5)
    if code != 0:
        raise BuildError(f"control-plane build ({script}) failed with exit code {code} after "
                         f"{time.monotonic() - started:.0f}s; last output:\n"
                         + "".join(err_lines[-LOG_TAIL_LINES:]))
    lines = [line for line in out.splitlines() if line.strip()]
    binary = Path(lines[-1].strip()) if lines else Path()
    if not lines or not binary.is_file():
        raise BuildError(f"control-plane build printed no binary path as its last line "
                         f"(stdout: {out[-500:]!r})")
    return binary


# --------------------------------------------------------------------------------------------
# Processes


_issued_ports: set[int] = set()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and that this process never handed out.

    Remembering issued ports matters because several components are launched before any of them
    binds: the kernel could hand the same just-closed port out twice.
    """
    with _ports_lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port: int = sock.getsockname()[1]
            if port not in _issued_ports:
                _issued_ports.add(port)
                return port


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist yet)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ComponentProcess:
    """One running component: its process (leader of its own process group), log and port."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    port: int

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)

    def describe_failure(self, what: str) -> str:
        """An error message that shows what the component said last, so nobody has to go digging."""
        return (f"{self.name} {what}\n--- last {LOG_TAIL_LINES} lines of {self.log_path} ---\n"
                f"{self.log_tail()}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after ``timeout_s``."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout_s)
        # Kill the group even when the leader has exited: a child it left must not outlive it.
        _signal_group(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _http_get(url: str, *, context: ssl.SSLContext | None, token: str | None,
              timeout_s: float = 2.0) -> tuple[int, str]:
    """GET a health endpoint; returns (status, body) for any HTTP answer, raises OSError if none."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as resp:
            status: int = resp.status
            return status, resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", errors="replace")


def _insecure_tls() -> ssl.SSLContext:
    """For the health endpoints of the controller manager and schedulers, which serve
    self-signed certificates they generate at start; only /healthz and /readyz are read."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def wait_until(condition: Callable[[], T | None], *, timeout_s: float, what: str,
               interval_s: float = 0.2) -> T:
    """Poll ``condition`` until it returns something other than None/False and return that.

    Raises TimeoutError naming ``what`` and the last exception the condition raised, because
    "timed out" alone does not tell a failing test's reader which wait it was.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = condition()
            if result is not None and result is not False:
                return result
        except Exception as e:  # the condition may hit the API before an object exists
            last_error = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}{detail}")
        time.sleep(interval_s)


def _close_client(api_client: kubernetes.client.ApiClient) -> None:
    """Close an ApiClient's connection pool (its close() carries no type hints)."""
    close: Any = api_client.close
    with contextlib.suppress(Exception):
        close()


# --------------------------------------------------------------------------------------------
# The pod completer (stands in for the kubelet)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pending(pod: kubernetes.client.V1Pod) -> bool:
    return pod.status is None or pod.status.phase in (None, "Pending")


def running_status_patch(pod: kubernetes.client.V1Pod) -> dict[str, Any]:
    """The status a kubelet would report once every container of ``pod`` runs and is ready."""
    now = _now()
    conditions = [{"type": t, "status": "True", "lastTransitionTime": now}
                  for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")]
    containers = [{"name": c.name, "image": c.image, "imageID": "", "ready": True, "started": True,
                   "restartCount": 0, "state": {"running": {"startedAt": now}}}
                  for c in (pod.spec.containers if pod.spec is not None else [])]
    return {"status": {"phase": "Running", "startTime": now, "hostIP": "127.0.0.1",
                       "conditions": conditions, "containerStatuses": containers}}


class PodCompleter:
    """Does what a kubelet's pods would visibly do, for every pod in the cluster.

    - A pod with a deletionTimestamp is deleted with grace period 0: without a kubelet to
      confirm the containers stopped, it would stay Terminating forever, and neither an eviction
      nor a Deployment roll-out would ever finish.
    - A pod bound to a node that is still Pending is marked Running and Ready, so Deployments
      count it available and PodDisruptionBudgets count it healthy.

    It lists, then watches from the list's resourceVersion, and relists when the watch expires.
    Errors are kept in :attr:`errors` (the last few) rather than raised: the thread must outlive
    a restarting API server, and tests can assert on it.
    """

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self._api_client = api_client  # its own: a watch holds a connection for seconds
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pod-completer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            if not self._thread.is_alive():
                _close_client(self._api_client)

    def _note(self, message: str) -> None:
        self.errors = [*self.errors[-19:], message]

    def _run(self) -> None:
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    pods = self._core.list_pod_for_all_namespaces(_request_timeout=10)
                    for pod in pods.items:
                        self.reconcile(pod)
                    resource_version = pods.metadata.resource_version if pods.metadata else None
                    if resource_version is None:
                        raise ControlPlaneError("pod list carried no resourceVersion")
                for event_type, pod in self._watch(resource_version):
                    if self._stop.is_set():
                        break
                    if pod.metadata is not None and pod.metadata.resource_version:
                        resource_version = pod.metadata.resource_version
                    if event_type in ("ADDED", "MODIFIED"):
                        self.reconcile(pod)
            except kubernetes.client.ApiException as e:
                if e.status == 410:  # watch too old: start over from a fresh list
                    resource_version = None
                else:
                    self._note(f"pod watch: HTTP {e.status} {e.reason}")
                    self._stop.wait(0.5)
            except Exception as e:  # connection refused while the API server stops, etc.
                if self._stop.is_set():
                    break
                self._note(f"pod watch: {e!r}")
                resource_version = None
                self._stop.wait(0.5)

    def _watch(self, resource_version: str) -> Iterator[tuple[str, kubernetes.client.V1Pod]]:
        """Pod events from ``resource_version`` on, for at most 2 s (a short server-side timeout
        bounds how long stop() waits for this thread)."""
        watch_class: Any = kubernetes.watch.Watch  # the watch module carries no type hints
        for event in watch_class().stream(
                self._core.list_pod_for_all_namespaces, resource_version=resource_version,
                timeout_seconds=2, allow_watch_bookmarks=True, _request_timeout=10):
            pod = event["object"]
            if isinstance(pod, kubernetes.client.V1Pod):  # BOOKMARKs arrive as plain dicts
                yield str(event["type"]), pod

    def reconcile(self, pod: kubernetes.client.V1Pod) -> None:
        """Move one pod one step the way its kubelet would."""
        meta = pod.metadata
        if meta is None or meta.name is None or meta.namespace is None:
            return
        try:
            if meta.deletion_timestamp is not None:
                self._core.delete_namespaced_pod(
                    meta.name, meta.namespace, grace_period_seconds=0,
                    body=kubernetes.client.V1DeleteOptions(
                        grace_period_seconds=0,
                        preconditions=kubernetes.client.V1Preconditions(uid=meta.uid)))
            elif pod.spec is not None and pod.spec.node_name and _pending(pod):
                self._core.patch_namespaced_pod_status(
                    meta.name, meta.namespace, running_status_patch(pod),
                    _content_type=_STRATEGIC_MERGE_PATCH)
        except kubernetes.client.ApiException as e:
            if e.status not in (404, 409):  # gone already, or a newer version of it exists
                self._note(f"{meta.namespace}/{meta.name}: HTTP {e.status} {e.reason}")


# --------------------------------------------------------------------------------------------
# The control plane


_live_planes: weakref.WeakSet[ControlPlane] = weakref.WeakSet()


@atexit.register
def _stop_live_planes() -> None:
    """Last line of defence: an interpreter that exits without __exit__ still stops its clusters."""
    for plane in list(_live_planes):
        with contextlib.suppress(Exception):
            plane.stop()


def _run_openssl(args: Sequence[str], cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def make_pki(pki_dir: Path, service_ip: str) -> None:
    """A CA, an API-server serving certificate signed by it, and a service-account key pair.

    Made with the openssl command line because it is everywhere the build can run and the
    ``cryptography`` package is not a dependency. RSA 2048 keeps it quick (well under a second).
    """
    if shutil.which("openssl") is None:
        raise ControlPlaneError("the 'openssl' command is needed to make the control plane's "
                                "certificates; install it (e.g. the openssl package)")
    pki_dir.mkdir(parents=True, exist_ok=True)
    _run_openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                  "-out", "ca.crt", "-days", "3650", "-subj", "/CN=gpufrag-dev-ca",
                  "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"], pki_dir)
    sans = ["IP:127.0.0.1", f"IP:{service_ip}", "DNS:localhost", "DNS:kubernetes",
            "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local"]
    (pki_dir / "apiserver.ext").write_text(
        f"subjectAltName={','.join(sans)}\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n")
    _run_openssl(["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key",
                  "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver"], pki_dir)
    _run_openssl(["x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                  "-CAcreateserial", "-days", "3650", "-out", "apiserver.crt",
                  "-extfile", "apiserver.ext"], pki_dir)
    _run_openssl(["genrsa", "-out", "sa.key", "2048"], pki_dir)
    _run_openssl(["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"], pki_dir)


def kubeconfig_yaml(server: str, ca_pem: bytes, token: str) -> str:
    """An admin kubeconfig with the CA inlined, so the file can be copied elsewhere."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpufrag-dev", "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_pem).decode("ascii")}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "gpufrag-dev", "context": {
            "cluster": "gpufrag-dev", "user": "admin", "namespace": "default"}}],
        "current-context": "gpufrag-dev",
    }
    return yaml.safe_dump(config, sort_keys=False)


def scheduler_config(config_yaml: str, kubeconfig: Path) -> dict[str, Any]:
    """The caller's KubeSchedulerConfiguration, adjusted to run beside other schedulers here.

    - ``clientConnection.kubeconfig`` points at this cluster (with ``--config`` the
      ``--kubeconfig`` flag is ignored, so it has to be in the file).
    - Leader election is off: schedulers would otherwise queue on a shared lease, and a test
      cluster has exactly one replica of each.
    - ``percentageOfNodesToScore`` is 100, so every feasible node is scored and placements are
      deterministic, whatever the cluster size (upstream samples nodes above 100).
    """
    config = yaml.safe_load(config_yaml) or {}
    if not isinstance(config, dict):
        raise ValueError(f"scheduler config must be a YAML mapping, got {type(config).__name__}")
    config.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
    config.setdefault("kind", "KubeSchedulerConfiguration")
    client = config.get("clientConnection") or {}
    client["kubeconfig"] = str(kubeconfig)
    config["clientConnection"] = client
    config["leaderElection"] = {"leaderElect": False}
    config["percentageOfNodesToScore"] = 100
    return config


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler on 127.0.0.1.

    Everything lives in one temporary directory (``work_dir``): etcd data, certificates, the
    admin kubeconfig and one log per component under ``logs/``. Ports are picked free at start,
    so several control planes (parallel test sessions) can run side by side.

    ``stop()`` (also on ``__exit__`` and at interpreter exit) terminates every component's
    process group; the components also exit by themselves if this process dies without cleaning
    up (``GPUFRAG_EXIT_WITH_PARENT``, honoured by the binary).
    """

    def __init__(self, binary: Path | str, *, work_dir: Path | None = None,
                 start_timeout_s: float = 120.0, complete_pods: bool = True,
                 keep_work_dir: bool | None = None) -> None:
        self.binary = Path(binary).resolve()
        if not (self.binary.is_file() and os.access(self.binary, os.X_OK)):
            raise ControlPlaneError(f"control-plane binary {self.binary} is not an executable "
                                    f"file; build it with {BUILD_SCRIPT}")
        self._own_work_dir = work_dir is None
        self.work_dir = (Path(tempfile.mkdtemp(prefix="gpufrag-controlplane-"))
                         if work_dir is None else work_dir)
        self.start_timeout_s = start_timeout_s
        self.complete_pods = complete_pods
        self.keep_work_dir = (os.environ.get(KEEP_DIR_ENV, "") not in ("", "0")
                              if keep_work_dir is None else keep_work_dir)
        self.logs_dir = self.work_dir / "logs"
        self.pki_dir = self.work_dir / "pki"
        self.kubeconfig_path = self.work_dir / "admin.kubeconfig"
        self.token = secrets.token_hex(16)
        self.service_ip = str(next(ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE).hosts()))
        self.apiserver_port = 0
        self.components: dict[str, ComponentProcess] = {}
        self.schedulers: dict[str, ComponentProcess] = {}
        self.completer: PodCompleter | None = None
        self.startup_s: float | None = None
        self._api_client: kubernetes.client.ApiClient | None = None
        self._stopped = False

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://127.0.0.1:{self.apiserver_port}"

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start every component and wait until each reports ready; stops them all on failure."""
        started = time.monotonic()
        _live_planes.add(self)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _start(self) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        # etcd needs no certificates (plain HTTP on loopback): it elects itself leader while the
        # certificates are made.
        etcd = self._start_etcd()
        make_pki(self.pki_dir, self.service_ip)
        (self.pki_dir / "tokens.csv").write_text(
            f'{self.token},admin,gpufrag-admin,"system:masters"\n')
        self._wait_ready(etcd, f"http://127.0.0.1:{etcd.port}/health", context=None,
                         healthy=lambda body: '"health":"true"' in body.replace(" ", ""))
        apiserver = self._start_apiserver(etcd.port)
        self.kubeconfig_path.write_text(kubeconfig_yaml(
            self.server, (self.pki_dir / "ca.crt").read_bytes(), self.token))
        self.kubeconfig_path.chmod(0o600)
        ca_context = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        self._wait_ready(apiserver, f"{self.server}/readyz", context=ca_context, token=self.token)

        # The controller manager and the default scheduler start together: they only need the
        # API server, and waiting for them one after the other would add their start-up times.
        controller_manager = self._start_controller_manager()
        self._launch_scheduler(DEFAULT_SCHEDULER_NAME, f"""
            apiVersion: kubescheduler.config.k8s.io/v1
            kind: KubeSchedulerConfiguration
            profiles:
            - schedulerName: {DEFAULT_SCHEDULER_NAME}
            """)
        self._wait_ready(controller_manager,
                         f"https://127.0.0.1:{controller_manager.port}/healthz",
                         context=_insecure_tls())
        self._wait_scheduler_ready(self.schedulers[DEFAULT_SCHEDULER_NAME])

        core = kubernetes.client.CoreV1Api(self.api_client())
        # Pods are refused in a namespace until its "default" service account exists; the
        # service-account controller makes it shortly after start.
        wait_until(lambda: core.read_namespaced_service_account("default", "default"),
                   timeout_s=self.start_timeout_s,
                   what="the service-account controller to create default/default")
        if self.complete_pods:
            self.completer = PodCompleter(self.new_api_client())
            self.completer.start()

    def stop(self) -> None:
        """Stop everything (schedulers first, etcd last); idempotent and safe after a failure."""
        if self._stopped:
            return
        self._stopped = True
        if self.completer is not None:
            self.completer.stop(timeout_s=0)  # it notices within its 2 s watch timeout
        for component in [*self.schedulers.values(), *reversed(self.components.values())]:
            component.stop()
        if self.completer is not None:
            self.completer.stop()
        if self._api_client is not None:
            _close_client(self._api_client)
        _live_planes.discard(self)
        if self._own_work_dir and not self.keep_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    # -- components -------------------------------------------------------------------------

    def _launch(self, name: str, component: str, args: Sequence[str], port: int
                ) -> ComponentProcess:
        log_path = self.logs_dir / f"{name}.log"
        env = {**os.environ, EXIT_WITH_PARENT_ENV: str(os.getpid())}
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [str(self.binary), component, *args], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=self.work_dir, env=env,
                start_new_session=True)  # own process group: stop() kills it and its children
        return ComponentProcess(name=name, process=process, log_path=log_path, port=port)

    def _wait_ready(self, component: ComponentProcess, url: str, *,
                    context: ssl.SSLContext | None, token: str | None = None,
                    healthy: Callable[[str], bool] = lambda body: body.strip() == "ok") -> None:
        """Poll a health URL until it answers 200 and ``healthy(body)``; fail fast if the process
        exits, and on timeout say what the endpoint last answered and what the log says."""
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer yet"
        while True:
            if not component.running():
                raise ControlPlaneError(component.describe_failure(
                    f"exited with code {component.process.returncode} before it was ready"))
            try:
                status, body = _http_get(url, context=context, token=token)
                if status == 200 and healthy(body):
                    return
                last = f"HTTP {status}: {body.strip()[-1000:]}"
            except OSError as e:
                last = repr(e)
            if time.monotonic() >= deadline:
                raise ControlPlaneError(component.describe_failure(
                    f"was not ready at {url} after {self.start_timeout_s:.0f}s "
                    f"(last answer: {last})"))
            time.sleep(0.2)

    def _start_etcd(self) -> ComponentProcess:
        client_port, peer_port = free_port(), free_port()
        peer = f"http://127.0.0.1:{peer_port}"
        client = f"http://127.0.0.1:{client_port}"
        etcd = self._launch("etcd", "etcd", [
            "--name=gpufrag-dev",
            f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=gpufrag-dev={peer}",
            # Test data is thrown away: skipping fsync makes every API write much faster.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ], client_port)
        self.components["etcd"] = etcd
        return etcd

    def _start_apiserver(self, etcd_port: int) -> ComponentProcess:
        port = free_port()
        self.apiserver_port = port
        pki = self.pki_dir
        apiserver = self._launch("kube-apiserver", "kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            # The address published in the "kubernetes" Service's endpoints must not be loopback
            # (the API server refuses to write it, and logs so every few seconds); nothing here
            # dials it, so a documentation address (RFC 5737) does. Clients use 127.0.0.1.
            f"--advertise-address={ADVERTISE_ADDRESS}", "--external-hostname=127.0.0.1",
            f"--cert-dir={pki / 'apiserver-generated'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            # Published for delegated authentication: without a request-header CA the controller
            # manager and every scheduler log "missing content for CA bundle" over and over.
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            # The default admission plugins stay on: the tests should see what a cluster does.
        ], port)
        self.components["kube-apiserver"] = apiserver
        return apiserver

    def _start_controller_manager(self) -> ComponentProcess:
        port = free_port()
        kubeconfig = str(self.kubeconfig_path)
        pki = self.pki_dir
        controller_manager = self._launch("kube-controller-manager", "kube-controller-manager", [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={pki / 'controller-manager'}",
            "--leader-elect=false",
            f"--controllers={CONTROLLERS}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        ], port)
        self.components["kube-controller-manager"] = controller_manager
        return controller_manager

    def _launch_scheduler(self, name: str, config_yaml: str) -> ComponentProcess:
        if name in self.schedulers and self.schedulers[name].running():
            raise ValueError(f"a scheduler named {name!r} is already running; "
                             "stop_scheduler() it first or pick another name")
        if not name or "/" in name:
            raise ValueError(f"scheduler name {name!r} must be non-empty and contain no '/'")
        config = scheduler_config(textwrap.dedent(config_yaml), self.kubeconfig_path)
        config_dir = self.work_dir / "schedulers"
        config_dir.mkdir(exist_ok=True)
        config_path = config_dir / f"{name}.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        kubeconfig = str(self.kubeconfig_path)
        scheduler = self._launch(f"scheduler-{name}", "kube-scheduler", [
            f"--config={config_path}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.pki_dir / ('scheduler-' + name)}",
        ], port)
        self.schedulers[name] = scheduler
        return scheduler

    def _wait_scheduler_ready(self, scheduler: ComponentProcess) -> None:
        self._wait_ready(scheduler, f"https://127.0.0.1:{scheduler.port}/readyz",
                         context=_insecure_tls())

    def start_scheduler(self, name: str, config_yaml: str) -> ComponentProcess:
        """Start another kube-scheduler process with the given KubeSchedulerConfiguration.

        A separate process, because a configuration's ``extenders`` apply to every profile it
        holds: gpufrag-scheduler (with the extender) cannot share a process with the default
        scheduler. ``name`` names the process (log ``logs/scheduler-<name>.log``, and
        :meth:`stop_scheduler`); the pods it schedules are chosen by the profiles'
        ``schedulerName`` inside ``config_yaml``. The harness sets the kubeconfig, turns leader
        election off and scores all nodes (see :func:`scheduler_config`). Returns once /readyz
        answers ok.
        """
        scheduler = self._launch_scheduler(name, config_yaml)
        try:
            self._wait_scheduler_ready(scheduler)
        except BaseException:
            self.stop_scheduler(name)
            raise
        return scheduler

    def stop_scheduler(self, name: str) -> None:
        """Stop a scheduler started by :meth:`start_scheduler` (no-op if it is not running)."""
        scheduler = self.schedulers.pop(name, None)
        if scheduler is not None:
            scheduler.stop()

    # -- clients ----------------------------------------------------------------------------

    def new_api_client(self) -> kubernetes.client.ApiClient:
        """A fresh ``kubernetes.client.ApiClient`` for this cluster (the caller closes it)."""
        load: Any = kubernetes.config.new_client_from_config  # untyped in the client
        client: kubernetes.client.ApiClient = load(config_file=str(self.kubeconfig_path))
        return client

    def api_client(self) -> kubernetes.client.ApiClient:
        """The shared ``kubernetes.client.ApiClient`` for this cluster, closed by stop()."""
        if self._api_client is None:
            self._api_client = self.new_api_client()
        return self._api_client

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True,
                timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the bundled kubectl against this cluster; raises ControlPlaneError on failure
        (with kubectl's stderr) when ``check``."""
        command = [str(self.binary), "kubectl", f"--kubeconfig={self.kubeconfig_path}", *args]
        result = subprocess.run(command, input=input_text, capture_output=True, text=True,
                                timeout=timeout_s, check=False)
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} exited {result.returncode}: "
                                    f"{result.stderr.strip()}")
        return result

    # -- objects ----------------------------------------------------------------------------

    def create_namespace(self, name: str, *, timeout_s: float = 30.0) -> str:
        """Create a namespace and wait for its default service account (pods need it)."""
        core = kubernetes.client.CoreV1Api(self.api_client())
        core.create_namespace(kubernetes.client.V1Namespace(
            metadata=kubernetes.client.V1ObjectMeta(name=name)))
        wait_until(lambda: core.read_namespaced_service_account("default", name),
                   timeout_s=timeout_s, what=f"service account {name}/default")
        return name

    def create_gpu_node(
        self,
        name: str,
        gpus: int,
        product: str,
        gpu_memory_mib: int,
        cpu_milli: int = 64_000,
        memory_mib: int = 256 * 1024,
        milli_resources: bool = True,
        labels: Mapping[str, str] | None = None,
        pods: int = 110,
    ) -> kubernetes.client.V1Node:
        """Create a Node that looks like a GPU node with the device plugin and GFD running.

        Capacity and allocatable: cpu, memory, pods, ``nvidia.com/gpu`` = gpus and, when
        ``milli_resources``, the shared-GPU resources (``gpus * 1000`` milli-GPU and
        ``gpus * gpu_memory_mib`` MiB). Labels: the GFD product/memory/count labels (per-GPU
        memory, as GFD reports it) plus ``labels``. Condition Ready=True and no not-ready taint,
        since no node-lifecycle controller runs to lift it. ``gpus=0`` makes a CPU-only node
        (no GPU resources or labels). Returns the Node as the API server stored it.
        """
        if gpus < 0 or gpu_memory_mib < 0 or cpu_milli <= 0 or memory_mib <= 0 or pods <= 0:
            raise ValueError(f"node {name!r}: gpus={gpus}, gpu_memory_mib={gpu_memory_mib} must "
                             f"be >= 0 and cpu_milli={cpu_milli}, memory_mib={memory_mib}, "
                             f"pods={pods} > 0")
        core = kubernetes.client.CoreV1Api(self.api_client())
        node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64"}
        resources = {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi", "pods": str(pods)}
        if gpus > 0:
            node_labels |= {LABEL_GPU_PRODUCT: product, LABEL_GPU_MEMORY_MIB: str(gpu_memory_mib),
                            LABEL_GPU_COUNT: str(gpus)}
            resources[RESOURCE_GPU] = str(gpus)
            if milli_resources:
                resources[RESOURCE_GPU_MILLI] = str(gpus * 1000)
                resources[RESOURCE_GPU_MEMORY_MIB] = str(gpus * gpu_memory_mib)
        node_labels |= dict(labels or {})
        core.create_node(kubernetes.client.V1Node(
            metadata=kubernetes.client.V1ObjectMeta(name=name, labels=node_labels)))
        now = _now()
        core.patch_node_status(name, {"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "fake node (gpufrag dev cluster)",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                         "kubeletVersion": "v0.0.0-fake", "containerRuntimeVersion": "fake://0",
                         "osImage": "", "kernelVersion": "", "kubeProxyVersion": "",
                         "machineID": "", "systemUUID": "", "bootID": ""}}},
            _content_type=_STRATEGIC_MERGE_PATCH)
        node = core.read_node(name)
        current = (node.spec.taints if node.spec is not None else None) or []
        taints = [t for t in current if t.key != NOT_READY_TAINT]
        if len(taints) != len(current):
            node = core.patch_node(name, {"spec": {"taints": [
                core.api_client.sanitize_for_serialization(t) for t in taints] or None}},
                _content_type=_MERGE_PATCH)
        return node


# --------------------------------------------------------------------------------------------
# gpufrag-scheduler: kube-scheduler + the gpufrag extender (shared by demo, tests, benchmarks)


# Why weight 200: see manifests/base/scheduler-config.yaml (one extender point outweighs all
# default score plugins together, so the extender's ranking decides).
_GPUFRAG_SCHEDULER_CONFIG: Final = """\
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


def gpufrag_scheduler_config(url: str, *, ignorable: bool = False, bind: bool = True,
                             name: str = SCHEDULER_NAME) -> str:
    """A KubeSchedulerConfiguration whose profile ``name`` calls the extender at ``url``
    (filter, prioritize and, with ``bind``, bind), for :meth:`ControlPlane.start_scheduler`."""
    return _GPUFRAG_SCHEDULER_CONFIG.format(
        name=name, url=url, ignorable=str(ignorable).lower(),
        bind="    bindVerb: bind\n" if bind else "")


@dataclass
class ExtenderProcess:
    """``gpufrag extender`` watching a control plane, in its own process, on a free port.

    A subprocess rather than a thread because that is how it runs in a cluster (its own
    gunicorn worker, its own watches), and so that its log is the JSON it writes in production.
    """

    control_plane: ControlPlane
    log_path: Path
    extra_args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> ExtenderProcess:
        """Start it and wait until /readyz answers 200 (its cache has listed the cluster)."""
        env = {**os.environ, "GPUFRAG_LOG_FORMAT": "json"}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpufrag.cli", "extender", "--kubeconfig",
                 str(self.control_plane.kubeconfig_path), "--host", "127.0.0.1", "--port",
                 str(self.port), "--set", "maintenance_interval_s=1", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
        try:
            wait_until(self._ready, timeout_s=timeout_s, what=f"extender ready on {self.url}")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool | None:
        if self.process is not None and self.process.poll() is not None:
            raise ControlPlaneError(f"extender exited with {self.process.returncode}:\n"
                                    + tail(self.log_path))
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as reply:
                return reply.status == 200 or None
        except OSError:
            return None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; a no-op when it is not running."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def log_events(self, event: str) -> Iterator[dict[str, Any]]:
        """The extender's JSON log lines for one event (verb), oldest first."""
        for line in self.log_path.read_text().split("\n")[:-1]:  # the last: unfinished
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("event") == event:
                    yield record

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as reply:
            return str(reply.read().decode())


# --------------------------------------------------------------------------------------------
# CLI: gpufrag dev-cluster up|down


def default_state_dir() -> Path:
    """Where ``up --detach`` records the running cluster for ``down``."""
    root = os.environ.get("GPUFRAG_CACHE_DIR") or str(Path.home() / ".cache" / "gpufrag")
    return Path(root) / "dev-cluster"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_state(state_file: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return state


def _usage_lines(plane: ControlPlane) -> list[str]:
    bin_dir = plane.binary.parent
    return [
        f"control plane up at {plane.server} (started in {plane.startup_s or 0:.1f}s)",
        f"  export KUBECONFIG={plane.kubeconfig_path}",
        f"  {bin_dir / 'kubectl'} get nodes",
        f"  logs: {plane.logs_dir}",
    ]


def _create_demo_nodes(plane: ControlPlane, count: int) -> None:
    for i in range(count):
        plane.create_gpu_node(f"gpu-node-{i}", gpus=8, product="NVIDIA-A100-SXM4-80GB",
                              gpu_memory_mib=81920, cpu_milli=96_000, memory_mib=1024 * 1024)


def _cmd_up(args: argparse.Namespace) -> int:
    state_file: Path = args.state_file
    state = _read_state(state_file)
    if state is not None and _pid_alive(int(state.get("pid", 0))):
        print(f"dev-cluster: already running (pid {state['pid']}, kubeconfig "
              f"{state.get('kubeconfig')}); run 'gpufrag dev-cluster down' first", file=sys.stderr)
        return EXIT_FAILURE
    if args.detach:
        return _up_detached(args)

    try:
        binary = Path(args.binary) if args.binary else build_control_plane(progress=sys.stderr)
    except BuildError as e:
        print(f"dev-cluster: {e}", file=sys.stderr)
        return EXIT_FAILURE

    stop_requested = threading.Event()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # during start-up: unwind through plane.start()'s cleanup

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    # SIGTERM (from 'down') must clean up like Ctrl-C does; Python's default would just die.
    signal.signal(signal.SIGTERM, interrupt)
    plane = ControlPlane(binary, start_timeout_s=args.timeout_s)
    try:
        try:
            plane.start()
        except KeyboardInterrupt:
            print("dev-cluster: interrupted during start-up", file=sys.stderr)
            return EXIT_FAILURE
        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        _create_demo_nodes(plane, args.gpu_nodes)
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps({
            "pid": os.getpid(), "kubeconfig": str(plane.kubeconfig_path), "server": plane.server,
            "work_dir": str(plane.work_dir), "binary": str(plane.binary)}))
        for line in _usage_lines(plane):
            print(line, flush=True)
        if not args.quiet_wait:
            print("Ctrl-C stops it.", flush=True)
        while not stop_requested.wait(1.0):
            dead = [c for c in [*plane.components.values(), *plane.schedulers.values()]
                    if not c.running()]
            if dead:
                print(f"dev-cluster: {dead[0].describe_failure('stopped unexpectedly')}",
                      file=sys.stderr)
                return EXIT_FAILURE
        return EXIT_OK
    except ControlPlaneError as e:
        print(f"dev-cluster: {e}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        plane.stop()
        state = _read_state(state_file)
        if state is not None and state.get("pid") == os.getpid():
            state_file.unlink(missing_ok=True)


def _up_detached(args: argparse.Namespace) -> int:
    """Start ``up`` again as a background session leader and wait until it reports ready.

    The control plane needs a live Python process beside it (the pod completer), so detaching
    means a background ``up``, not orphaned components.
    """
    state_file: Path = args.state_file
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.unlink(missing_ok=True)
    log_path = state_file.with_suffix(".log")
    command = [sys.executable, "-m", "gpufrag.devcluster", "up", "--quiet-wait",
               f"--state-file={state_file}", f"--timeout-s={args.timeout_s}",
               f"--gpu-nodes={args.gpu_nodes}"]
    if args.binary:
        command.append(f"--binary={args.binary}")
    with log_path.open("wb") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    # The cold build alone can take half an hour; the child's log shows progress.
    print(f"dev-cluster: starting in the background (pid {child.pid}, log {log_path})",
          file=sys.stderr)
    while True:
        state = _read_state(state_file)
        if state is not None and state.get("pid") == child.pid:
            print(f"dev-cluster: running in the background (pid {child.pid}); "
                  "'gpufrag dev-cluster down' stops it")
            print(f"  export KUBECONFIG={state['kubeconfig']}")
            print(f"  {Path(state['binary']).parent / 'kubectl'} get nodes")
            return EXIT_OK
        if child.poll() is not None:
            print(f"dev-cluster: background start failed (exit {child.returncode}):\n"
                  f"{tail(log_path)}", file=sys.stderr)
            return EXIT_FAILURE
        time.sleep(0.5)


def _cmd_down(args: argparse.Namespace) -> int:
    state_file: Path = args.state_file
    state = _read_state(state_file)
    if state is None:
        print(f"dev-cluster: nothing recorded in {state_file}; nothing to stop", file=sys.stderr)
        return EXIT_OK
    pid = int(state.get("pid", 0))
    if pid > 0 and _pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout_s
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid_alive(pid):
            # It ignored SIGTERM; its components exit on their own once it is gone.
            _signal_group(pid, signal.SIGKILL)
    state_file.unlink(missing_ok=True)
    print(f"dev-cluster: stopped (pid {pid})")
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufrag dev-cluster",
        description="Start or stop a local Kubernetes control plane (etcd, kube-apiserver, "
                    "controller-manager, scheduler; no kubelet) on 127.0.0.1.")
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="build if needed, start, and stay in the foreground")
    up.add_argument("--binary", help=f"use this control-plane binary instead of building "
                                     f"(also: {BINARY_ENV})")
    up.add_argument("--detach", action="store_true",
                    help="run in the background; stop it with 'gpufrag dev-cluster down'")
    up.add_argument("--gpu-nodes", type=int, default=0, metavar="N",
                    help="create N fake nodes with 8 A100-80GB GPUs each (default 0)")
    up.add_argument("--timeout-s", type=float, default=120.0,
                    help="how long each component may take to become ready (default 120)")
    up.add_argument("--quiet-wait", action="store_true", help=argparse.SUPPRESS)
    down = sub.add_parser("down", help="stop a cluster started with 'up --detach'")
    down.add_argument("--timeout-s", type=float, default=60.0,
                      help="how long to wait for a clean stop before killing (default 60)")
    for p in (up, down):
        p.add_argument("--state-file", type=Path, default=default_state_dir() / "state.json",
                       help="where the running cluster is recorded (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``gpufrag dev-cluster up|down``."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage and 0 on --help
        return EXIT_OK if e.code in (0, None) else EXIT_BAD_INPUT
    if args.action == "up":
        if args.gpu_nodes < 0:
            print(f"dev-cluster: --gpu-nodes must be >= 0, got {args.gpu_nodes}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return _cmd_up(args)
    return _cmd_down(args)


if __name__ == "__main__":
    sys.exit(main())
