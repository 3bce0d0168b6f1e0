"""``gpufrag device-plugin``: the kubelet device plugin, run as a DaemonSet on every GPU node.

Exit codes: 0 stopped by SIGTERM/SIGINT, 1 something broke (NVML failed, no cluster
credentials, metrics port taken), 2 bad flags or recording, 3 no GPU on this node.

``--nvml-recording FILE`` is the recorded inventory mode: the GPUs and their health come from a
JSON recording (:class:`gpufrag.nvml_recorded.RecordedNvml`) instead of the NVIDIA driver, for
nodes without a GPU (the dev kit, CI, a laptop). It is announced three ways: a
``recorded_nvml`` warning at start, ``nvml=recorded`` on the ``starting`` line, and the gauge
``gpufrag_deviceplugin_inventory_recorded`` = 1. A recording's scripted NVML errors are how a
test makes a GPU fail.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence

from gpufrag.argtypes import positive_float
from gpufrag.conventions import names_from_environ
from gpufrag.errors import EXIT_OK, BadInputArgumentParser
from gpufrag.nvml import NvmlApi, NvmlReader
from gpufrag.probes import Liveness
from node import daemon
from node.daemon import NodeDaemon
from node.deviceplugin.allocator import Allocator, PodSource
from node.deviceplugin.config import (
    DEFAULT_KUBELET_SOCKET,
    DEFAULT_METRICS_PORT,
    DEFAULT_SOCKET_DIR,
    DEFAULT_WATCH_INTERVAL_S,
    DevicePluginConfig,
    parse_kinds,
)
from node.deviceplugin.devices import check_ids
from node.deviceplugin.metrics import PluginMetrics, start_http_server
from node.deviceplugin.pods import KubeNodePods, NodePods
from node.deviceplugin.server import Supervisor
from node.deviceplugin.service import DevicePluginServicer
from node.deviceplugin.trust import KubeRecordKeys, RecordTrust
from node.deviceplugin.writes import KubePodWriter, PodWriter
from node.gpus import DeviceNodes, add_grant_flags, read_inventory
from node.health import DEFAULT_HEALTH_INTERVAL_S, HealthBoard, HealthMonitor, health_reader


def build_parser() -> BadInputArgumentParser:
    parser = daemon.flag_parser(
        "gpufrag device-plugin",
        "Advertise this node's GPUs to the kubelet (whole GPUs and milli-GPU "
        "shares) and give each container exactly the GPUs the extender chose.",
        default_metrics_port=DEFAULT_METRICS_PORT)
    parser.add_argument("--socket-dir", default=DEFAULT_SOCKET_DIR,
                        help="the kubelet's device-plugin directory (default: %(default)s)")
    parser.add_argument("--kubelet-socket", default=DEFAULT_KUBELET_SOCKET,
                        help="the kubelet's registration socket in --socket-dir "
                             "(default: %(default)s)")
    parser.add_argument("--resources", default="whole,share",
                        help="which to serve: whole (the whole-GPU resource), share (the "
                             "milli-GPU resource), or both (default: %(default)s)")
    parser.add_argument("--health-interval-s", type=float, default=DEFAULT_HEALTH_INTERVAL_S,
                        help="seconds between GPU health reads (default: %(default)s)")
    parser.add_argument("--watch-interval-s", type=float, default=DEFAULT_WATCH_INTERVAL_S,
                        help="seconds between looks for a restarted kubelet "
                             "(default: %(default)s)")
    add_grant_flags(parser)
    parser.add_argument("--kubelet-fallback", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="give a whole-GPU pod that gpufrag-scheduler's bind did not place "
                             "(no gpu-indices annotation) the GPUs the kubelet chose, as "
                             "NVIDIA's plugin does; --no-kubelet-fallback refuses it "
                             "(default: on)")
    parser.add_argument("--verify-records", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="honour a pod's gpu-indices record only with the extender's "
                             "signature (gpu-record) for that pod on this node, checked "
                             "against the public keys the extender publishes; "
                             "--no-verify-records trusts any record, which lets anyone who "
                             "can write a pod name another pod's GPU (docs/security.md) "
                             "(default: on)")
    parser.add_argument("--stuck-call-s", type=positive_float, default=60.0,
                        help="a kubelet call (Allocate, GetPreferredAllocation, "
                             "PreStartContainer) in progress longer than this fails /healthz, "
                             "so a plugin whose request path is stuck is restarted "
                             "(default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None, *, nvml: NvmlApi | None = None,
         pods: PodSource | None = None, writer: PodWriter | None = None,
         records: RecordTrust | None = None, stop: threading.Event | None = None) -> int:
    """Run the plugin. ``nvml``, ``pods``, ``writer`` and ``records`` replace the NVML binding
    and the Kubernetes client (tests); ``stop`` ends it (default: SIGTERM / SIGINT set it)."""
    return daemon.run("deviceplugin", build_parser(), argv,
                      lambda started: _start(started, nvml, pods, writer, records, stop))


def _config(args: argparse.Namespace) -> DevicePluginConfig:
    return DevicePluginConfig(
        node_name=args.node_name, socket_dir=args.socket_dir,
        kubelet_socket=args.kubelet_socket, kinds=parse_kinds(args.resources),
        health_interval_s=args.health_interval_s, watch_interval_s=args.watch_interval_s,
        mps=args.mps, mps_pipe_dir=args.mps_pipe_dir, dev_root=args.dev_root,
        kubelet_fallback=args.kubelet_fallback,
        names=names_from_environ(),
    ).validate().require_paths()


def _inventory(reader: NvmlReader) -> HealthBoard:
    """The GPUs NVML finds, each with a distinct id (a duplicate is a failure, not bad input)."""
    reader.open()
    gpus = read_inventory(reader)
    check_ids(gpus)
    return HealthBoard(gpus)


def _start(started: NodeDaemon, nvml: NvmlApi | None, pods: PodSource | None,
           writer: PodWriter | None, records: RecordTrust | None,
           stop: threading.Event | None) -> int:
    config = started.settle(
        lambda: _config(started.args),
        recorded_note="GPUs and their health come from the recording {file}, not a driver: "
                      "containers get no real GPU")
    with started.open_gpus(nvml, _inventory) as (reader, board):
        return _run(started, config, reader, board, pods, writer, records, stop)


def _run(started: NodeDaemon, config: DevicePluginConfig, reader: NvmlReader,
         board: HealthBoard, pods: PodSource | None, writer: PodWriter | None,
         records: RecordTrust | None, stop: threading.Event | None) -> int:
    args, log, recorded = started.args, started.log, started.recorded
    metrics = PluginMetrics(config.node_name, recorded=recorded)
    for gpu in board.gpus:
        metrics.observe_health(gpu, True)
    nodes = DeviceNodes.find(board.gpus, config)
    watcher: KubeNodePods | None = None
    allocator_ref: list[Allocator] = []

    def forget(uid: str) -> None:
        for allocator in allocator_ref:
            allocator.forget(uid)

    verify = args.verify_records
    if pods is None or writer is None or (verify and records is None):
        api_client = started.kube_client()
        if pods is None:
            cache = NodePods(config.names, annotation_allocated=config.annotation_allocated,
                             on_gone=forget)
            watcher = KubeNodePods(api_client, config.node_name, cache)
            pods = watcher
        if writer is None:
            writer = KubePodWriter(api_client, node_name=config.node_name)
        if verify and records is None:
            records = KubeRecordKeys.from_api(api_client, config.names)
    if not verify:
        records = None
        log.warning("records_not_verified",
                    effect="any gpu-indices record is honoured: anyone who can write a pod on "
                           "this node can name another pod's GPU (--no-verify-records)")
    allocator = Allocator(config, board, pods, writer, metrics, log=log, nodes=nodes,
                          records=records)
    allocator_ref.append(allocator)
    liveness = Liveness(time.monotonic, stall_after_s=max(30.0, 10 * config.watch_interval_s),
                        stuck_after_s=args.stuck_call_s)
    servicers = [DevicePluginServicer(kind, config.resource(kind), board, allocator, metrics,
                                      log=log, liveness=liveness) for kind in config.kinds]
    supervisor = Supervisor(config, servicers, metrics, liveness, log=log)
    log.info("starting", gpus=[gpu.index for gpu in board.gpus],
             uuids=[gpu.uuid for gpu in board.gpus],
             resources=[config.resource(kind) for kind in config.kinds],
             socket_dir=config.socket_dir, mps=config.mps,
             kubelet_fallback=config.kubelet_fallback,
             nvml="recorded" if recorded else "live",
             missing_device_nodes=list(nodes.missing))
    if nodes.missing:
        # A container would get no such device: the NVIDIA runtime may still inject them, but
        # without it the workload sees no GPU. Said loudly, once, with where it looked.
        log.warning("device_nodes_missing", missing=list(nodes.missing), dev_root=config.dev_root,
                    effect="containers get only the device nodes that exist; mount the host's "
                           "/dev at --dev-root, or run the NVIDIA container runtime")
    server = started.serve_probes(
        lambda port: start_http_server(port, metrics, liveness.live, lambda: supervisor.ready))
    stop = started.stop_event(stop)
    if watcher is not None:
        watcher.start()
    with health_reader(reader, args.nvml_recording, log=log) as follow:
        monitor = HealthMonitor(follow, board, log=log,
                                on_change=lambda gpu, ok, _reason: metrics.observe_health(gpu, ok))
        health_thread = threading.Thread(
            target=monitor.run, args=(stop.wait, config.health_interval_s), name="gpu-health",
            daemon=True)
        health_thread.start()
        try:
            supervisor.run(stop.wait)
        finally:
            board.close()
            supervisor.stop()
            health_thread.join(config.health_interval_s + 5)
            if watcher is not None:
                watcher.stop()
            if server is not None:
                server.stop()
    log.info("stopped")
    return EXIT_OK
