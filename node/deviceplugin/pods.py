"""The pods on this node that ask for GPUs: a watch-fed cache, read by every Allocate.

Allocate must answer in milliseconds with hundreds of pods on the node, so it never lists pods
itself on the hot path: one :class:`~scheduler.kube.watch.Reflector` (the extender's own list +
watch loop, with its backoff and relist on 410) keeps :class:`NodePods` current, and each pod is
parsed into a :class:`~node.deviceplugin.matching.PodAsk` once per version, on the watch
thread. A pod bound moments ago may not have reached the cache when the kubelet calls; then
:meth:`NodePods.relist` (one list, ``fieldSelector=spec.nodeName``) is the fallback, at most
once per call.

The plugin's one read: ``list`` and ``watch`` on ``pods`` with that field selector.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kubernetes
import structlog

from gpufrag.conventions import KubeNames
from node.deviceplugin.matching import PodAsk, pod_ask
from scheduler.kube.watch import NON_TERMINAL_PODS, Reflector, WatchConfig, list_objects

Obj = Mapping[str, Any]
log = structlog.get_logger("gpufrag.deviceplugin.pods")


class NodePods:
    """UID -> :class:`PodAsk` for the pods that ask for GPUs (an ``EventSink``)."""

    def __init__(self, names: KubeNames, *, annotation_allocated: str,
                 on_gone: Callable[[str], None] | None = None) -> None:
        self._names = names
        self._annotation = annotation_allocated
        self._on_gone = on_gone
        self._lock = threading.Lock()
        self._pods: dict[str, PodAsk] = {}
        self.synced = threading.Event()

    def _parse(self, obj: Obj) -> PodAsk | None:
        try:
            return pod_ask(obj, self._names, annotation_allocated=self._annotation)
        except Exception:  # one unreadable pod must not stop the cache
            log.exception("pod_unreadable", pod=str((obj.get("metadata") or {}).get("name")))
            return None

    def asks(self) -> list[PodAsk]:
        with self._lock:
            return list(self._pods.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)

    # -- EventSink ------------------------------------------------------------------------------
    def replace(self, objs: Iterable[Obj]) -> None:
        parsed = {ask.uid: ask for ask in map(self._parse, objs) if ask is not None}
        with self._lock:
            gone = set(self._pods) - set(parsed)
            self._pods = parsed
        for uid in gone:
            self._gone(uid)
        self.synced.set()

    def upsert(self, obj: Obj) -> None:
        ask = self._parse(obj)
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        with self._lock:
            if ask is None:
                self._pods.pop(uid, None)
            else:
                self._pods[ask.uid] = ask

    def delete(self, obj: Obj) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        with self._lock:
            self._pods.pop(uid, None)
        self._gone(uid)

    def _gone(self, uid: str) -> None:
        if self._on_gone is not None and uid:
            self._on_gone(uid)


class KubeNodePods:
    """:class:`NodePods` fed by list + watch of the pods on ``node_name``."""

    def __init__(self, api_client: Any, node_name: str, pods: NodePods,
                 watch: WatchConfig | None = None) -> None:
        core = kubernetes.client.CoreV1Api(api_client)
        selector = f"spec.nodeName={node_name},{NON_TERMINAL_PODS}"
        self._list = functools.partial(core.list_pod_for_all_namespaces,
                                       field_selector=selector)
        self.pods = pods
        self._config = watch or WatchConfig()
        self._stop = threading.Event()
        self._reflector = Reflector("pods", self._list, pods, self._config, self._stop)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._reflector.run, name="watch-node-pods",
                                        daemon=True)
        self._thread.start()

    def asks(self) -> list[PodAsk]:
        return self.pods.asks()

    def relist(self) -> None:
        """List now and replace the cache (the fallback when a call finds no candidate)."""
        objs, _ = list_objects(self._list, self._config.page_size, what="pods")
        self.pods.replace(objs)

    @property
    def last_error(self) -> str:
        return self._reflector.last_error

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._reflector.interrupt()
        if self._thread is not None:
            self._thread.join(timeout_s)
