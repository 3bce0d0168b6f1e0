"""A real node beside the dev control plane: the upstream kubelet, and containerd + runc + CNI.

The kubelet is the ``kubelet`` entry of the multi-call binary ``devkit/cluster/build`` makes (the
same ``k8s.io/kubernetes`` module as the control plane). The runtime is either

- ``"containerd"``: containerd 2 (the daemon, its runc shim and ``ctr``, built from the
  containerd module as the dev-kit tool ``devkit/tools/containerd``) with Debian's runc and
  containernetworking-plugins (``scripts/install-node-deps``), with a private config, state and
  socket under the node's directory and its root (the image store) kept between runs (see
  below); pods get a bridge network (``gpufrag0``, 10.244.0.0/24, host-local IPAM) and really
  run; images are imported into containerd's store from OCI archives (no registry, no pull);
  its CRI plugin applies CDI devices from :attr:`Node.cdi_dir` (containerd 2 always does;
  Debian's 1.6 predates CDI), so a DRA driver's container edits reach the container; or
- ``"fake"``: upstream's fake CRI (``k8s.io/cri-client/pkg/fake``, the ``fake-cri`` entry of
  the same binary): admission, the device manager and the pod lifecycle run, no container does.

``runtime="auto"`` picks containerd when its binaries exist and runc can start a container here
(:func:`probe_containers`), else the fake one, and says which in :attr:`Node.runtime`.

The node authenticates with a client certificate minted from the control plane's CA as
``system:node:<name>`` in ``system:nodes``, so the Node authorizer and NodeRestriction apply to it
exactly as in a cluster.

One node per machine: the kubelet's device-plugin registration socket is not under its
``--root-dir`` but fixed at ``/var/lib/kubelet/device-plugins/kubelet.sock``
(``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1.KubeletSocket``), so :class:`Node` holds an
exclusive lock (``/run/gpufrag-node.lock``) while it runs.

Settings that this machine needs (cgroup v1 hierarchy, no systemd) are in :func:`kubelet_config`.

containerd's root (its content store, image metadata and unpacked snapshots) is kept between
runs in ``$GPUFRAG_CACHE_DIR/node/containerd2-root`` (:func:`containerd_root_cache`; not the
``containerd-root`` that Debian's 1.6 used, whose metadata 2.x would migrate): importing
the project's image into an empty store costs ~20-50 s (unpacking ~260 MiB of layers), into one
that has it ~2 s (the archive is read and checked, nothing is unpacked). The node lock makes it
one containerd's at a time; a node removes its containers at stop (at start, a crashed run's,
and a crashed run's containerd still holding the store), and
:meth:`Node.import_project_image` drops the project images whose archives the image cache no
longer keeps, so the store holds at most the same few images.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import kubernetes
import yaml

from devkit.controlplane import ControlPlane
from devkit.image import (
    IMAGE_NAME,
    BuiltImage,
    build_image,
    cached_image_refs,
    gpufrag_cache_dir,
    write_oci_archive,
)
from devkit.pki import run_openssl
from devkit.procs import (
    EXIT_WITH_PARENT_ENV,
    ComponentProcess,
    ControlPlaneError,
    free_port,
    start_all_or_none,
    wait_until,
)
from devkit.toolbuild import build_tool

DEVICE_PLUGIN_DIR: Final = Path("/var/lib/kubelet/device-plugins")
NODE_LOCK: Final = Path("/run/gpufrag-node.lock")
POD_SUBNET: Final = "10.244.0.0/24"
BRIDGE: Final = "gpufrag0"
API_SERVER_RULE_COMMENT: Final = "gpufrag node "  # + the node's name
# Images the node imports into containerd at start (built from busybox-static, no registry).
PAUSE_IMAGE: Final = "gpufrag.local/pause:1"
BUSYBOX_IMAGE: Final = "gpufrag.local/busybox:1"
KUBE_SCHEDULER_IMAGE: Final = "gpufrag.local/kube-scheduler:1"
KUBECTL_IMAGE: Final = "gpufrag.local/kubectl:1"
BUSYBOX_BINARY: Final = Path("/usr/bin/busybox")  # Debian's busybox-static
CNI_BIN_DIR: Final = Path("/usr/lib/cni")
BUSYBOX_APPLETS: Final = ("sh", "echo", "sleep", "cat", "ls", "id", "hostname", "ip", "wget",
                          "nc", "httpd", "true", "false", "env", "ps", "mkdir", "touch", "test")


class NodeError(ControlPlaneError):
    """The node could not be started (what failed, and the component's last log lines)."""


def containerd_root_cache() -> Path:
    """containerd's root, kept between runs (see the module doc)."""
    return gpufrag_cache_dir() / "node" / "containerd2-root"


@dataclass(frozen=True)
class ContainerdBinaries:
    """containerd 2's daemon, runc shim and ``ctr``, side by side where the tool build put them."""

    folder: Path

    @classmethod
    def build(cls) -> ContainerdBinaries:
        """Build them (cached by content, ``devkit/tools/build containerd``); a failed build
        raises :class:`devkit.build.BuildError` with its output."""
        return cls(build_tool("containerd").parent)

    @property
    def containerd(self) -> Path:
        return self.folder / "containerd"

    @property
    def shim(self) -> Path:
        return self.folder / "containerd-shim-runc-v2"

    @property
    def ctr(self) -> Path:
        return self.folder / "ctr"


# -- images --------------------------------------------------------------------------------------

def _tar_add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _busybox_layer(extra: Sequence[tuple[str, Path]] = ()) -> bytes:
    """A root file system with busybox-static and its applets, plus ``extra`` executables
    (path in the image, file on this machine)."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "var", "var/www", "usr",
                  "usr/local", "usr/local/bin"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755, 0
            layer.addfile(info)
        _tar_add_bytes(layer, "bin/busybox", BUSYBOX_BINARY.read_bytes(), 0o755)
        for applet in BUSYBOX_APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
            layer.addfile(info)
        _tar_add_bytes(layer, "etc/passwd", b"root:x:0:0:root:/:/bin/sh\n"
                                            b"nobody:x:65534:65534:nobody:/:/bin/false\n")
        _tar_add_bytes(layer, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")
        _tar_add_bytes(layer, "var/www/index.html", b"ok\n")
        for name, source in extra:
            info = layer.gettarinfo(str(source), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with source.open("rb") as f:
                layer.addfile(info, f)
    return layer_buf.getvalue()


def busybox_oci_archive(path: Path, ref: str, cmd: Sequence[str]) -> Path:
    """An OCI image archive (``ctr images import`` reads it) with a busybox-static root file
    system and ``cmd`` as its command. Deterministic, so the same bytes every time."""
    return write_oci_archive(path, ref, [_busybox_layer()],
                             {"Cmd": list(cmd), "Env": ["PATH=/bin"], "WorkingDir": "/"})


def kube_scheduler_oci_archive(path: Path, ref: str, binary: Path) -> Path:
    """busybox + the control plane's multi-call binary as ``kube-scheduler`` (it dispatches on
    its name), for the manifests' scheduler container on this node."""
    layer = _busybox_layer([("usr/local/bin/kube-scheduler", binary.resolve())])
    return write_oci_archive(path, ref, [layer], {
        "Cmd": ["kube-scheduler"], "Env": ["PATH=/usr/local/bin:/bin"], "WorkingDir": "/"})


def kubectl_oci_archive(path: Path, ref: str, binary: Path) -> Path:
    """busybox + the control plane's multi-call binary as ``/bin/kubectl``, where
    registry.k8s.io/kubectl has it and the manifests' kubectl containers run it (the chart's
    CRD upgrade hook, the example's pre-warm CronJob)."""
    layer = _busybox_layer([("bin/kubectl", binary.resolve())])
    return write_oci_archive(path, ref, [layer], {
        "Entrypoint": ["/bin/kubectl"], "Env": ["PATH=/bin"], "WorkingDir": "/"})


# -- what this machine allows --------------------------------------------------------------------

def containerd_installed() -> list[str]:
    """The Debian binaries of the node runtime that are missing (empty when containerd can be
    used; containerd itself is built, :class:`ContainerdBinaries`)."""
    missing = [b for b in ("runc",) if shutil.which(b) is None]
    missing += [str(CNI_BIN_DIR / p) for p in ("bridge", "host-local", "loopback")
                if not (CNI_BIN_DIR / p).exists()]
    if not BUSYBOX_BINARY.exists():
        missing.append(str(BUSYBOX_BINARY))
    return missing


def probe_containers(timeout_s: float = 30.0) -> str | None:
    """Start a trivial container with runc (busybox-static rootfs, runc's default spec: new
    pid/mount/net/ipc/uts namespaces, cgroups). None when it ran; else what failed."""
    missing = containerd_installed()
    if missing:
        return f"missing: {', '.join(missing)} (run scripts/install-node-deps)"
    with tempfile.TemporaryDirectory(prefix="gpufrag-runc-probe-") as tmp:
        bundle = Path(tmp)
        (bundle / "rootfs" / "bin").mkdir(parents=True)
        shutil.copy(BUSYBOX_BINARY, bundle / "rootfs" / "bin" / "busybox")
        (bundle / "rootfs" / "bin" / "sh").symlink_to("busybox")
        subprocess.run(["runc", "spec"], cwd=bundle, check=True, capture_output=True)
        spec = json.loads((bundle / "config.json").read_text())
        spec["process"]["terminal"] = False
        spec["process"]["args"] = ["sh", "-c", "echo gpufrag-probe-ok"]
        (bundle / "config.json").write_text(json.dumps(spec))
        try:
            result = subprocess.run(
                ["runc", "--root", str(bundle / "state"), "run", f"probe-{os.getpid()}"],
                cwd=bundle, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return f"runc run did not finish in {timeout_s:.0f}s"
        if result.returncode != 0 or "gpufrag-probe-ok" not in result.stdout:
            return f"runc run failed (rc {result.returncode}): {result.stderr.strip()[-500:]}"
    return None


def stale_image_refs(ctr_images_ls: str, name: str, keep: set[str]) -> list[str]:
    """From ``ctr images ls`` output, the references to remove: ``name:*`` not in ``keep``, and
    the CRI's ``sha256:<id>`` reference to the same manifest, unless something kept (any other
    image, a kept ``name:*``) has that manifest too."""
    digests = {row[0]: row[2] for row in (line.split() for line in
                                           ctr_images_ls.splitlines()[1:]) if len(row) >= 3}
    ours = {ref: d for ref, d in digests.items() if ref.startswith(f"{name}:")}
    kept = {d for ref, d in digests.items()
            if ref in keep or not (ref in ours or ref.startswith("sha256:"))}
    stale = {d for ref, d in ours.items() if ref not in keep} - kept
    return sorted(ref for ref, d in digests.items() if d in stale)


# -- configuration -------------------------------------------------------------------------------

def kubelet_config(*, runtime_endpoint: str, port: int, healthz_port: int, ca_file: Path,
                   pod_logs_dir: Path, cgroup_driver: str = "cgroupfs") -> dict[str, Any]:
    """The KubeletConfiguration that works in this sandbox (each non-default setting says why)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # The machine mounts the cgroup v1 hierarchies (plus an empty v2 at /unified); the
        # kubelet refuses v1 unless told otherwise (KEP-5573).
        "failCgroupV1": False,
        # No systemd: cgroups are made directly in the cgroupfs hierarchy (containerd's runc
        # options say SystemdCgroup = false to match).
        "cgroupDriver": cgroup_driver,
        # There is no swap; do not fail if some machine has it.
        "failSwapOn": False,
        "containerRuntimeEndpoint": runtime_endpoint,
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "Webhook"},
        # A shared development disk: the defaults (10% free) would evict on a full-ish disk.
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # Faster status for tests (defaults: 10s / 5m).
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        # No kernel tuning from the kubelet in a sandbox it does not own.
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "resolvConf": "/etc/resolv.conf",
        "maxPods": 32,
        # Container logs under the node's directory, not /var/log/pods (tests read them there).
        "podLogsDir": str(pod_logs_dir),
        # The DRA driver's health stream shown in pods' allocatedResourcesStatus (KEP-4680):
        # beta and on by default in 1.36, named so a change of defaults cannot turn it off
        # unseen (docs/dra.md, "Feature gates").
        "featureGates": {"ResourceHealthStatus": True, "ResourceHealthStatusMessage": True},
    }


def containerd_config(node_dir: Path, *, root: Path, shim: Path, cdi_dir: Path,
                      cgroup_driver: str = "cgroupfs") -> str:
    """containerd 2 (config version 3): its store in ``root``, the rest (state, sockets)
    private to ``node_dir``; the runc shim at ``shim`` (built beside the daemon, so never a
    packaged one on PATH); CDI specs read from ``cdi_dir``."""
    c = node_dir / "containerd"
    return f"""version = 3
root = "{root}"
state = "{c / 'state'}"
[grpc]
  address = "{c / 'containerd.sock'}"
[ttrpc]
  address = "{c / 'containerd.sock.ttrpc'}"
[debug]
  level = "info"
[metrics]
  address = ""
[plugins.'io.containerd.internal.v1.opt']
  path = "{c / 'opt'}"
# NRI's socket is machine-wide (/var/run/nri) and nothing here uses it.
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["{cdi_dir}"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{shim}"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = {"true" if cgroup_driver == "systemd" else "false"}
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{node_dir / 'cni' / 'net.d'}"
    max_conf_num = 1
"""


def cni_conflist(node_dir: Path) -> dict[str, Any]:
    """A bridge network with host-local IPAM; no masquerading (nothing here leaves the host)."""
    return {"cniVersion": "1.0.0", "name": "gpufrag", "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
         "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                  "routes": [{"dst": "0.0.0.0/0"}],
                  "dataDir": str(node_dir / "cni" / "ipam")}},
    ]}


# -- the node ------------------------------------------------------------------------------------

class Node:
    """A kubelet (and its runtime) registered with ``plane`` as Node ``name``.

    ``start()`` waits until the Node is Ready; ``stop()`` stops the kubelet, the runtime and what
    the runtime left (its containers' shims, mounts). Logs are in ``node_dir/logs``.
    """

    def __init__(self, plane: ControlPlane, name: str = "node-0", *, runtime: str = "auto",
                 node_dir: Path | None = None, start_timeout_s: float = 90.0,
                 labels: dict[str, str] | None = None,
                 containerd_root: Path | None = None) -> None:
        if runtime not in ("auto", "containerd", "fake"):
            raise ValueError(f"runtime must be auto, containerd or fake, not {runtime!r}")
        self.plane = plane
        self.name = name
        self.requested_runtime = runtime
        self.runtime = ""  # the one that ran: "containerd" or "fake"
        self.runtime_note = ""  # why "auto" chose the fake runtime
        self.node_dir = node_dir or plane.work_dir / f"node-{name}"
        self.logs_dir = self.node_dir / "logs"
        self.root_dir = self.node_dir / "kubelet"
        self.pod_logs_dir = self.node_dir / "pod-logs"
        # Where containerd reads CDI specs: a DRA driver on this node writes them here.
        self.cdi_dir = self.node_dir / "cdi"
        self.start_timeout_s = start_timeout_s
        self.labels = labels or {}
        self.containerd_root = containerd_root or containerd_root_cache()
        self._containerd: ContainerdBinaries | None = None  # built when the runtime starts
        self.components: dict[str, ComponentProcess] = {}
        self.startup_s: float | None = None
        self._lock: io.TextIOWrapper | None = None
        self._stopped = False
        self._api_server_exposed = False

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def device_plugin_dir(self) -> Path:
        """Where the kubelet's registration socket is (fixed upstream; see the module doc)."""
        return DEVICE_PLUGIN_DIR

    @property
    def runtime_endpoint(self) -> str:
        if self.runtime == "containerd":
            return f"unix://{self.node_dir / 'containerd' / 'containerd.sock'}"
        return f"unix://{self.node_dir / 'fake-cri.sock'}"

    def start(self) -> Node:
        started = time.monotonic()
        NODE_LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock = NODE_LOCK.open("w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise NodeError(f"another gpufrag node runs on this machine ({NODE_LOCK} is locked); "
                            "the kubelet's device-plugin socket path is machine-wide") from None
        self.startup_s = start_all_or_none(self._start, self.stop, started=started)
        return self

    def _choose_runtime(self) -> str:
        if self.requested_runtime != "auto":
            return self.requested_runtime
        problem = probe_containers()
        if problem is None:
            return "containerd"
        self.runtime_note = problem
        return "fake"

    def _start(self) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.runtime = self._choose_runtime()
        if self.runtime == "containerd":
            self._start_containerd()
        else:
            self._start_fake_cri()
        kubeconfig = self._node_kubeconfig()
        DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
        port, healthz_port = free_port(), free_port()
        config_path = self.node_dir / "kubelet-config.yaml"
        config_path.write_text(yaml.safe_dump(kubelet_config(
            runtime_endpoint=self.runtime_endpoint, port=port, healthz_port=healthz_port,
            ca_file=self.plane.pki_dir / "ca.crt", pod_logs_dir=self.pod_logs_dir)))
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        kubelet = self._launch("kubelet", [str(self.plane.binary), "kubelet",
            f"--config={config_path}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.root_dir}", f"--cert-dir={self.node_dir / 'kubelet-pki'}",
            f"--hostname-override={self.name}", "--node-ip=127.0.0.1",
            *([f"--node-labels={labels}"] if labels else []), "--v=2"], port)
        core = kubernetes.client.CoreV1Api(self.plane.api_client())

        def ready() -> bool | None:
            if not kubelet.running():
                raise NodeError(kubelet.describe_failure("exited before its Node was Ready"))
            try:
                node = core.read_node(self.name)
            except kubernetes.client.ApiException:
                return None
            conditions = (node.status.conditions if node.status else None) or []
            return True if any(c.type == "Ready" and c.status == "True"
                               for c in conditions) else None

        try:
            wait_until(ready, timeout_s=self.start_timeout_s,
                       what=f"Node {self.name} to register and become Ready")
        except ControlPlaneError as exc:
            raise NodeError(f"{exc}\n{kubelet.describe_failure('did not get Ready')}") from exc
        # Schedulable once Ready (the plane runs no node-lifecycle controller to do it).
        self.plane.lift_not_ready_taint(self.name)

    def _launch(self, name: str, argv: Sequence[str], port: int = 0) -> ComponentProcess:
        log_path = self.logs_dir / f"{name}.log"
        env = {**os.environ, EXIT_WITH_PARENT_ENV: str(os.getpid())}
        with log_path.open("ab") as log:
            process = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=self.node_dir, env=env,
                                       start_new_session=True)
        component = ComponentProcess(name=name, process=process, log_path=log_path, port=port)
        self.components[name] = component
        return component

    def _node_kubeconfig(self) -> Path:
        """A client certificate for system:node:<name> (group system:nodes) from the plane's CA."""
        pki = self.node_dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        (pki / "client.ext").write_text("keyUsage=critical,digitalSignature,keyEncipherment\n"
                                        "extendedKeyUsage=clientAuth\n")
        run_openssl(["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out",
                      "node.csr", "-subj", f"/O=system:nodes/CN=system:node:{self.name}"], pki)
        ca = self.plane.pki_dir
        run_openssl(["x509", "-req", "-in", "node.csr", "-CA", str(ca / "ca.crt"),
                      "-CAkey", str(ca / "ca.key"), "-CAcreateserial", "-days", "365",
                      "-out", "node.crt", "-extfile", "client.ext"], pki)
        path = self.node_dir / "kubelet.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "gpufrag-dev", "cluster": {
                "server": self.plane.server, "certificate-authority": str(ca / "ca.crt")}}],
            "users": [{"name": self.name, "user": {
                "client-certificate": str(pki / "node.crt"),
                "client-key": str(pki / "node.key")}}],
            "contexts": [{"name": "node", "context": {"cluster": "gpufrag-dev",
                                                      "user": self.name}}],
            "current-context": "node"}))
        path.chmod(0o600)
        return path

    def _start_fake_cri(self) -> None:
        sock = self.node_dir / "fake-cri.sock"
        sock.unlink(missing_ok=True)
        fake = self._launch("fake-cri", [str(self.plane.binary), "fake-cri", f"unix://{sock}"])
        wait_until(lambda: True if sock.exists() else _alive_or_raise(fake),
                   timeout_s=30, what="the fake CRI to listen")

    @property
    def containerd_address(self) -> str:
        return str(self.node_dir / "containerd" / "containerd.sock")

    @property
    def containerd_binaries(self) -> ContainerdBinaries:
        if self._containerd is None:
            raise NodeError(f"the {self.runtime or 'unstarted'} runtime has no containerd")
        return self._containerd

    def _ctr(self, *args: str, timeout_s: float = 60,
             address: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.containerd_binaries.ctr), "--address", address or self.containerd_address,
             "--namespace", "k8s.io", *args], capture_output=True, text=True,
            timeout=timeout_s, check=False)

    def _stop_crashed_containerd(self) -> list[int]:
        """A crashed run's containerd on the kept root (its kubelet and Python process gone,
        it and its containers still running) holds the store's lock, so a new containerd there
        would never listen: remove its containers through it, stop it and its shims. Called
        with the node lock held, so no running node owns it."""
        stopped = []
        for pid, config in _containerd_processes():
            try:
                text = config.read_text()
            except OSError:
                continue
            if f'root = "{self.containerd_root}"' not in text:
                continue
            match = re.search(r'^\s*address = "([^"]+\.sock)"$', text, re.MULTILINE)
            if match:
                self._remove_containers(address=match.group(1))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10  # SIGKILL: it goes, and its lock with it
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            if match:
                _kill_shims(match.group(1))
            stopped.append(pid)
        return stopped

    def _start_containerd(self) -> None:
        missing = containerd_installed()
        if missing:
            raise NodeError(f"containerd runtime: missing {', '.join(missing)}; "
                            "run scripts/install-node-deps")
        try:
            self._containerd = binaries = ContainerdBinaries.build()
        except ControlPlaneError as exc:
            raise NodeError(f"containerd runtime: {exc}") from exc
        (self.node_dir / "containerd").mkdir(parents=True, exist_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        (self.node_dir / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (self.node_dir / "cni" / "net.d" / "10-gpufrag.conflist").write_text(
            json.dumps(cni_conflist(self.node_dir), indent=1))
        config = self.node_dir / "containerd" / "config.toml"
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        config.write_text(containerd_config(self.node_dir, root=self.containerd_root,
                                            shim=binaries.shim, cdi_dir=self.cdi_dir))
        sock = self.node_dir / "containerd" / "containerd.sock"

        def launch() -> ComponentProcess:
            containerd = self._launch("containerd",
                                      [str(binaries.containerd), "--config", str(config)])
            try:
                wait_until(lambda: True if (sock.exists() and
                                            self._ctr("version").returncode == 0)
                           else _alive_or_raise(containerd), timeout_s=30,
                           what="containerd to listen")
            except TimeoutError as exc:
                raise NodeError(f"{exc}\n{containerd.describe_failure('did not listen')}") \
                    from None
            return containerd

        self._stop_crashed_containerd()
        containerd = launch()
        if self._ctr("containers", "ls", "-q", timeout_s=15).stdout.split():
            # A crashed run's containers, in the store kept between runs: remove them, and
            # restart so that the CRI plugin does not hand their sandboxes to this kubelet.
            self._remove_containers()
            containerd.stop()
            launch()
        self._remove_pod_netns()  # a crashed run's leftovers
        self._expose_api_server()
        for ref, cmd in ((PAUSE_IMAGE, ["/bin/sh", "-c", "trap 'exit 0' TERM INT; "
                                                          "while :; do sleep 3600 & wait; done"]),
                         (BUSYBOX_IMAGE, ["/bin/sh"])):
            self.import_image(busybox_oci_archive(
                self.node_dir / "images" / (ref.rsplit("/", 1)[1].replace(":", "-") + ".tar"),
                ref, cmd))

    @staticmethod
    def _remove_pod_netns() -> int:
        """Delete the pod network namespaces left on this machine's pod subnet (containerd
        makes them under /run/netns and removes them only when it tears a sandbox down, which
        a stopped node never does): each holds a veth on the bridge and an address that the
        next node's fresh IPAM hands out again, so a leftover answers ARP for a new pod's IP.
        Called with the node lock held (start and stop), so no running node owns them."""
        removed = 0
        netns_dir = Path("/run/netns")
        prefix = POD_SUBNET.rsplit(".", 1)[0] + "."
        for name in sorted(p.name for p in netns_dir.glob("cni-*")) if netns_dir.is_dir() else []:
            addresses = subprocess.run(["ip", "-n", name, "-4", "-o", "addr", "show"],
                                       capture_output=True, text=True, check=False).stdout
            if f"inet {prefix}" in addresses:
                subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
                removed += 1
        return removed

    def _api_server_rule(self) -> list[str]:
        port = self.plane.server.rsplit(":", 1)[1]
        return ["PREROUTING", "-i", BRIDGE, "-d", f"{self.plane.service_ip}/32", "-p", "tcp",
                "--dport", "443", "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}",
                "-m", "comment", "--comment", f"{API_SERVER_RULE_COMMENT}{self.name}"]

    def _expose_api_server(self) -> None:
        """The ``kubernetes`` Service for pods (what kube-proxy would do for this one Service):
        connections from the pod bridge to its ClusterIP:443 go to the API server on 127.0.0.1,
        so in-cluster clients (the extender, kube-scheduler in its pod) work unchanged. The
        API server's certificate names the ClusterIP. The bridge is made here (CNI reuses it)
        so ``route_localnet`` (loopback as a DNAT target) can be set on it alone."""
        if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True,
                          check=False).returncode != 0:
            subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True,
                           capture_output=True)
        subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True, capture_output=True)
        Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet").write_text("1\n")
        self._remove_crashed_api_server_rules()
        result = subprocess.run(["iptables", "-t", "nat", "-A", *self._api_server_rule()],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise NodeError(f"iptables DNAT for the kubernetes Service: {result.stderr.strip()}")
        self._api_server_exposed = True

    @staticmethod
    def _remove_crashed_api_server_rules() -> int:
        """A crashed run's DNAT rule (to its API server's port, now closed) comes first in the
        chain and would send pods' connections there (seen here: connection refused from
        every in-cluster client). Called with the node lock held, so no running node owns it."""
        listed = subprocess.run(["iptables", "-t", "nat", "-S", "PREROUTING"],
                                capture_output=True, text=True, check=False).stdout
        removed = 0
        for line in listed.splitlines():
            rule = shlex.split(line)
            if rule[:1] == ["-A"] and any(a.startswith(API_SERVER_RULE_COMMENT) for a in rule):
                subprocess.run(["iptables", "-t", "nat", "-D", *rule[1:]], capture_output=True,
                               check=False)
                removed += 1
        return removed

    def _unexpose_api_server(self) -> None:
        if self._api_server_exposed:
            subprocess.run(["iptables", "-t", "nat", "-D", *self._api_server_rule()],
                           capture_output=True, check=False)
            self._api_server_exposed = False

    def import_kube_scheduler_image(self) -> str:
        """Import :data:`KUBE_SCHEDULER_IMAGE` (the plane's own kube-scheduler) and return it."""
        self.import_image(kube_scheduler_oci_archive(
            self.node_dir / "images" / "kube-scheduler.tar", KUBE_SCHEDULER_IMAGE,
            self.plane.binary))
        return KUBE_SCHEDULER_IMAGE

    def import_kubectl_image(self) -> str:
        """Import :data:`KUBECTL_IMAGE` (the plane's own kubectl) and return it."""
        self.import_image(kubectl_oci_archive(
            self.node_dir / "images" / "kubectl.tar", KUBECTL_IMAGE, self.plane.binary))
        return KUBECTL_IMAGE

    def container_pid(self, container_id: str) -> int:
        """The host pid of a running container's first process (``containerd://<id>`` as the
        pod's status gives it, or the bare id), from containerd's task list."""
        cid = container_id.removeprefix("containerd://")
        listed = self._ctr("tasks", "ls", timeout_s=15)
        for line in listed.stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[0] == cid and fields[2] == "RUNNING":
                return int(fields[1])
        raise NodeError(f"container {cid} has no running task (ctr tasks ls: "
                        f"{listed.stdout.strip() or listed.stderr.strip()})")

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What a container wrote (the kubelet's CRI log file; "" when there is none yet)."""
        text = ""
        for path in sorted(self.pod_logs_dir.glob(f"{namespace}_{pod}_*/{container}/*.log")):
            with contextlib.suppress(OSError):
                text += path.read_text()
        return text

    def import_image(self, archive: Path) -> None:
        """Import an OCI/docker archive into the node's containerd (the kubelet never pulls).
        Into a store that has the image already, this reads and checks the archive and
        unpacks nothing."""
        if self.runtime != "containerd":
            raise NodeError("images are imported only into the containerd runtime")
        result = self._ctr("images", "import", str(archive), timeout_s=600)
        if result.returncode != 0:
            raise NodeError(f"ctr images import {archive} failed: {result.stderr.strip()}")

    def restart_kubelet(self, timeout_s: float = 60.0) -> None:
        """Stop the kubelet and start it again with the same flags, leaving the runtime and its
        containers running (a kubelet upgrade or crash). Returns once the new kubelet has
        recreated its device-plugin registration socket, as it does on every start (after
        removing every other socket in that directory)."""
        old = self.components["kubelet"]
        socket = DEVICE_PLUGIN_DIR / "kubelet.sock"

        def identity() -> tuple[int, int] | None:
            try:
                st = socket.stat()
            except FileNotFoundError:
                return None
            return (st.st_ino, st.st_ctime_ns)

        argv = old.process.args
        assert isinstance(argv, list)  # _launch starts every component from a list
        before = identity()
        old.stop()
        kubelet = self._launch("kubelet", argv, old.port)
        wait_until(lambda: True if identity() not in (None, before)
                   else _alive_or_raise(kubelet), timeout_s=timeout_s,
                   what="the restarted kubelet to recreate its device-plugin socket")

    def import_project_image(self) -> tuple[BuiltImage, float]:
        """Build the project's image (cached, :func:`devkit.image.build_image`) and import it;
        the image and the import's seconds. What the node tests and ``gpufrag dev-cluster up
        --node`` both run, so people get the image the tests get."""
        built = build_image()
        started = time.monotonic()
        self.import_image(built.archive)
        self._prune_project_images(keep={built.ref, *cached_image_refs()})
        return built, time.monotonic() - started

    def _prune_project_images(self, keep: set[str]) -> list[str]:
        """Remove the project's images not in ``keep`` from the (persistent) store."""
        listed = self._ctr("images", "ls", timeout_s=30)
        drop = stale_image_refs(listed.stdout, IMAGE_NAME, keep)
        if drop:
            self._ctr("images", "rm", "--sync", *drop, timeout_s=120)
        return drop

    def stop(self) -> None:
        """Stop the kubelet, then the runtime and everything it left; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        kubelet = self.components.get("kubelet")
        if kubelet is not None:
            kubelet.stop()
        if self.runtime == "containerd" and "containerd" in self.components:
            self._remove_containers()
        for name, component in reversed(list(self.components.items())):
            if name != "kubelet":
                component.stop()
        _kill_shims(self.containerd_address)
        if self.runtime == "containerd":
            self._remove_pod_netns()
        self._unexpose_api_server()
        self._unmount_under(self.node_dir)
        self._unmount_under(self.containerd_root)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _remove_containers(self, address: str | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            listed = self._ctr("tasks", "ls", "-q", timeout_s=15, address=address)
            for task in listed.stdout.split():
                self._ctr("tasks", "kill", "-s", "SIGKILL", task, timeout_s=10, address=address)
            time.sleep(0.5)
            for task in listed.stdout.split():
                self._ctr("tasks", "rm", "-f", task, timeout_s=10, address=address)
            for container in self._ctr("containers", "ls", "-q", timeout_s=15,
                                       address=address).stdout.split():
                self._ctr("containers", "rm", container, timeout_s=10, address=address)

    @staticmethod
    def _unmount_under(root: Path) -> None:
        prefix = str(root.resolve())
        try:
            mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text()
                      .splitlines()]
        except OSError:
            return
        for target in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def _processes() -> list[tuple[int, list[bytes]]]:
    """Every process's pid and command line (those that can be read)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                found.append((int(proc.name), (proc / "cmdline").read_bytes().split(b"\0")))
    return found


def _containerd_processes() -> list[tuple[int, Path]]:
    """The running containerd daemons started with ``--config FILE``, and that file."""
    found = []
    for pid, cmdline in _processes():
        if cmdline and cmdline[0].endswith(b"containerd") and b"--config" in cmdline[:-1]:
            found.append((pid, Path(cmdline[cmdline.index(b"--config") + 1].decode())))
    return found


def _kill_shims(address: str) -> None:
    """containerd's shims run in their own sessions and outlive it: stop the ones that belong
    to the containerd listening on ``address`` (their command line names its socket)."""
    for pid, cmdline in _processes():
        if cmdline and cmdline[0].endswith(b"containerd-shim-runc-v2") and \
                address.encode() in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _alive_or_raise(component: ComponentProcess) -> None:
    if not component.running():
        raise NodeError(component.describe_failure("exited during start"))
    return None
