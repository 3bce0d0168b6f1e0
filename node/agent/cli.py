"""``gpufrag agent``: the GPU node agent, run as a DaemonSet on every GPU node.

Exit codes: 0 done (``--once`` succeeded, or stopped by SIGTERM), 1 something broke (NVML
failed, no cluster credentials, ``--once`` could not read or publish), 2 bad flags, 3 no GPU on
this node (one log line, no traceback; keep the DaemonSet off such nodes with a nodeSelector).

``--nvml-recording FILE`` is the recorded inventory mode: the GPUs are read from a JSON recording
(:class:`gpufrag.nvml_recorded.RecordedNvml`) instead of the NVIDIA driver, so the whole agent
(pid -> cgroup -> pod, publishing) runs where there is no GPU: the demo's fake nodes, a laptop, CI.
The usage annotation's format has no field for where a reading came from (and a new field would
change that contract, :mod:`gpufrag.gpu_usage`), so the agent says so in its log instead: a
``recorded_nvml`` warning at start and ``nvml=recorded`` on its ``starting`` line.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import structlog
from structlog.typing import FilteringBoundLogger

from gpufrag import diagnose, logs
from gpufrag.conventions import names_from_environ
from gpufrag.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_NO_GPU,
    EXIT_OK,
    BadInput,
    BadInputArgumentParser,
)
from gpufrag.gpu_usage import REFRESH_INTERVALS
from gpufrag.httpserve import ListenError
from gpufrag.nvml import GpuReadError, NoGpuError, NvmlApi, NvmlReader
from gpufrag.nvml_recorded import RecordedNvml
from gpufrag.probes import check_metrics_port, stop_on_signals
from node.agent import isolation, peaks
from node.agent.cgroup import KubePodLister, PodDirectory, PodLister, PodResolver
from node.agent.loop import (
    DEFAULT_INTERVAL_S,
    DEFAULT_TOLERANCE_MIB,
    DEFAULT_TOLERANCE_PCT,
    Agent,
    AgentConfig,
)
from node.agent.metrics import AgentMetrics, Health, start_http_server
from node.agent.publish import (
    ClusterWriter,
    KubeClusterWriter,
    LogOnlyWriter,
    Publisher,
    PublishPolicy,
)
from scheduler.kube.client import api_client as kube_api_client

DEFAULT_METRICS_PORT = 9401  # next to the DCGM exporter's 9400, so both can run on hostNetwork


def build_parser() -> argparse.ArgumentParser:
    parser = BadInputArgumentParser(
        prog="gpufrag agent",
        description="Read every GPU through NVML, attribute memory to pods, publish it on the "
                    "Node as the gpufrag.io/gpu-usage annotation and as Prometheus metrics.",
    )
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                        help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--interval-s", type=float, default=DEFAULT_INTERVAL_S,
                        help="seconds between NVML readings (default: %(default)s)")
    parser.add_argument("--tolerance-mib", type=int, default=DEFAULT_TOLERANCE_MIB,
                        help="publish when a GPU's or pod's memory moves by more than this "
                             "(default: %(default)s)")
    parser.add_argument("--tolerance-pct", type=int, default=DEFAULT_TOLERANCE_PCT,
                        help="publish when utilisation moves by more than this many points "
                             "(default: %(default)s)")
    parser.add_argument("--refresh-intervals", type=int, default=REFRESH_INTERVALS,
                        help="republish an unchanged reading after this many intervals "
                             "(default: %(default)s)")
    parser.add_argument("--leak-threshold-mib", type=int, default=100,
                        help="growth per interval that counts towards a leak streak "
                             "(default: %(default)s)")
    parser.add_argument("--leak-intervals", type=int, default=3,
                        help="consecutive growing intervals that raise a GPUMemoryGrowth event "
                             "(default: %(default)s)")
    parser.add_argument("--share-tolerance-mib", type=int,
                        default=isolation.DEFAULT_TOLERANCE_MIB,
                        help="report a share pod whose GPU memory exceeds its share by more "
                             "than this (default: %(default)s)")
    parser.add_argument("--share-intervals", type=int, default=isolation.DEFAULT_INTERVALS,
                        help="consecutive readings over its share that raise a "
                             "GPUMemoryOverShare event (default: %(default)s)")
    parser.add_argument("--share-cooldown-s", type=float, default=isolation.DEFAULT_COOLDOWN_S,
                        help="at most one GPUMemoryOverShare event per pod and GPU in this "
                             "many seconds (default: %(default)s)")
    parser.add_argument("--peak-window-s", type=float, default=peaks.DEFAULT_WINDOW_S,
                        help="each pod's published peak_mib covers this many seconds, what "
                             "the defrag trigger reads as used (default: %(default)s, the "
                             "recommender's 7 days)")
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                        help="port for /metrics, /healthz, /readyz; 0 disables "
                             "(default: %(default)s)")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: in-cluster service account, or "
                             "$KUBECONFIG / ~/.kube/config outside a cluster)")
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"),
                        help="host /proc for the pid -> pod lookup (default: %(default)s)")
    parser.add_argument("--nvml-recording", type=Path, default=None, metavar="FILE",
                        help="read the GPUs from this JSON recording (gpufrag.nvml_recorded) "
                             "instead of NVML: for nodes without a GPU; logged as recorded")
    parser.add_argument("--once", action="store_true",
                        help="read and publish once, then exit (0 on success)")
    parser.add_argument("--dry-run", action="store_true",
                        help="log the writes instead of making them")
    parser.add_argument("--log-level", default=None, help="debug, info, warning, error")
    return parser


def main(argv: Sequence[str] | None = None, *, nvml: NvmlApi | None = None,
         writer: ClusterWriter | None = None, pod_lister: PodLister | None = None,
         stop: threading.Event | None = None) -> int:
    """Run the agent. ``nvml``, ``writer`` and ``pod_lister`` replace the real NVML binding
    and Kubernetes client (``--nvml-recording`` replaces ``nvml``); ``stop`` ends the loop
    (default: SIGTERM / SIGINT set it)."""
    try:
        args = build_parser().parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    except BadInput as exc:  # a bad flag: one line, like every other bad input
        print(f"gpufrag agent: {exc} (see gpufrag agent --help)", file=sys.stderr)
        return EXIT_BAD_INPUT
    logs.configure(args.log_level)
    diagnose.install("agent")
    log: FilteringBoundLogger = structlog.get_logger("gpufrag.agent")
    try:
        config = AgentConfig(
            node_name=args.node_name,
            interval_s=args.interval_s,
            tolerance_mib=args.tolerance_mib,
            tolerance_pct=args.tolerance_pct,
            refresh_intervals=args.refresh_intervals,
            leak_threshold_mib=args.leak_threshold_mib,
            leak_intervals=args.leak_intervals,
            share_tolerance_mib=args.share_tolerance_mib,
            share_intervals=args.share_intervals,
            share_cooldown_s=args.share_cooldown_s,
            peak_window_s=args.peak_window_s,
            names=names_from_environ(),
        ).validate()
        check_metrics_port(args.metrics_port)
        if args.nvml_recording is not None:
            # A bad recording is bad input (exit 2), named by its path and field, like a flag.
            nvml = RecordedNvml.load(args.nvml_recording)
    except BadInput as exc:
        log.error("bad_input", error=str(exc))
        return EXIT_BAD_INPUT
    log = log.bind(node=config.node_name)
    if args.nvml_recording is not None:
        # Said before anything is published: what this agent publishes is not a measurement.
        log.warning("recorded_nvml", file=str(args.nvml_recording),
                    note=f"recorded NVML readings from {args.nvml_recording}, not a real GPU")

    reader = NvmlReader(nvml)
    try:
        gpu_count = reader.open()
    except NoGpuError as exc:
        log.error("no_gpu", reason=str(exc), ready=False, exit_code=EXIT_NO_GPU)
        return EXIT_NO_GPU
    except GpuReadError as exc:
        log.error("nvml_failed", error=str(exc))
        return EXIT_FAILURE
    try:
        return _run(args, config, reader, gpu_count, log, writer, pod_lister, stop)
    finally:
        reader.close()


def _run(args: argparse.Namespace, config: AgentConfig, reader: NvmlReader, gpu_count: int,
         log: FilteringBoundLogger, writer: ClusterWriter | None,
         pod_lister: PodLister | None, stop: threading.Event | None) -> int:
    if writer is None or pod_lister is None:
        try:
            api_client = kube_api_client(args.kubeconfig)
        except Exception as exc:  # the config loaders raise a zoo of types; all mean the same
            log.error("kube_config_failed", error=f"{type(exc).__name__}: {exc}",
                      hint="run in-cluster with a ServiceAccount, or pass --kubeconfig")
            return EXIT_FAILURE
        if writer is None:
            writer = KubeClusterWriter(api_client, node_name=config.node_name)
        if pod_lister is None:
            pod_lister = KubePodLister(api_client, config.node_name, names=config.names)
    if args.dry_run:
        writer = LogOnlyWriter(log)

    metrics = AgentMetrics(config.node_name)
    health = Health(time.time, stall_after_s=max(3 * config.interval_s, 60.0))
    directory = PodDirectory(pod_lister, min_refresh_s=min(config.interval_s, 10.0), log=log)
    publisher = Publisher(writer, PublishPolicy(config.tolerance_mib, config.tolerance_pct,
                                                config.refresh_s),
                          annotation_key=config.names.annotation_gpu_usage)
    agent = Agent(config, reader=reader, pods=PodResolver(directory, args.proc_root),
                  publisher=publisher, metrics=metrics, health=health, log=log,
                  shares=directory.share_of, pod_shares=directory.shares)
    log.info("starting", gpus=gpu_count, interval_s=config.interval_s, once=args.once,
             dry_run=args.dry_run,
             nvml="recorded" if args.nvml_recording is not None else "live")
    if args.once:
        return EXIT_OK if agent.tick() is not None else EXIT_FAILURE

    server = None
    if args.metrics_port:
        try:
            server = start_http_server(args.metrics_port, metrics, health)
        except ListenError as exc:
            log.error("metrics_port_unavailable", port=args.metrics_port, error=str(exc))
            return EXIT_FAILURE
    if stop is None:
        stop = threading.Event()
        stop_on_signals(stop, log)
    try:
        agent.run(stop.wait)
    finally:
        if server is not None:
            server.stop()
    log.info("stopped")
    return EXIT_OK
