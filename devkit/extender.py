"""gpufrag-scheduler on the local control plane: kube-scheduler + the gpufrag extender process.

Shared by the demo, the end-to-end tests and the benchmarks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from devkit.controlplane import ControlPlane
from devkit.procs import ControlPlaneError, free_port, tail, wait_until
from gpufrag.conventions import (
    HINTS_NAMESPACE,
    MANAGED_RESOURCES,
    SCHEDULER_NAME,
)

# Why weight 200: see manifests/base/scheduler-config.yaml (one extender point outweighs all
# default score plugins together, so the extender's ranking decides, where it ranks at all:
# with the deciding filter it answers one node and kube-scheduler skips scoring).
_GPUFRAG_SCHEDULER_CONFIG: Final = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: {name}
extenders:
  - urlPrefix: {url}
    filterVerb: filter
{prioritize}    preemptVerb: preempt
{bind}    weight: 200
    nodeCacheCapable: true
    httpTimeout: 5s
    ignorable: {ignorable}
{managed}"""


def gpufrag_scheduler_config(url: str, *, ignorable: bool = False, bind: bool = True,
                             prioritize: bool = False, name: str = SCHEDULER_NAME,
                             managed: bool = True) -> str:
    """A KubeSchedulerConfiguration whose profile ``name`` calls the extender at ``url``
    (filter, preempt and, with ``bind``, bind), for :meth:`ControlPlane.start_scheduler`.

    Without ``prioritize`` (the default) it is the configuration for the extender's deciding
    filter (``filter.answer: decide``), as in manifests/base/scheduler-config.yaml; with it,
    kube-scheduler also asks the extender to rank the nodes (for ``filter.answer: feasible``,
    or ``filter.nodes`` > 1). Without ``managed``, no ``managedResources``: kube-scheduler
    then asks the extender about every pod, which is how a pod that asks its GPUs through
    DRA claims (no extended resource in its containers) reaches it (docs/dra.md)."""
    return _GPUFRAG_SCHEDULER_CONFIG.format(
        name=name, url=url, ignorable=str(ignorable).lower(),
        prioritize="    prioritizeVerb: prioritize\n" if prioritize else "",
        bind="    bindVerb: bind\n" if bind else "",
        managed=("    managedResources:\n" + "".join(
            f"      - name: {resource}\n"
            f"        ignoredByScheduler: {str(ignored).lower()}\n"
            for resource, ignored in MANAGED_RESOURCES.items())) if managed else "")


class _Served:
    """What the extender processes here share: a subprocess serving HTTP on 127.0.0.1:port,
    ready once /readyz answers 200, stopped with SIGTERM then SIGKILL."""

    what = "extender"
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, timeout_s: float) -> None:
        try:
            wait_until(self._ready, timeout_s=timeout_s, what=f"{self.what} ready on {self.url}")
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool | None:
        if self.process is not None and self.process.poll() is not None:
            raise ControlPlaneError(f"{self.what} exited with {self.process.returncode}:\n"
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


@dataclass
class ExtenderProcess(_Served):
    """``gpufrag extender`` watching a control plane, in its own process, on a free port.

    A subprocess rather than a thread because that is how it runs in a cluster (its own
    process and event loop, its own watches), and so that its log is the JSON it writes in
    production.
    """

    control_plane: ControlPlane
    log_path: Path
    extra_args: tuple[str, ...] = ()
    # debug: a log line per verb, which tests read (log_events); benchmarks run at info,
    # as in production, where the verbs log nothing on success.
    log_level: str = "debug"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> ExtenderProcess:
        """Start it and wait until /readyz answers 200 (its cache has listed the cluster) and,
        where it signs GPU records (gpufrag's device plugin, the default), until it has its
        signing key.

        The key lives in the hints namespace, which every install creates (manifests/base);
        a bare control plane has no such namespace, so it is made here as the install would.
        Without it the extender refuses every GPU bind until some other caller happens to
        create the namespace (it retries every 10 s): a test or benchmark would then measure
        that wait, or hang, depending on what ran before it."""
        self.control_plane.ensure_namespace(self._setting("names.hints_namespace")
                                            or HINTS_NAMESPACE)
        env = {**os.environ, "GPUFRAG_LOG_FORMAT": "json"}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpufrag.cli", "extender", "--kubeconfig",
                 str(self.control_plane.kubeconfig_path), "--host", "127.0.0.1", "--port",
                 str(self.port), "--log-level", self.log_level,
                 "--set", "maintenance_interval_s=1", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
        self._wait_ready(timeout_s)
        if self.signs_records:
            try:
                wait_until(lambda: any(self.log_events("record key ready")) or None,
                           timeout_s=timeout_s, what=f"{self.what} to have its record key")
            except BaseException:
                self.stop()
                raise
        return self

    @property
    def signs_records(self) -> bool:
        """Whether this extender signs GPU records: unless its arguments name another device
        plugin (``names.device_plugin``), as the product's default does."""
        return self._setting("names.device_plugin") in (None, "gpufrag")

    def _setting(self, path: str) -> str | None:
        """The last value ``extra_args`` give ``path`` (``--set path=value``), if any."""
        values = [a.split("=", 1)[1] for a in self.extra_args if a.startswith(f"{path}=")]
        return values[-1] if values else None

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


@contextmanager
def dra_scheduling(control_plane: ControlPlane, folder: Path, settings: Mapping[str, Any]
                   ) -> Iterator[ExtenderProcess]:
    """An extender with ``settings`` (its configuration, written to ``folder``) behind a
    ``gpufrag-scheduler`` whose configuration lists no ``managedResources``: DRA pods ask no
    extended resource, and with the list kube-scheduler would never ask the extender about
    them (docs/dra.md). Both stopped on leaving."""
    config = folder / "extender.yaml"
    config.write_text(yaml.safe_dump(dict(settings)))
    ext = ExtenderProcess(control_plane, folder / "extender.log",
                          extra_args=("--config", str(config))).start()
    try:
        control_plane.start_scheduler(SCHEDULER_NAME, gpufrag_scheduler_config(
            ext.url, managed=False))
        try:
            yield ext
        finally:
            control_plane.stop_scheduler(SCHEDULER_NAME)
    finally:
        ext.stop()


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sample of ``name`` with exactly ``labels`` (in the order the exposition writes
    them) in the Prometheus text ``text``; AssertionError when there is none."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    head = f"{name}{{{wanted}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(head + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {head} in the extender's metrics")


ZERO_EXTENDER_MODES: Final = ("all", "one")
ZERO_EXTENDER_ENGINES: Final = ("go", "python")


@dataclass
class ZeroExtenderProcess(_Served):
    """The zero-cost extender (``zero-extender`` in the control plane's multi-call binary,
    devkit/cluster/zeroextender.go): gpufrag's verbs and wire types with no logic, the
    benchmarks' reference for what the extender design itself costs. ``mode`` ``all``: the
    filter passes every node; ``one``: only the first (as gpufrag's deciding filter)."""

    control_plane: ControlPlane
    log_path: Path
    mode: str = "all"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    # "go": the Go extender (the limit of the extender design); "python": the same verbs on
    # gpufrag's own server, Flask and binder (devkit/pyzero.py: the limit of gpufrag's stack).
    engine: str = "go"
    what = "zero extender"

    def start(self, timeout_s: float = 30.0) -> ZeroExtenderProcess:
        if self.mode not in ZERO_EXTENDER_MODES:
            raise ValueError(f"mode must be one of {', '.join(ZERO_EXTENDER_MODES)}, "
                             f"got {self.mode!r}")
        if self.engine not in ZERO_EXTENDER_ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ZERO_EXTENDER_ENGINES)}, "
                             f"got {self.engine!r}")
        program = ([str(self.control_plane.binary), "zero-extender"] if self.engine == "go"
                   else [sys.executable, "-m", "devkit.pyzero"])
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*program, "--kubeconfig",
                 str(self.control_plane.kubeconfig_path), "--port", str(self.port),
                 "--mode", self.mode],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self._wait_ready(timeout_s)
        return self
