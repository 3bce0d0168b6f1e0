"""A real Kubernetes control plane on 127.0.0.1, for the end-to-end tests and for trying by hand.

Why real components instead of a fake API: the parts of gpufrag that talk to Kubernetes lean on
behaviour a fake would have to re-implement and would get subtly wrong: the scheduler's extender
calls and binding, the Eviction API and PodDisruptionBudgets, Deployment roll-outs, server-side
validation of the manifests. So the harness runs the upstream binaries (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler; built by ``devkit/cluster/build`` into one multi-call
binary) as child processes, each in its own process group, in a temporary directory.

There is no kubelet. Nodes are plain Node objects whose status the harness writes
(:meth:`ControlPlane.create_gpu_node`), and a :class:`devkit.podcompleter.PodCompleter` thread
stands in for the kubelet's two visible effects.

Use it as a context manager::

    with ControlPlane(build_control_plane()) as cp:
        cp.create_gpu_node("gpu-0", gpus=8, product="NVIDIA-A100-SXM4-80GB", gpu_memory_mib=81920)
        core = kubernetes.client.CoreV1Api(cp.api_client())

or from the shell: ``gpufrag dev-cluster up`` and ``gpufrag dev-cluster down``.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import textwrap
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import kubernetes
import yaml

from devkit.build import BUILD_SCRIPT
from devkit.pki import kubeconfig_yaml, make_pki
from devkit.podcompleter import PodCompleter, now_rfc3339
from devkit.procs import (
    EXIT_WITH_PARENT_ENV,
    ComponentProcess,
    ControlPlaneError,
    close_client,
    free_port,
    http_get,
    insecure_tls,
    start_all_or_none,
    wait_until,
)
from gpufrag.conventions import (
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY_MIB,
    LABEL_GPU_PRODUCT,
    RESOURCE_GPU,
    RESOURCE_GPU_MILLI,
)

# Keep the temporary directory (logs, etcd data, kubeconfig) after stop, for post-mortems.
KEEP_DIR_ENV: Final = "GPUFRAG_KEEP_CONTROLPLANE_DIR"

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
# The DRA features the driver uses beyond DynamicResourceAllocation (GA, locked on), named on
# every component that reads them so a change of defaults cannot turn one off unseen: all
# beta and on by default in 1.36 (pkg/features/kube_features.go at v1.36.3), docs/dra.md.
# Consumable capacity (KEP-5075), partitionable devices (KEP-4815: MIG), device taints
# (KEP-5055) and extended-resource mapping (KEP-5004).
DRA_FEATURE_GATES: Final = ("DRAConsumableCapacity=true,DRAPartitionableDevices=true,"
                            "DRADeviceTaints=true,DRAExtendedResource=true")

_MERGE_PATCH: Final = "application/merge-patch+json"
_STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"


# --------------------------------------------------------------------------------------------
# The control plane


_live_planes: weakref.WeakSet[ControlPlane] = weakref.WeakSet()


@atexit.register
def _stop_live_planes() -> None:
    """Last line of defence: an interpreter that exits without __exit__ still stops its clusters."""
    for plane in list(_live_planes):
        with contextlib.suppress(Exception):
            plane.stop()


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


def ensure_namespace(core: Any, name: str, *, timeout_s: float = 90.0) -> None:
    """Make ``name`` an active namespace: created when missing, left as it is when active, and,
    when it is being deleted (an earlier test's or the demo's clean-up), created again once it
    is gone, rather than answering 409 and then refusing every object put in it (``core``: a
    kubernetes CoreV1Api)."""
    def active() -> bool:
        try:
            found = core.read_namespace(name)
        except kubernetes.client.ApiException as e:
            if e.status != 404:
                raise
            try:
                core.create_namespace({"metadata": {"name": name}})
            except kubernetes.client.ApiException as created:
                if created.status != 409:  # a race with another creator: look again
                    raise
            return False
        return (found.status.phase or "Active") == "Active"

    wait_until(active, timeout_s=timeout_s, what=f"namespace {name} to be active")


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
        self.startup_s = start_all_or_none(self._start, self.stop, started=started)
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
                         context=insecure_tls())
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
            close_client(self._api_client)
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
                status, body = http_get(url, context=context, token=token)
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
            f"--feature-gates={DRA_FEATURE_GATES}",
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
            f"--feature-gates={DRA_FEATURE_GATES}",
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
            f"--feature-gates={DRA_FEATURE_GATES}",
        ], port)
        self.schedulers[name] = scheduler
        return scheduler

    def _wait_scheduler_ready(self, scheduler: ComponentProcess) -> None:
        self._wait_ready(scheduler, f"https://127.0.0.1:{scheduler.port}/readyz",
                         context=insecure_tls())

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

    def ensure_namespace(self, name: str, *, timeout_s: float = 90.0) -> str:
        """``name`` as an active namespace (:func:`ensure_namespace`)."""
        ensure_namespace(kubernetes.client.CoreV1Api(self.api_client()), name,
                         timeout_s=timeout_s)
        return name

    def delete_namespace(self, name: str, *, timeout_s: float = 90.0) -> None:
        """Delete a namespace and wait until its pods are gone: the next test on a real node
        then finds the kubelet's GPUs free, not held by pods still terminating. (The rest of
        the namespace goes on being deleted in the background.)"""
        core = kubernetes.client.CoreV1Api(self.api_client())
        core.delete_namespace(name, grace_period_seconds=0)
        wait_until(lambda: not core.list_namespaced_pod(name).items, timeout_s=timeout_s,
                   what=f"the pods of namespace {name} to be deleted")

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
        ``milli_resources``, ``gpus * 1000`` milli-GPU: what gpufrag's device plugin advertises
        on a real node. GPU memory is not advertised (no device plugin does): a memory-share
        pod reaches the extender only because the scheduler configuration has kube-scheduler
        ignore that resource (``MANAGED_RESOURCES``), as on a real node. Labels: the GFD
        product/memory/count labels (per-GPU memory, as GFD reports it) plus ``labels``.
        Condition Ready=True and no not-ready taint, since no node-lifecycle controller runs to
        lift it. ``gpus=0`` makes a CPU-only node (no GPU resources or labels). Returns the
        Node as the API server stored it.
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
        node_labels |= dict(labels or {})
        core.create_node(kubernetes.client.V1Node(
            metadata=kubernetes.client.V1ObjectMeta(name=name, labels=node_labels)))
        now = now_rfc3339()
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
        return self.lift_not_ready_taint(name)

    def lift_not_ready_taint(self, name: str) -> kubernetes.client.V1Node:
        """Remove the not-ready taint from a Ready Node, as the node-lifecycle controller (off
        here, see CONTROLLERS) would; returns the Node."""
        core = kubernetes.client.CoreV1Api(self.api_client())
        node = core.read_node(name)
        current = (node.spec.taints if node.spec is not None else None) or []
        taints = [t for t in current if t.key != NOT_READY_TAINT]
        if len(taints) != len(current):
            node = core.patch_node(name, {"spec": {"taints": [
                core.api_client.sanitize_for_serialization(t) for t in taints] or None}},
                _content_type=_MERGE_PATCH)
        return node


