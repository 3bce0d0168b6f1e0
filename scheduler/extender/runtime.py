"""A ready-to-serve extender: the cache, the extender, its app, and the threads that keep the
state current (the watch and the writer of Events about unreadable objects, or nothing for a
snapshot; the maintenance loop either way).

Built first, then started (``start()``) by the server once its ports are had
(:mod:`scheduler.extender.server`), so a port in use fails the start before any watch runs.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog
from flask import Flask

from gpufrag.metrics import new_registry
from gpufrag.records import RecordSigner
from scheduler.extender.app import create_app
from scheduler.extender.config import ExtenderConfig
from scheduler.extender.extender import Extender
from scheduler.extender.metrics import ExtenderMetrics, SkipEventCollector
from scheduler.extender.migscoring import agent_mig
from scheduler.kube.binder import Binder, DryRunBinder, KubeBinder, KubeEventWriter
from scheduler.kube.cache import ClusterCache
from scheduler.kube.convert import key_of
from scheduler.kube.recordkeys import SignerBootstrap
from scheduler.kube.skipreport import SkipReporter
from scheduler.kube.snapshot import Snapshot
from scheduler.kube.watch import ClusterWatcher

Clock = Callable[[], float]

log = structlog.get_logger("gpufrag.extender")


class Runtime:
    def __init__(self, config: ExtenderConfig, cache: ClusterCache, extender: Extender,
                 watcher: ClusterWatcher | None = None, *,
                 reporter: SkipReporter | None = None) -> None:
        self.config = config
        self.cache = cache
        self.extender = extender
        self.watcher = watcher
        self.reporter = reporter
        self.registry = new_registry()
        self.metrics = ExtenderMetrics(extender, self.registry)
        self.app: Flask = create_app(extender, metrics=self.metrics)
        if reporter is not None:
            self.registry.register(SkipEventCollector(reporter))
        self.clients: list[Any] = []  # API clients this runtime made, closed by stop()
        self.record_key: SignerBootstrap | None = None  # gets the GPU-record signing key
        self._stop = threading.Event()
        self._maintainer: threading.Thread | None = None

    def start(self) -> None:
        if self.reporter is not None:
            self.reporter.start()  # before the watch: its first list may already skip objects
        if self.watcher is not None:
            self.watcher.start()
        if self.record_key is not None:
            self.record_key.start()
        self._maintainer = threading.Thread(target=self._maintain, name="maintenance",
                                            daemon=True)
        self._maintainer.start()

    def _maintain(self) -> None:
        while not self._stop.wait(self.config.maintenance_interval_s):
            try:
                self.extender.maintain()
            except Exception:  # upkeep must go on; the next round may succeed
                log.exception("maintenance failed")

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self.watcher is not None:
            self.watcher.stop(timeout_s)
        if self.reporter is not None:
            self.reporter.stop(timeout_s)
        if self.record_key is not None:
            self.record_key.stop(timeout_s)
        if self._maintainer is not None:
            self._maintainer.join(timeout_s)
        for client in self.clients:
            client.close()


def freeze_heap() -> None:
    """Collect once, then move every object alive into the collector's permanent generation
    (``gc.freeze``): the server's last step before it turns ready.

    A full collection walks every object the collector tracks, and the cluster cache holds
    hundreds of thousands (the pods' and nodes' JSON); at 5,000 nodes and 23,000 pods one took
    127 ms inside a filter call, which kube-scheduler sees as that pod's latency (and, past
    ``httpTimeout``, as a failed call). Frozen objects are never walked again: later full
    collections walk only what was made since (the watch's newer objects), a few ms. Frozen
    objects are still freed when their last reference goes; only a reference cycle that was
    already alive here and turns into garbage later is never collected. What is alive at
    this point is the loaded state, the modules and the compiled kernel, none of it cyclic
    garbage in waiting, so that costs nothing in practice.
    """
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("heap frozen", objects=gc.get_freeze_count(),
             seconds=round(time.perf_counter() - started, 3))


def _cache(config: ExtenderConfig, clock: Clock) -> ClusterCache:
    return ClusterCache(config.names, clock=clock, assume_ttl_s=config.bind.assume_ttl_s,
                        mig_reader=agent_mig,
                        dra_driver=config.dra.driver if config.dra.enabled else "",
                        dra_classes=config.dra.device_classes)


def snapshot_runtime(snapshot: Snapshot, config: ExtenderConfig, *, clock: Clock = time.time,
                     binder: Binder | None = None,
                     on_ready: Callable[[], None] | None = None) -> Runtime:
    """Serve a static snapshot. Binds are dry runs unless ``binder`` is given; unreadable
    objects are logged and counted but get no Event (there is no API server to write to).
    ``on_ready``: called once, just before the extender turns ready (the server passes
    :func:`freeze_heap`)."""
    # No watch feeds a snapshot: a filter has nothing to wait for (filter.await_watch_s).
    config = replace(config, filter=replace(config.filter, await_watch_s=0.0))
    cache = _cache(config, clock)
    hints = snapshot.configmap(config.names.hints_namespace, config.names.hints_configmap)
    cache.load(snapshot.nodes, snapshot.pods, hints if config.hints.enabled else None)
    if binder is None and config.bind.enabled:
        binder = DryRunBinder({key_of(p): p for p in snapshot.pods})
    extender = Extender(cache, config, binder=binder if config.bind.enabled else None,
                        clock=clock, on_ready=on_ready)
    extender.maintain()  # synced already: settle the target workload now
    return Runtime(config, cache, extender)


def cluster_runtime(new_api_client: Callable[[], Any], config: ExtenderConfig, *,
                    clock: Clock = time.time,
                    on_ready: Callable[[], None] | None = None) -> Runtime:
    """Serve a live cluster (list + watch; binds write to it); ``new_api_client`` makes a
    ``kubernetes.client.ApiClient``, closed again by ``Runtime.stop``. ``on_ready`` as for
    :func:`snapshot_runtime` (here it runs in the maintenance thread, after the first sync).

    The watches and the binder get clients (connection pools) of their own: a watch holds a
    connection for the length of its stream, and binds should neither queue behind the watches
    for a connection nor share one with them. (Binds once failed with ``BadStatusLine``: a
    raw response handed back to the pool unread, fixed in ``binder._body``; separate pools keep
    the two paths independent all the same.)

    Events about unreadable objects get a client of their own too: a slow Event write should
    hold neither a bind nor a watch.
    """
    cache = _cache(config, clock)
    watch_client = new_api_client()
    bind_client = new_api_client() if config.bind.enabled else None
    event_client = new_api_client()
    # One bind connection per request thread: no bind waits for, or opens, a connection.
    binder = (KubeBinder(bind_client, config.names, pool_size=config.server.threads)
              if bind_client is not None else None)
    reporter = SkipReporter(KubeEventWriter(event_client), instance=socket.gethostname(),
                            clock=clock)
    cache.on_skip = reporter.report
    cache.on_warning = reporter.report
    cache.bypass.on_bypass = reporter.report
    cache.reservations.on_refused = reporter.report
    extender = Extender(cache, config, binder=binder, clock=clock, on_ready=on_ready)
    runtime = Runtime(config, cache, extender, ClusterWatcher(
        watch_client, cache, config.watch, names=config.names, hints=config.hints.enabled),
        reporter=reporter)
    runtime.clients = [c for c in (watch_client, bind_client, event_client) if c is not None]
    if bind_client is not None and config.names.device_plugin == "gpufrag":
        # gpufrag's device plugin honours a GPU record only with the extender's signature.
        def use(signer: RecordSigner) -> None:
            extender.bind.signer = signer

        extender.bind.signing_required = True

        runtime.record_key = SignerBootstrap(new_api_client, config.names, use)
    return runtime


__all__ = ["Runtime", "cluster_runtime", "freeze_heap", "snapshot_runtime"]
