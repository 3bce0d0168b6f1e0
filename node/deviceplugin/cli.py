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
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog
from structlog.typing import FilteringBoundLogger

from gpufrag import diagnose, logs
from gpufrag.argtypes import positive_float
from gpufrag.conventions import names_from_environ
from gpufrag.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_NO_GPU,
    EXIT_OK,
    BadInput,
    BadInputArgumentParser,
)
from gpufrag.httpserve import ListenError
from gpufrag.nvml import GpuReadError, NoGpuError, NvmlApi, NvmlReader
from gpufrag.nvml_recorded import RecordedNvml
from gpufrag.probes import Liveness, check_metrics_port, stop_on_signals
from node.deviceplugin.allocator import Allocator, DeviceNodes, PodSource
from node.deviceplugin.config import (
    DEFAULT_HEALTH_INTERVAL_S,
    DEFAULT_KUBELET_SOCKET,
    DEFAULT_METRICS_PORT,
    DEFAULT_SOCKET_DIR,
    DEFAULT_WATCH_INTERVAL_S,
    DevicePluginConfig,
    parse_kinds,
)
from node.deviceplugin.devices import check_ids
from node.deviceplugin.inventory import (
    FollowedRecording,
    HealthBoard,
    HealthMonitor,
    read_inventory,
)
from node.deviceplugin.metrics import PluginMetrics, start_http_server
from node.deviceplugin.pods import KubeNodePods, NodePods
from node.deviceplugin.server import Supervisor
from node.deviceplugin.service import DevicePluginServicer
from node.deviceplugin.trust import KubeRecordKeys, RecordTrust
from node.deviceplugin.writes import KubePodWriter, PodWriter
from scheduler.kube.client import api_client as kube_api_client


def build_parser() -> argparse.ArgumentParser:
    parser = BadInputArgumentParser(
        prog="gpufrag device-plugin",
        description="Advertise this node's GPUs to the kubelet (whole GPUs and milli-GPU "
                    "shares) and give each container exactly the GPUs the extender chose.",
    )
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                        help="this node's name (default: $NODE_NAME)")
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
    parser.add_argument("--mps", action="store_true",
                        help="set CUDA_MPS_* limits for shares (an MPS control daemon runs)")
    parser.add_argument("--mps-pipe-dir", default="",
                        help="host directory of the MPS pipes, mounted into share containers")
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
    parser.add_argument("--dev-root", default="/dev",
                        help="where the plugin sees the host's /dev (default: %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                        help="port for /metrics, /healthz, /readyz; 0 disables "
                             "(default: %(default)s)")
    parser.add_argument("--stuck-call-s", type=positive_float, default=60.0,
                        help="a kubelet call (Allocate, GetPreferredAllocation, "
                             "PreStartContainer) in progress longer than this fails /healthz, "
                             "so a plugin whose request path is stuck is restarted "
                             "(default: %(default)s)")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: in-cluster service account, or "
                             "$KUBECONFIG / ~/.kube/config outside a cluster)")
    parser.add_argument("--nvml-recording", type=Path, default=None, metavar="FILE",
                        help="read the GPUs from this JSON recording (gpufrag.nvml_recorded) "
                             "instead of NVML: for nodes without a GPU; announced as recorded")
    parser.add_argument("--log-level", default=None, help="debug, info, warning, error")
    return parser


def main(argv: Sequence[str] | None = None, *, nvml: NvmlApi | None = None,
         pods: PodSource | None = None, writer: PodWriter | None = None,
         records: RecordTrust | None = None, stop: threading.Event | None = None) -> int:
    """Run the plugin. ``nvml``, ``pods``, ``writer`` and ``records`` replace the NVML binding
    and the Kubernetes client (tests); ``stop`` ends it (default: SIGTERM / SIGINT set it)."""
    try:
        args = build_parser().parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    except BadInput as exc:
        print(f"gpufrag device-plugin: {exc} (see gpufrag device-plugin --help)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    logs.configure(args.log_level)
    diagnose.install("deviceplugin")
    log: FilteringBoundLogger = structlog.get_logger("gpufrag.deviceplugin")
    try:
        config = DevicePluginConfig(
            node_name=args.node_name, socket_dir=args.socket_dir,
            kubelet_socket=args.kubelet_socket, kinds=parse_kinds(args.resources),
            health_interval_s=args.health_interval_s, watch_interval_s=args.watch_interval_s,
            mps=args.mps, mps_pipe_dir=args.mps_pipe_dir, dev_root=args.dev_root,
            kubelet_fallback=args.kubelet_fallback,
            names=names_from_environ(),
        ).validate().require_paths()
        check_metrics_port(args.metrics_port)
        if args.nvml_recording is not None:
            nvml = RecordedNvml.load(args.nvml_recording)
    except BadInput as exc:
        log.error("bad_input", error=str(exc))
        return EXIT_BAD_INPUT
    log = log.bind(node=config.node_name)
    recorded = args.nvml_recording is not None
    if recorded:
        log.warning("recorded_nvml", file=str(args.nvml_recording),
                    note=f"GPUs and their health come from the recording {args.nvml_recording}, "
                         "not a driver: containers get no real GPU")
    reader = NvmlReader(nvml)
    try:
        reader.open()
        gpus = read_inventory(reader)
        check_ids(gpus)
    except NoGpuError as exc:
        log.error("no_gpu", reason=str(exc), ready=False, exit_code=EXIT_NO_GPU)
        return EXIT_NO_GPU
    except (GpuReadError, ValueError) as exc:
        reader.close()
        log.error("nvml_failed", error=str(exc))
        return EXIT_FAILURE
    try:
        return _run(args, config, reader, HealthBoard(gpus), recorded, log, pods, writer,
                    records, stop)
    finally:
        reader.close()


def _run(args: argparse.Namespace, config: DevicePluginConfig, reader: NvmlReader,
         board: HealthBoard, recorded: bool, log: FilteringBoundLogger,
         pods: PodSource | None, writer: PodWriter | None, records: RecordTrust | None,
         stop: threading.Event | None) -> int:
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
        try:
            api_client = kube_api_client(args.kubeconfig)
        except Exception as exc:  # the config loaders raise a zoo of types; all mean the same
            log.error("kube_config_failed", error=f"{type(exc).__name__}: {exc}",
                      hint="run in-cluster with a ServiceAccount, or pass --kubeconfig")
            return EXIT_FAILURE
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
    server = None
    if args.metrics_port:
        try:
            server = start_http_server(args.metrics_port, metrics, liveness.live,
                                       lambda: supervisor.ready)
        except ListenError as exc:
            log.error("metrics_port_unavailable", port=args.metrics_port, error=str(exc))
            return EXIT_FAILURE
    if stop is None:
        stop = threading.Event()
        stop_on_signals(stop, log)
    if watcher is not None:
        watcher.start()
    follow: Callable[[], NvmlReader] = functools.partial(_same, reader)
    if args.nvml_recording is not None:
        follow = FollowedRecording(args.nvml_recording, reader, log=log, load=RecordedNvml.load)
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
        if isinstance(follow, FollowedRecording):
            follow.close()  # the reader it holds now (the first one is closed by main)
        if server is not None:
            server.stop()
    log.info("stopped")
    return EXIT_OK


def _same(reader: NvmlReader) -> NvmlReader:
    return reader
