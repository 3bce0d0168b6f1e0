"""List + watch of Nodes, Pods and the hints ConfigMap into a ``ClusterCache``.

One :class:`Reflector` thread per resource does what client-go's reflector does: list (in pages)
to get every object and a resourceVersion, streamed a page at a time into the cache (which drops
what the list did not have once it has read it all), then watch from that resourceVersion and
apply each event. A watch that ends (server timeout) resumes from the last resourceVersion seen
(bookmarks advance it too); a 410 Gone — the version is too old — relists; any other failure
(connection refused, 5xx, 403 while RBAC is being fixed) retries after a capped exponential
backoff with full jitter. An event the sink failed to apply is never stepped over: the watch
ends there and a full list follows (after the same backoff, so an object that fails every time
costs one list per backoff period, not a hot loop), and the failure is counted
(``on_apply_failed``): a lost bind would otherwise count its GPUs free until the next hourly
relist.

Objects travel as the API's JSON (parsed with orjson), never as the client's model classes: the
converters read JSON, and deserialising 100,000 pods into models would take minutes.

An object the cache cannot read (a request of "1e100000" or 5,000 digits GPUs: the API server
stores both) is left out of the state; :class:`SkipReporter` puts one Warning Event on it per
UID, written by a thread of its own from a small bounded queue, so a slow or failing API server
delays no watch event (when the queue is full the report is dropped and counted). It sits here,
beside the reads it reports on, rather than in ``binder`` with the binds: it is the watch's
account of what it could not read, not a scheduling decision.
"""

from __future__ import annotations

import contextlib
import functools
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import kubernetes
import orjson
import structlog

from gpufrag.conventions import KubeNames
from scheduler.kube.cache import ClusterCache
from scheduler.kube.reservations import ReservationSink
from scheduler.kube.reservations import list_call as reservations_list_call

Obj = Mapping[str, Any]
ListCall = Callable[..., Any]
HTTP_GONE = 410
# Terminal pods hold no resources; with this selector the API server also sends DELETED when a
# pod becomes terminal (it stops matching), exactly as kube-scheduler's own pod informer.
NON_TERMINAL_PODS = "status.phase!=Succeeded,status.phase!=Failed"
CONNECT_TIMEOUT_S = 10.0
LIST_READ_TIMEOUT_S = 120.0


log = structlog.get_logger("gpufrag.watch")


@dataclass(frozen=True, slots=True)
class WatchConfig:
    """List + watch of Nodes, Pods and the hints ConfigMap (the ``watch`` section of the
    extender's configuration)."""

    timeout_s: float = 60.0
    page_size: int = 500
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    # A full list again this long after the last one (0: never), when a watch ends: what the
    # watch missed (a DELETED lost to a bug anywhere between etcd and here) is dropped then,
    # instead of holding its GPUs until a restart, and counted (the cache's relist_dropped).
    relist_s: float = 3600.0


class EventSink(Protocol):
    """Where a reflector delivers objects."""

    def replace(self, objs: Iterable[Obj]) -> None: ...

    def upsert(self, obj: Obj) -> None: ...

    def delete(self, obj: Obj) -> None: ...


class NodeSink:
    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def replace(self, objs: Iterable[Obj]) -> None:
        self.cache.replace_nodes(objs)

    def upsert(self, obj: Obj) -> None:
        self.cache.apply_node(obj)

    def delete(self, obj: Obj) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str):
            self.cache.delete_node(name)


class PodSink:
    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def replace(self, objs: Iterable[Obj]) -> None:
        self.cache.replace_pods(objs)

    def upsert(self, obj: Obj) -> None:
        self.cache.apply_pod(obj)

    def delete(self, obj: Obj) -> None:
        self.cache.delete_pod_object(obj)


class ClaimSink:
    """ResourceClaims (DRA): what a pod's claims' allocations name is the GPUs it holds."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def replace(self, objs: Iterable[Obj]) -> None:
        self.cache.replace_claims(objs)

    def upsert(self, obj: Obj) -> None:
        self.cache.apply_claim(obj)

    def delete(self, obj: Obj) -> None:
        self.cache.delete_claim_object(obj)


class SliceSink:
    """The DRA driver's ResourceSlices: the GPUs of a node whose Node advertises none."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def replace(self, objs: Iterable[Obj]) -> None:
        self.cache.replace_slices(objs)

    def upsert(self, obj: Obj) -> None:
        self.cache.apply_slice(obj)

    def delete(self, obj: Obj) -> None:
        self.cache.delete_slice_object(obj)


class DeviceClassSink:
    """The DeviceClasses: which extended resources the driver's classes map (KEP-5004)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def replace(self, objs: Iterable[Obj]) -> None:
        self.cache.replace_device_classes(objs)

    def upsert(self, obj: Obj) -> None:
        self.cache.apply_device_class(obj)

    def delete(self, obj: Obj) -> None:
        self.cache.delete_device_class_object(obj)


class HintsSink:
    """The one hints ConfigMap (the list is filtered by name): absent = no hints."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def replace(self, objs: Iterable[Obj]) -> None:
        listed = list(objs)  # read to the end: the list's resourceVersion comes last
        self.cache.set_hints(listed[0] if listed else None)

    def upsert(self, obj: Obj) -> None:
        self.cache.set_hints(obj)

    def delete(self, obj: Obj) -> None:
        self.cache.set_hints(None)


class WatchError(RuntimeError):
    """The API server sent an ERROR event other than 410 Gone."""


class ApplyFailed(RuntimeError):
    """The sink failed to apply an event: the watch cannot go on past it (relist)."""


class Backoff:
    """Capped exponential backoff with full jitter: uniform(0, min(cap, base · 2^attempt))."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.max_s, self.initial_s * 2.0 ** self.attempt)
        self.attempt = min(self.attempt + 1, 62)
        return self._rng.uniform(0.0, ceiling)

    def reset(self) -> None:
        self.attempt = 0


def _resource_version(obj: Obj) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


def _lines(resp: Any) -> Iterator[bytes]:
    """The newline-delimited JSON events of a watch response, as they arrive."""
    buffer = b""
    for chunk in resp.stream(None, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


class PagedList:
    """The objects of a list call, fetched a page of ``page_size`` at a time while they are
    iterated: a relist holds one page of JSON at a time, not the whole cluster's, so the
    extender's memory after a relist of 50,000 pods stays that of its cache (a page's objects
    are converted and dropped before the next page is read). ``version`` is the list's
    resourceVersion once the last page has been read; ``count`` the objects so far. A failure
    on a later page raises from the iteration: what was applied from earlier pages is real
    (newer) state, and the caller lists again. With ``slim``, each object comes without its
    ``metadata.managedFields``: nothing here reads them, and they are over a third of a
    running pod's JSON, so a reader that keeps every object (an export, a defrag cycle)
    holds that much less."""

    def __init__(self, list_call: ListCall, page_size: int = 500, *,
                 what: str = "objects", slim: bool = False) -> None:
        self.list_call = list_call
        self.page_size = page_size
        self.what = what
        self.slim = slim
        self.version = ""
        self.count = 0

    def __iter__(self) -> Iterator[Obj]:
        token: str | None = None
        while True:
            resp = self.list_call(limit=self.page_size, _continue=token, _preload_content=False,
                                  _request_timeout=(CONNECT_TIMEOUT_S, LIST_READ_TIMEOUT_S))
            try:
                body = orjson.loads(resp.data)  # read to the end before the connection goes back
            finally:
                resp.release_conn()
            items: list[Obj] = body.get("items") or []
            meta = body.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                version = str(meta.get("resourceVersion") or "")
                if not version:
                    raise WatchError(f"{self.what} list carried no resourceVersion")
            del body
            if self.slim:
                for item in items:
                    meta = item.get("metadata")
                    if isinstance(meta, dict):
                        meta.pop("managedFields", None)
            self.count += len(items)
            yield from items
            if token is None:
                self.version = version
                return


def list_objects(list_call: ListCall, page_size: int = 500, *, what: str = "objects",
                 slim: bool = False) -> tuple[list[Obj], str]:
    """Every object a list call returns (in pages of ``page_size``), as JSON, and the list's
    resourceVersion: for callers that need them all at once (an export, a defrag cycle, a
    small node's pods); a reflector streams them (:class:`PagedList`). ``slim``: without
    their managedFields."""
    listed = PagedList(list_call, page_size, what=what, slim=slim)
    items = list(listed)
    return items, listed.version


class Reflector:
    """List, then watch, one kind of object into an :class:`EventSink`, forever."""

    def __init__(self, kind: str, list_call: ListCall, sink: EventSink, config: WatchConfig,
                 stop: threading.Event, *, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_apply_failed: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self.on_apply_failed = on_apply_failed
        self.apply_failures = 0
        self.list_call = list_call
        self.sink = sink
        self.config = config
        self.stop_event = stop
        self.backoff = Backoff(config.backoff_initial_s, config.backoff_max_s, rng)
        self.lists = 0
        self.events = 0
        self.clock = clock
        self._listed_at = 0.0
        self.errors: list[str] = []  # the last few failures, newest last
        self._resp: Any = None
        self._log = log.bind(kind=kind)

    # ------------------------------------------------------------------ one list, one watch
    def relist(self) -> str:
        """Hand the sink every object, streamed a page at a time (:class:`PagedList`);
        returns the resourceVersion to watch from."""
        listed = PagedList(self.list_call, self.config.page_size, what=self.kind)
        self.sink.replace(listed)
        if not listed.version:  # a sink that stopped reading before the end
            raise WatchError(f"{self.kind} list not read to its end")
        self.lists += 1
        self._listed_at = self.clock()
        self._log.info("listed", objects=listed.count, resource_version=listed.version)
        return listed.version

    def watch_from(self, version: str) -> str | None:
        """Apply events from ``version`` on until the server ends the watch; returns the
        version to resume from, or None when it is too old (relist)."""
        resp = self.list_call(watch=True, resource_version=version, allow_watch_bookmarks=True,
                              timeout_seconds=max(1, int(self.config.timeout_s)),
                              _preload_content=False,
                              _request_timeout=(CONNECT_TIMEOUT_S, self.config.timeout_s + 15))
        self._resp = resp
        try:
            for line in _lines(resp):
                if self.stop_event.is_set():
                    break
                event = orjson.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == HTTP_GONE:
                        return None
                    raise WatchError(f"{self.kind} watch error {code}: {obj.get('message')}")
                if not self._deliver(str(kind), obj):
                    raise ApplyFailed(f"{self.kind} {kind} event not applied: relisting")
                version = _resource_version(obj) or version
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()
        return version

    def _deliver(self, kind: str, obj: Obj) -> bool:
        """Apply one event; False when the sink failed to (logged and counted)."""
        try:
            if kind in ("ADDED", "MODIFIED"):
                self.sink.upsert(obj)
            elif kind == "DELETED":
                self.sink.delete(obj)
            else:
                return True  # BOOKMARK: only its resourceVersion matters
            self.events += 1
        except Exception:  # a bug in applying one object must not stop the watch
            self._log.exception("event not applied", event_type=kind,
                                effect="the watch ends here and a full list follows")
            self.apply_failures += 1
            if self.on_apply_failed is not None:
                self.on_apply_failed()
            return False
        return True

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        version: str | None = None
        while not self.stop_event.is_set():
            try:
                if version is None:
                    version = self.relist()
                version = self.watch_from(version)
                self.backoff.reset()
                if version is None:
                    self._log.info("watch too old; relisting")
                elif self._relist_due():
                    version = None
                    self._log.info("periodic relist", relist_s=self.config.relist_s)
            except ApplyFailed as e:
                version = None  # relist, after the backoff
                self._failed(str(e))
            except kubernetes.client.ApiException as e:
                if e.status == HTTP_GONE:
                    version = None
                    continue
                self._failed(f"HTTP {e.status} {e.reason}")
            except Exception as e:  # connection refused, reset, timeouts, bad JSON
                self._failed(repr(e))

    def _relist_due(self) -> bool:
        relist_s = self.config.relist_s
        return relist_s > 0 and self.clock() - self._listed_at >= relist_s

    @property
    def last_error(self) -> str:
        return self.errors[-1] if self.errors else ""

    def _failed(self, error: str) -> None:
        self.errors = [*self.errors[-19:], error]
        if self.stop_event.is_set():
            return
        delay = self.backoff.next_delay()
        self._log.warning("list/watch failed; retrying", error=error, retry_in_s=round(delay, 2))
        self.stop_event.wait(delay)

    def interrupt(self) -> None:
        """Close the open watch so a blocked read returns (used by stop)."""
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # already closed, or an old urllib3 without shutdown()
                with contextlib.suppress(Exception):
                    resp.close()


class ClusterWatcher:
    """The reflectors for Nodes, Pods, GPU reservations and (when enabled) the hints ConfigMap,
    and the ResourceClaims, the driver's ResourceSlices and the DeviceClasses (the cache's
    ``dra_driver``), each in a thread."""

    def __init__(self, api_client: Any, cache: ClusterCache, w: WatchConfig, *,
                 names: KubeNames, hints: bool) -> None:
        core = kubernetes.client.CoreV1Api(api_client)
        self.stop_event = threading.Event()
        def counted(kind: str) -> Callable[[], None]:
            return functools.partial(cache.count_apply_failure, kind)

        self.reflectors = [
            Reflector("nodes", core.list_node, NodeSink(cache), w, self.stop_event,
                      on_apply_failed=counted("nodes")),
            Reflector("pods", functools.partial(core.list_pod_for_all_namespaces,
                                                field_selector=NON_TERMINAL_PODS),
                      PodSink(cache), w, self.stop_event, on_apply_failed=counted("pods")),
            # GPU reservations of defrag replacements, in the hints' namespace.
            Reflector("reservations", reservations_list_call(api_client, names.hints_namespace),
                      ReservationSink(cache.reservations, cache.lock), w, self.stop_event,
                      on_apply_failed=counted("reservations")),
        ]
        if hints:
            self.reflectors.append(Reflector(
                "hints", functools.partial(core.list_namespaced_config_map, names.hints_namespace,
                                           field_selector=f"metadata.name={names.hints_configmap}"),
                HintsSink(cache), w, self.stop_event, on_apply_failed=counted("hints")))
        if cache.dra_driver:
            resource = kubernetes.client.ResourceV1Api(api_client)
            self.reflectors.append(Reflector(
                "resourceclaims", resource.list_resource_claim_for_all_namespaces,
                ClaimSink(cache), w, self.stop_event, on_apply_failed=counted("resourceclaims")))
            self.reflectors.append(Reflector(
                "resourceslices", functools.partial(
                    resource.list_resource_slice, field_selector=f"spec.driver={cache.dra_driver}"),
                SliceSink(cache), w, self.stop_event, on_apply_failed=counted("resourceslices")))
            self.reflectors.append(Reflector(
                "deviceclasses", resource.list_device_class, DeviceClassSink(cache), w,
                self.stop_event, on_apply_failed=counted("deviceclasses")))
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for reflector in self.reflectors:
            thread = threading.Thread(target=reflector.run, name=f"watch-{reflector.kind}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stop_event.set()
        for reflector in self.reflectors:
            reflector.interrupt()
        for thread in self._threads:
            thread.join(timeout_s)


__all__ = ["ApplyFailed", "Backoff", "ClaimSink", "ClusterWatcher", "EventSink", "PagedList",
           "Reflector", "SliceSink", "WatchConfig", "WatchError", "list_objects"]
