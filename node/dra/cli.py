"""``gpufrag dra-plugin``: the DRA driver, run as a DaemonSet on every GPU node.

Exit codes (the node daemons' own, :mod:`node.daemon`): 0 stopped by SIGTERM/SIGINT, 1
something broke (NVML failed, no cluster credentials, metrics port taken), 2 bad flags or
recording, 3 no GPU on this node.

What it does, in order: read the GPUs (NVML, or ``--nvml-recording`` on a node without one),
serve the kubelet's DRA plugin and registration sockets, then publish this node's
ResourceSlices and check them every ``--publish-interval-s``; read each GPU's health every
``--health-interval-s`` (the device plugin's health source, :mod:`node.health`; in recorded
mode, edits of the recording are followed) and republish at once when it changes, an unhealthy
GPU's devices tainted ``NoSchedule``; the same board feeds the kubelet's health stream
(:mod:`node.dra.health`, each allocated device's health in its pod's status). A failed
publish is logged and retried at the next pass; the driver keeps serving the claims already
allocated.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from gpufrag.argtypes import positive_float
from gpufrag.errors import EXIT_OK, BadInputArgumentParser
from gpufrag.mig_instances import MigInstances
from gpufrag.nvml import NvmlApi, NvmlReader
from gpufrag.probes import Liveness
from node import daemon
from node.daemon import NodeDaemon
from node.dra.api import PLUGINS_DIR, PLUGINS_REGISTRY_DIR
from node.dra.cdi import SpecDir
from node.dra.config import CDI_KIND, DEFAULT_CDI_DIR, DEFAULT_METRICS_PORT, DRIVER_NAME, DraConfig
from node.dra.health import HealthServicer
from node.dra.kube import KubeClaims, KubeSlices, node_uid
from node.dra.metrics import DriverMetrics, start_http_server
from node.dra.partitions import RECORD_KIND, Partitions
from node.dra.publish import SliceApi, SlicePublisher
from node.dra.server import DriverServer
from node.dra.service import ClaimSource, DraPluginServicer, RegistrationServicer
from node.dra.slices import build_slices, device_uuids
from node.gpus import DeviceNodes, Gpu, add_grant_flags, read_inventory
from node.health import DEFAULT_HEALTH_INTERVAL_S, HealthBoard, HealthMonitor, health_reader
from scheduler.kube.errors import ApiError


def build_parser() -> BadInputArgumentParser:
    parser = daemon.flag_parser(
        "gpufrag dra-plugin",
        "Publish this node's GPUs as a DRA ResourceSlice (consumable memory and milli-GPU) "
        "and prepare the claims kube-scheduler allocated on them (kubelet DRA plugin).",
        default_metrics_port=DEFAULT_METRICS_PORT)
    parser.add_argument("--driver-name", default=DRIVER_NAME,
                        help="the DRA driver name DeviceClasses select (default: %(default)s)")
    parser.add_argument("--registry-dir", default=PLUGINS_REGISTRY_DIR,
                        help="the kubelet's plugin registration directory "
                             "(default: %(default)s)")
    parser.add_argument("--plugins-dir", default=PLUGINS_DIR,
                        help="where the driver's own socket goes, in <dir>/<driver-name>/ "
                             "(default: %(default)s)")
    parser.add_argument("--cdi-dir", default=DEFAULT_CDI_DIR,
                        help="where the container runtime reads CDI specs "
                             "(default: %(default)s)")
    parser.add_argument("--publish-interval-s", type=positive_float, default=30.0,
                        help="seconds between checks of this node's ResourceSlice "
                             "(default: %(default)s)")
    parser.add_argument("--health-interval-s", type=positive_float,
                        default=DEFAULT_HEALTH_INTERVAL_S,
                        help="seconds between GPU health reads; an unhealthy GPU's devices are "
                             "tainted NoSchedule and reported Unhealthy to the kubelet, which "
                             "is sent every device's health this often (default: %(default)s)")
    add_grant_flags(parser)
    return parser


def main(argv: Sequence[str] | None = None, *, nvml: NvmlApi | None = None,
         claims: ClaimSource | None = None, slices: SliceApi | None = None,
         stop: threading.Event | None = None) -> int:
    """Run the driver. ``nvml``, ``claims`` and ``slices`` replace the NVML binding and the
    Kubernetes client (tests); ``stop`` ends it (default: SIGTERM / SIGINT set it)."""
    return daemon.run("dra", build_parser(), argv,
                      lambda started: _start(started, nvml, claims, slices, stop))


def _config(started: NodeDaemon) -> DraConfig:
    args = started.args
    return DraConfig(
        node_name=args.node_name, driver_name=args.driver_name, registry_dir=args.registry_dir,
        plugins_dir=args.plugins_dir, cdi_dir=args.cdi_dir, mps=args.mps,
        mps_pipe_dir=args.mps_pipe_dir, dev_root=args.dev_root,
        publish_interval_s=args.publish_interval_s, health_interval_s=args.health_interval_s,
    ).validate()


def read_gpus(reader: NvmlReader) -> tuple[tuple[Gpu, ...], dict[int, bool]]:
    """The GPUs and, by index, whether each is in MIG mode (read once, at start)."""
    reader.open()
    gpus = read_inventory(reader)
    mig = {reading.index: reading.mig_mode for reading in reader.read(processes=False)}
    return gpus, mig


def _start(started: NodeDaemon, nvml: NvmlApi | None, claims: ClaimSource | None,
           slices: SliceApi | None, stop: threading.Event | None) -> int:
    config = started.settle(
        lambda: _config(started),
        recorded_note="GPUs come from the recording {file}, not a driver: containers get no "
                      "real GPU")
    with started.open_gpus(nvml, read_gpus) as (reader, (gpus, mig)):
        return _run(started, config, reader, gpus, mig, claims, slices, stop)


def _run(started: NodeDaemon, config: DraConfig, reader: NvmlReader, gpus: tuple[Gpu, ...],
         mig: dict[int, bool], claims: ClaimSource | None, slices: SliceApi | None,
         stop: threading.Event | None) -> int:
    log = started.log
    owner = ""
    if claims is None or slices is None:
        api_client = started.kube_client()
        claims = claims or KubeClaims(api_client)
        slices = slices or KubeSlices(api_client)
        try:
            owner = node_uid(api_client, config.node_name)
        except ApiError as exc:
            log.warning("node_unreadable", error=str(exc),
                        effect="the slice is published without the Node as its owner")
    metrics = DriverMetrics(recorded=started.recorded)
    nodes = DeviceNodes.find(gpus, config)
    # MIG instances are made through the NVML the GPUs were read with (the recording's, in
    # recorded mode), only where a GPU is in MIG mode.
    instances = MigInstances(reader.api) if any(mig.values()) else None
    partitions = Partitions(instances, SpecDir(config.partitions_dir, RECORD_KIND), log=log)
    plugin = DraPluginServicer(config, gpus, claims, SpecDir(config.cdi_dir, CDI_KIND), nodes,
                               metrics, partitions=partitions, log=log)
    registration = RegistrationServicer(config, log=log)
    publisher = SlicePublisher(slices, driver=config.driver_name, node_name=config.node_name,
                               gpus=gpus, mig_enabled=mig, log=log, node_uid=owner)
    liveness = Liveness(time.monotonic, stall_after_s=max(60.0, 3 * config.publish_interval_s))
    published = threading.Event()
    log.info("starting", driver=config.driver_name, gpus=[gpu.index for gpu in gpus],
             uuids=[gpu.uuid for gpu in gpus], mig=[i for i, on in mig.items() if on],
             registration_socket=config.registration_socket_path,
             plugin_socket=config.plugin_socket_path, cdi_dir=config.cdi_dir,
             nvml="recorded" if started.recorded else "live",
             missing_device_nodes=list(nodes.missing))
    board = HealthBoard(gpus)
    health_service = HealthServicer(
        board, device_uuids(build_slices(config.node_name, config.driver_name, gpus, mig)),
        pool=config.node_name, refresh_s=config.health_interval_s, metrics=metrics, log=log)
    server = DriverServer(config, plugin, registration, health_service)
    server.start()
    http = started.serve_probes(lambda port: start_http_server(
        port, metrics, liveness.live, lambda: registration.registered and published.is_set()))
    stop = started.stop_event(stop)

    def publish() -> None:
        try:
            metrics.slice_syncs.labels(publisher.sync()).inc()
            published.set()
        except ApiError as exc:
            metrics.slice_syncs.labels("failed").inc()
            log.warning("slice_publish_failed", error=str(exc),
                        retry_in_s=config.publish_interval_s)

    def health_changed(gpu: Gpu, healthy: bool, _reason: str) -> None:
        publisher.mark(gpu.index, healthy)
        publish()  # the taint goes on (or off) now, not at the next interval

    with health_reader(reader, started.args.nvml_recording, log=log) as follow:
        monitor = HealthMonitor(follow, board, log=log, on_change=health_changed,
                                effect="its devices are tainted NoSchedule in the ResourceSlice "
                                       "and reported Unhealthy to the kubelet; no new claim is "
                                       "allocated it")
        health = threading.Thread(target=monitor.run, args=(stop.wait, config.health_interval_s),
                                  name="gpu-health", daemon=True)
        health.start()
        try:
            while True:
                liveness.tick()
                publish()
                if stop.wait(config.publish_interval_s):
                    break
        finally:
            board.close()  # ends the kubelet's health streams
            health.join(config.health_interval_s + 5)
            server.stop()
            if http is not None:
                http.stop()
    log.info("stopped")
    return EXIT_OK
