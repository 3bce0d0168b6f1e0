"""The start-up every node daemon shares: the agent and the device plugin begin the same way.

Both parse flags with a bad one answered in one line (exit 2), configure logging and the
``SIGUSR1`` stack dump, settle and validate their configuration (a bad value, probe port or
NVML recording is one ``bad_input`` line, exit 2), open NVML (no GPU: one ``no_gpu`` line, exit
3; NVML failing: ``nvml_failed``, exit 1), get a Kubernetes client (``kube_config_failed``,
exit 1), serve their probes (``metrics_port_unavailable``, exit 1) and stop on SIGTERM/SIGINT.
Written once here so the two say the same thing and exit with the same code for the same fault;
each daemon keeps only what it builds from these.

A step that fails has said why in the log and raises :class:`Exit`; :func:`run` turns it into
the exit code, so a daemon's start-up reads as a straight line instead of a ladder of early
returns. The module sits below both daemons in the import layers (they may not import each
other) and above the Kubernetes adapters whose client it opens; the probe server, signals and
exit codes themselves live in the shared base (:mod:`gpufrag.probes`, :mod:`gpufrag.errors`),
which the extender and the serving runtime use too.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog
from structlog.typing import FilteringBoundLogger

from gpufrag import diagnose, logs
from gpufrag.conventions import dns_subdomain_problem
from gpufrag.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_NO_GPU,
    BadInput,
    BadInputArgumentParser,
)
from gpufrag.httpserve import ListenError, Server
from gpufrag.nvml import GpuReadError, NoGpuError, NvmlApi, NvmlReader
from gpufrag.nvml_recorded import RecordedNvml
from gpufrag.probes import check_metrics_port, stop_on_signals
from scheduler.kube.client import api_client as kube_api_client


class NodeConfig(Protocol):
    """What start-up reads of a daemon's configuration: the node its log lines name."""

    @property
    def node_name(self) -> str: ...


def check_node_name(node_name: str) -> None:
    """Raise :class:`BadInput` (field ``node_name``) unless ``node_name`` is a Node's name."""
    if not node_name:
        raise BadInput("required: set --node-name or NODE_NAME (from spec.nodeName)",
                       field="node_name")
    problem = dns_subdomain_problem(node_name)
    if problem is not None:
        raise BadInput(f"{node_name!r} is not a Node name: {problem}", field="node_name")


ConfigT = TypeVar("ConfigT", bound=NodeConfig)
FoundT = TypeVar("FoundT")


class Exit(Exception):
    """A start-up step failed and has logged why: the daemon exits with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class NodeDaemon:
    """One node daemon's flags and log through its start-up.

    It reads the flags :func:`flag_parser` gives every node daemon."""

    def __init__(self, component: str, args: argparse.Namespace) -> None:
        self.args = args
        self.log: FilteringBoundLogger = structlog.get_logger(f"gpufrag.{component}")
        self.recording: RecordedNvml | None = None

    @property
    def recorded(self) -> bool:
        """Whether the GPUs come from ``--nvml-recording`` rather than the driver."""
        return self.args.nvml_recording is not None

    def settle(self, build: Callable[[], ConfigT], *, recorded_note: str) -> ConfigT:
        """The configuration ``build`` validates, with the probe port checked and the NVML
        recording loaded; from here on the log names the node. A recording is announced with
        ``recorded_note`` (``{file}`` is its path): what the daemon offers is not a measurement.
        """
        try:
            config = build()
            check_metrics_port(self.args.metrics_port)
            if self.recorded:
                # A bad recording is bad input (exit 2), named by its path and field, like a flag.
                self.recording = RecordedNvml.load(self.args.nvml_recording)
        except BadInput as exc:
            self.log.error("bad_input", error=str(exc))
            raise Exit(EXIT_BAD_INPUT) from None
        self.log = self.log.bind(node=config.node_name)
        if self.recorded:
            path = self.args.nvml_recording
            self.log.warning("recorded_nvml", file=str(path),
                             note=recorded_note.format(file=path))
        return config

    @contextmanager
    def open_gpus(self, nvml: NvmlApi | None,
                  find: Callable[[NvmlReader], FoundT]) -> Iterator[tuple[NvmlReader, FoundT]]:
        """NVML (the recording when there is one, else ``nvml``, else the driver) opened and
        read by ``find`` (which opens the reader); closed when the block ends. A node without
        a GPU is its own exit code, so the DaemonSet's nodeSelector is what to fix."""
        reader = NvmlReader(self.recording if self.recording is not None else nvml)
        try:
            try:
                found = find(reader)
            except NoGpuError as exc:
                self.log.error("no_gpu", reason=str(exc), ready=False, exit_code=EXIT_NO_GPU)
                raise Exit(EXIT_NO_GPU) from None
            except (GpuReadError, ValueError) as exc:
                self.log.error("nvml_failed", error=str(exc))
                raise Exit(EXIT_FAILURE) from None
            yield reader, found
        finally:
            reader.close()

    def kube_client(self) -> Any:
        """The Kubernetes API client of ``--kubeconfig`` (in-cluster by default)."""
        try:
            return kube_api_client(self.args.kubeconfig)
        except Exception as exc:  # the config loaders raise a zoo of types; all mean the same
            self.log.error("kube_config_failed", error=f"{type(exc).__name__}: {exc}",
                           hint="run in-cluster with a ServiceAccount, or pass --kubeconfig")
            raise Exit(EXIT_FAILURE) from None

    def serve_probes(self, start: Callable[[int], Server]) -> Server | None:
        """The probe listener ``start(port)`` on ``--metrics-port`` (None when it is 0)."""
        port: int = self.args.metrics_port
        if not port:
            return None
        try:
            return start(port)
        except ListenError as exc:
            self.log.error("metrics_port_unavailable", port=port, error=str(exc))
            raise Exit(EXIT_FAILURE) from None

    def stop_event(self, stop: threading.Event | None) -> threading.Event:
        """``stop`` when a caller (a test) drives the daemon, else one SIGTERM/SIGINT set."""
        if stop is None:
            stop = threading.Event()
            stop_on_signals(stop, self.log)
        return stop


def flag_parser(prog: str, description: str, *,
                default_metrics_port: int) -> BadInputArgumentParser:
    """A node daemon's parser with the flags :class:`NodeDaemon` reads (its own are added
    after): ``--node-name``, ``--metrics-port``, ``--kubeconfig``, ``--nvml-recording`` and
    ``--log-level``, the same words and defaults on every node daemon."""
    parser = BadInputArgumentParser(prog=prog, description=description)
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                        help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--metrics-port", type=int, default=default_metrics_port,
                        help="port for /metrics, /healthz, /readyz; 0 disables "
                             "(default: %(default)s)")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: in-cluster service account, or "
                             "$KUBECONFIG / ~/.kube/config outside a cluster)")
    parser.add_argument("--nvml-recording", type=Path, default=None, metavar="FILE",
                        help="read the GPUs from this JSON recording (gpufrag.nvml_recorded) "
                             "instead of NVML: for nodes without a GPU; announced as recorded")
    parser.add_argument("--log-level", default=None, help="debug, info, warning, error")
    return parser


def run(component: str, parser: BadInputArgumentParser, argv: Sequence[str] | None,
        body: Callable[[NodeDaemon], int]) -> int:
    """Parse the flags (a bad one: one line on stderr, exit 2; ``--help``: exit 0), configure
    logging and the stack dump named ``component``, then run ``body``: its exit code, or that
    of the step that raised :class:`Exit`."""
    args = parser.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    logs.configure(args.log_level)
    diagnose.install(component)
    try:
        return body(NodeDaemon(component, args))
    except Exit as exc:
        return exc.code
