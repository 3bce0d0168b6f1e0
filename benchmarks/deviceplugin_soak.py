"""Does the device plugin leak while a ListAndWatch stream stays open and GPU health flaps?
Target: memory, file descriptors and threads flat over an hour of health changes.

The plugin runs as it runs on a node, in its own process: ``gpufrag device-plugin``'s own
``main`` (supervisor, health thread, both gRPC endpoints, recorded inventory mode following its
recording file), with the pod cache and the pod writes replaced by in-memory ones (no API server:
this measures the plugin, not a client library's caches). This process is the kubelet's side:
a Registration service on ``kubelet.sock`` that, on each Register, dials the plugin back and
keeps its ListAndWatch stream open for the whole run, as the kubelet's device manager does.

Health flaps the way it does on a node: the recording the plugin follows is rewritten every
``--flip-s`` (GPU 0 alternately lost, ``NVMLError_GpuIsLost`` on its memory read, and back), the
plugin's health pass notices, and both streams get a new device list. Every ``--sample-s`` the
plugin's RSS (``/proc/<pid>/status`` VmRSS), open fds (``/proc/<pid>/fd``) and threads are
printed against the reference taken once the streams are open and the first flips are through
(so first-use allocations are not counted as growth), with the RSS slope over the run in KiB per
1000 health changes. The stream side checks that every list it receives says what the recording
said (so the plugin cannot look flat by falling behind).

    .venv/bin/python -m benchmarks.deviceplugin_soak                  # 2 minutes
    .venv/bin/python -m benchmarks.deviceplugin_soak --duration-s 3600  # the hour of the target

Exit 0 when RSS grew by less than ``--max-rss-growth-mib`` and fds and threads did not grow.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from benchmarks import results
from benchmarks.deviceplugin_allocate import MemoryPods, NoWrites
from benchmarks.procstat import cpu_seconds
from devkit.procs import ComponentProcess, wait_until
from node.deviceplugin import cli
from node.deviceplugin.api import (
    HEALTHY,
    UNHEALTHY,
    DevicePluginClient,
    add_registration_service,
    pb,
    unix_target,
)

NODE = "soak-node"
GPUS = 4
MEMORY_TOTAL = 85_899_345_920  # 80 GiB, as NVML reports an A100 80GB
MAX_FD_GROWTH = 0
MAX_THREAD_GROWTH = 0


def uuid(index: int) -> str:
    return f"GPU-50a50a50-0000-4000-8000-{index:012x}"


def recording(flip: int) -> dict[str, Any]:
    """The recording for the ``flip``-th change: GPU 0 lost on odd flips."""
    devices = []
    for index in range(GPUS):
        device: dict[str, Any] = {"name": "NVIDIA A100-SXM4-80GB", "uuid": uuid(index),
                                  "memory_total": MEMORY_TOTAL,
                                  "samples": [{"gpu": 0, "memory_used": 0}]}
        if index == 0 and flip % 2:
            device["errors"] = {"nvmlDeviceGetMemoryInfo": "NVMLError_GpuIsLost"}
        devices.append(device)
    return {"devices": devices, "flip": flip}  # "flip": every rewrite differs in content


def write_recording(path: Path, flip: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(recording(flip)))
    tmp.replace(path)


# -- the plugin's process ----------------------------------------------------------------------

def serve_plugin(argv: Sequence[str]) -> int:
    """``--serve-plugin`` (the child): the plugin's own ``main``, no API server behind it."""
    return cli.main(argv, pods=MemoryPods([]), writer=NoWrites())


@dataclass(frozen=True, slots=True)
class ProcSample:
    rss_kib: int
    fds: int
    threads: int


def sample(pid: int) -> ProcSample:
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return ProcSample(rss, len(os.listdir(f"/proc/{pid}/fd")), threads)


# -- the kubelet's side ------------------------------------------------------------------------

@dataclass
class Stream:
    """One open ListAndWatch, counting lists and checking GPU 0's health in each."""

    resource: str
    lists: int = 0
    last_gpu0_healthy: bool | None = None
    wrong: list[str] = field(default_factory=list)
    ended: str = ""


class Kubelet:
    """Registration on ``kubelet.sock``; each Register opens and keeps a ListAndWatch."""

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self.streams: list[Stream] = []
        self._clients: list[DevicePluginClient] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        add_registration_service(self.server, self._register)
        self.server.add_insecure_port(unix_target(str(socket_dir / "kubelet.sock")))

    def _register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        stream = Stream(request.resource_name)
        client = DevicePluginClient(str(self.socket_dir / request.endpoint))
        thread = threading.Thread(target=self._watch, args=(client, stream), daemon=True,
                                  name=f"law-{request.resource_name}")
        with self._lock:
            self.streams.append(stream)
            self._clients.append(client)
            self._threads.append(thread)
        thread.start()
        return pb.Empty()

    def _watch(self, client: DevicePluginClient, stream: Stream) -> None:
        try:
            for response in client.list_and_watch(pb.Empty()):
                gpu0 = {d.health for d in response.devices if d.ID.startswith(uuid(0))}
                if len(gpu0) != 1 or not gpu0 <= {HEALTHY, UNHEALTHY}:
                    stream.wrong.append(f"list {stream.lists}: GPU 0 health {sorted(gpu0)}")
                stream.last_gpu0_healthy = gpu0 == {HEALTHY}
                stream.lists += 1
        except grpc.RpcError as exc:
            stream.ended = f"{exc.code().name}"
        else:
            stream.ended = "closed by the plugin"

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        self.server.stop(0).wait()
        for thread in self._threads:
            thread.join(5)


def slope_kib_per_1000(points: Sequence[tuple[int, int]]) -> float:
    """Least-squares slope of RSS (KiB) against health changes, per 1000 changes."""
    if len(points) < 2:
        return 0.0
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def soak(args: argparse.Namespace, folder: Path, start: results.Start) -> int:
    path = folder / "nvml.json"
    write_recording(path, 0)
    kubelet = Kubelet(folder)
    kubelet.start()
    log_path = folder / "plugin.log"
    argv = [sys.executable, "-m", "benchmarks.deviceplugin_soak", "--serve-plugin",
            f"--node-name={NODE}", f"--socket-dir={folder}", f"--nvml-recording={path}",
            f"--health-interval-s={args.health_interval_s}", "--metrics-port=0",
            "--log-level=warning"]
    with log_path.open("ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=os.getcwd(),
                                   start_new_session=True)
    plugin = ComponentProcess("device-plugin", process, log_path, 0)
    try:
        wait_until(lambda: (len(kubelet.streams) == 2
                            and all(s.lists for s in kubelet.streams)) or None,
                   timeout_s=60, what="both ListAndWatch streams to open")
        flips = 0
        started = time.monotonic()
        warmup_until = started + min(args.warmup_s, args.duration_s / 4)
        reference: ProcSample | None = None
        reference_flips = 0
        reference_cpu_s = 0.0
        points: list[tuple[int, int]] = []
        next_sample = warmup_until
        next_flip = started
        end = started + args.duration_s
        print(f"device plugin soak: pid {process.pid}, {GPUS} recorded GPUs, whole + share "
              f"streams open; GPU 0 flips every {args.flip_s} s (health read every "
              f"{args.health_interval_s} s) for {args.duration_s:.0f} s")
        print(f"  {'elapsed s':>9} {'changes':>8} {'lists':>7} {'RSS MiB':>8} {'dRSS KiB':>9} "
              f"{'fds':>4} {'dfd':>4} {'threads':>7} {'dthr':>5}")
        while True:
            now = time.monotonic()
            if not plugin.running():
                raise SystemExit(plugin.describe_failure(
                    f"exited with {process.returncode} during the soak"))
            if now >= next_flip and now < end:
                flips += 1
                write_recording(path, flips)
                next_flip += args.flip_s
            if now >= next_sample:
                got = sample(process.pid)
                if reference is None:
                    reference, reference_flips = got, flips
                    reference_cpu_s = cpu_seconds(process.pid)
                points.append((flips, got.rss_kib))
                lists = min(s.lists for s in kubelet.streams)
                print(f"  {now - started:9.0f} {flips:8d} {lists:7d} {got.rss_kib / 1024:8.1f} "
                      f"{got.rss_kib - reference.rss_kib:9d} {got.fds:4d} "
                      f"{got.fds - reference.fds:4d} {got.threads:7d} "
                      f"{got.threads - reference.threads:5d}", flush=True)
                next_sample += args.sample_s
            if now >= end:
                break
            time.sleep(max(0.0, min(next_flip, next_sample, end) - time.monotonic()))
        # Let the last change reach the streams before checking them.
        expected = flips % 2 == 0
        wait_until(lambda: all(s.last_gpu0_healthy is expected for s in kubelet.streams) or None,
                   timeout_s=10 * args.health_interval_s + 10,
                   what="the streams to show the last health change")
        final = sample(process.pid)
        cpu_s = cpu_seconds(process.pid) - reference_cpu_s
        # Before the plugin is stopped (which ends the streams, as it should).
        ended = [f"{s.resource} stream ended early: {s.ended}" for s in kubelet.streams
                 if s.ended]
    finally:
        plugin.stop(15)
        kubelet.stop()
    assert reference is not None
    points.append((flips, final.rss_kib))
    growth_mib = (final.rss_kib - reference.rss_kib) / 1024
    slope = slope_kib_per_1000(points)
    changes = flips - reference_flips
    print(f"health changes: {flips} ({changes} after the reference); lists received per "
          f"stream: " + ", ".join(f"{s.resource} {s.lists}" for s in kubelet.streams))
    problems = [f"{s.resource}: {w}" for s in kubelet.streams for w in s.wrong[:3]]
    problems += ended
    # The health pass runs every health_interval_s, so two flips may fold into one list; the
    # streams must still carry most changes, or the plugin is not really being exercised.
    short = [s for s in kubelet.streams if s.lists < flips // 2]
    problems += [f"{s.resource}: only {s.lists} lists for {flips} changes" for s in short]
    print(f"RSS {reference.rss_kib / 1024:.1f} -> {final.rss_kib / 1024:.1f} MiB "
          f"({growth_mib:+.2f} MiB, slope {slope:+.1f} KiB per 1000 changes; "
          f"limit {args.max_rss_growth_mib} MiB); fds {reference.fds} -> {final.fds} "
          f"({final.fds - reference.fds:+d}); threads {reference.threads} -> {final.threads} "
          f"({final.threads - reference.threads:+d}); plugin CPU after the reference "
          f"{cpu_s:.1f} s ({1000 * cpu_s / max(changes, 1):.1f} ms per change)")
    ok = (growth_mib < args.max_rss_growth_mib
          and final.fds - reference.fds <= MAX_FD_GROWTH
          and final.threads - reference.threads <= MAX_THREAD_GROWTH and not problems)
    for problem in problems:
        print(f"  problem: {problem}")
    print(f"ListAndWatch soak over {args.duration_s:.0f} s: {'PASS' if ok else 'FAIL'}")
    what = f"{args.duration_s:,.0f} s of health changes every {args.flip_s:g} s"
    recorded = results.record(args, "deviceplugin_soak", start, [
        results.Figure(f"RSS growth after the reference, {what}", round(growth_mib, 2), "MiB",
                       results.Target("<", args.max_rss_growth_mib)),
        results.Figure("open fds growth", final.fds - reference.fds, "",
                       results.Target("<=", MAX_FD_GROWTH)),
        results.Figure("threads growth", final.threads - reference.threads, "",
                       results.Target("<=", MAX_THREAD_GROWTH)),
        results.Figure("stream problems (wrong lists, early ends, lists missing)",
                       len(problems), "", results.Target("<=", 0)),
        results.Figure("health changes", flips, ""),
        results.Figure("plugin CPU per change", round(1000 * cpu_s / max(changes, 1), 2), "ms"),
    ], problems[:5])
    return 0 if recorded.verdict == "met" and ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve-plugin"]:
        return serve_plugin(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=120.0,
                        help="how long to flap health (default: %(default)s; 3600 = the target)")
    parser.add_argument("--flip-s", type=float, default=0.5,
                        help="seconds between health changes (default: %(default)s)")
    parser.add_argument("--health-interval-s", type=float, default=0.1,
                        help="the plugin's health read interval (default: %(default)s)")
    parser.add_argument("--sample-s", type=float, default=0.0,
                        help="seconds between samples (default: a tenth of the duration)")
    parser.add_argument("--warmup-s", type=float, default=30.0,
                        help="flapping before the reference sample (default: %(default)s, at "
                             "most a quarter of the duration)")
    parser.add_argument("--max-rss-growth-mib", type=float, default=4.0,
                        help="RSS growth allowed after the reference (default: %(default)s)")
    results.add_arguments(parser, "deviceplugin_soak")
    args = parser.parse_args(argv)
    for name in ("duration_s", "flip_s", "health_interval_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    if args.sample_s <= 0:
        args.sample_s = max(args.duration_s / 10, 1.0)
    start = results.Start.now()
    with tempfile.TemporaryDirectory(prefix="dps-") as folder:
        return soak(args, Path(folder), start)


if __name__ == "__main__":
    sys.exit(main())
