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
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpufrag.conventions import names_from_environ
from gpufrag.errors import EXIT_FAILURE, EXIT_OK, BadInputArgumentParser
from gpufrag.gpu_usage import REFRESH_INTERVALS
from gpufrag.nvml import NvmlApi, NvmlReader
from node import daemon
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
from node.daemon import NodeDaemon

DEFAULT_METRICS_PORT = 9401  # next to the DCGM exporter's 9400, so both can run on hostNetwork


def build_parser() -> BadInputArgumentParser:
    parser = daemon.flag_parser(
        "gpufrag agent",
        "Read every GPU through NVML, attribute memory to pods, publish it on the "
        "Node as the gpufrag.io/gpu-usage annotation and as Prometheus metrics.",
        default_metrics_port=DEFAULT_METRICS_PORT)
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
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"),
                        help="host /proc for the pid -> pod lookup (default: %(default)s)")
    parser.add_argument("--once", action="store_true",
                        help="read and publish once, then exit (0 on success)")
    parser.add_argument("--dry-run", action="store_true",
                        help="log the writes instead of making them")
    return parser


def main(argv: Sequence[str] | None = None, *, nvml: NvmlApi | None = None,
         writer: ClusterWriter | None = None, pod_lister: PodLister | None = None,
         stop: threading.Event | None = None) -> int:
    """Run the agent. ``nvml``, ``writer`` and ``pod_lister`` replace the real NVML binding
    and Kubernetes client (``--nvml-recording`` replaces ``nvml``); ``stop`` ends the loop
    (default: SIGTERM / SIGINT set it)."""
    return daemon.run("agent", build_parser(), argv,
                      lambda started: _run(started, nvml, writer, pod_lister, stop))


def _config(args: argparse.Namespace) -> AgentConfig:
    return AgentConfig(
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


def _run(started: NodeDaemon, nvml: NvmlApi | None, writer: ClusterWriter | None,
         pod_lister: PodLister | None, stop: threading.Event | None) -> int:
    args = started.args
    config = started.settle(lambda: _config(args),
                            recorded_note="recorded NVML readings from {file}, not a real GPU")
    log = started.log
    with started.open_gpus(nvml, NvmlReader.open) as (reader, gpu_count):
        if writer is None or pod_lister is None:
            api_client = started.kube_client()
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
                 dry_run=args.dry_run, nvml="recorded" if started.recorded else "live")
        if args.once:
            return EXIT_OK if agent.tick() is not None else EXIT_FAILURE

        server = started.serve_probes(
            lambda port: start_http_server(port, metrics, health))
        stop = started.stop_event(stop)
        try:
            agent.run(stop.wait)
        finally:
            if server is not None:
                server.stop()
        log.info("stopped")
        return EXIT_OK
