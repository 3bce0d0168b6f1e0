"""What the demo learns about its components: only what the Kubernetes API shows.

Every component runs as in a cluster, as its own ``gpufrag <command>`` process, so the demo
watches the cluster the way an operator with ``kubectl`` would, and reads no component's log or
output:

- **pods** of the demo namespace, listed and then watched: where each is bound
  (``spec.nodeName``), on which GPUs (the annotation the extender's binder writes,
  :attr:`~gpufrag.conventions.KubeNames.annotation_gpu_indices`, read with
  :func:`scheduler.kube.convert.bound_gpus`), its controlling owner, and whether it was
  **evicted**: the API server marks a pod it evicts with the condition ``DisruptionTarget``,
  reason ``EvictionByEvictionAPI``, before deleting it;
- the **placement hints** ConfigMap, watched: the defrag controller writes a hint before each
  eviction and removes it once the replacement is bound, so only a watch sees every hint;
- **Scheduled Events** (``events.k8s.io``) of gpufrag-scheduler: which pods the scheduler
  placed, and in which order (``eventTime``).

The agent's published usage is the fourth source, read straight off the Nodes by the run
(:mod:`devkit.demo.run`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import kubernetes
import orjson

from devkit.procs import close_client
from gpufrag.conventions import DEFAULT_NAMES, KubeNames, hints_from_configmap
from gpufrag.errors import BadInput
from scheduler.kube.convert import bound_gpus, key_of, labels_of, node_name_of, owner_uid, uid_of

EVICTED_CONDITION: Final = ("DisruptionTarget", "EvictionByEvictionAPI")  # (type, reason)
WATCH_S: Final = 2  # server-side timeout of one watch call: bounds how long stop() waits

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SeenPod:
    """One pod of the demo namespace as the watch last saw it. ``seen_at`` and ``evicted_at``
    are positions in the watch's own order of events (the API server's order for one
    resource), not clock times."""

    uid: str
    key: str  # namespace/name
    app: str  # the pod's "app" label ('' for the batch pods)
    owner_uid: str  # the controlling owner (a ReplicaSet); '' for a bare pod
    node: str  # '' until bound
    gpus: tuple[int, ...]  # () until the binder has recorded them
    seen_at: int
    evicted_at: int | None = None
    deleted: bool = False

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[-1]

    @property
    def live(self) -> bool:
        return not self.deleted and self.evicted_at is None


@dataclass(frozen=True, slots=True)
class SeenHint:
    """One placement hint the defrag controller wrote (owner UID -> node, until ``expires``)."""

    owner_uid: str
    node: str
    expires: float
    seen_at: int


@dataclass(frozen=True, slots=True)
class Scheduled:
    """One ``Scheduled`` Event: the scheduler bound ``pod_uid``; ``at`` is its eventTime
    (RFC 3339 with microseconds, so it sorts as text)."""

    pod_uid: str
    pod: str
    at: str


@dataclass(frozen=True, slots=True)
class ObservedMove:
    """One move of the defrag cycle, as the cluster shows it: the pod evicted, the node(s)
    hinted for its owner, and its owner's replacement (None until the watch has seen one)."""

    evicted: SeenPod
    hinted: tuple[str, ...]
    replacement: SeenPod | None

    @property
    def landed_on(self) -> str:
        return self.replacement.node if self.replacement is not None else ""

    @property
    def on_hint(self) -> bool:
        return bool(self.landed_on) and self.landed_on in self.hinted


class _Watch:
    """``list`` then ``watch`` from the list's resourceVersion, in a thread, until stopped.

    Each object reaches ``on_object(event_type, object)`` as the API's JSON (a dict), in the
    order the API server sends them; the initial list arrives as ``ADDED`` with ``relist``
    True, and after a relist (the watch expired: 410) ``on_relisted`` gets the UIDs listed so
    objects deleted in the gap can be marked. Errors are kept in :attr:`errors`, not raised:
    the thread must outlive a slow API server, and the demo reports them if it times out.
    """

    def __init__(self, name: str, list_call: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: Mapping[str, Any], on_object: Callable[[str, Obj], None],
                 on_relisted: Callable[[set[str]], None]) -> None:
        self.name = name
        self._list_call = list_call
        self._args = args
        self._kwargs = dict(kwargs)
        self._on_object = on_object
        self._on_relisted = on_relisted
        self._stop = threading.Event()
        self.listed = threading.Event()  # set once the first list has been handled
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"demo-watch-{name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list()
                    self.listed.set()
                watch_class: Any = kubernetes.watch.Watch  # the watch module carries no hints
                for event in watch_class().stream(self._list_call, *self._args,
                                          resource_version=resource_version,
                                          timeout_seconds=WATCH_S, allow_watch_bookmarks=True,
                                          _request_timeout=WATCH_S + 10, **self._kwargs):
                    raw = event.get("raw_object")
                    if not isinstance(raw, Mapping):
                        continue
                    version = (raw.get("metadata") or {}).get("resourceVersion")
                    if version:
                        resource_version = str(version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._on_object(str(event["type"]), raw)
                    if self._stop.is_set():
                        break
            except kubernetes.client.ApiException as e:
                if e.status == 410:  # the watch expired: start over from a fresh list
                    resource_version = None
                else:
                    self._note(f"HTTP {e.status} {e.reason}")
                    self._stop.wait(0.5)
            except Exception as e:  # connection reset while the API server is busy, etc.
                if self._stop.is_set():
                    break
                self._note(repr(e))
                self._stop.wait(0.5)

    def _list(self) -> str:
        answer = self._list_call(*self._args, _preload_content=False, _request_timeout=10,
                                 **self._kwargs)
        doc = orjson.loads(answer.data)
        items = doc.get("items") or []
        for item in items:
            self._on_object("ADDED", item)
        self._on_relisted({uid_of(item) for item in items})
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def _note(self, message: str) -> None:
        self.errors = [*self.errors[-9:], f"{self.name} watch: {message}"]


class ClusterObserver:
    """The demo's one view of its namespace: pods (evictions included) and placement hints,
    watched from :meth:`start` to :meth:`stop`, and the scheduler's Scheduled Events, listed
    on demand. Every accessor returns copies, so the main thread never sees a half-update."""

    def __init__(self, api_client: kubernetes.client.ApiClient, namespace: str, *,
                 names: KubeNames = DEFAULT_NAMES) -> None:
        # Its own client: a watch holds a connection for seconds at a time.
        self._api_client = api_client
        self.namespace = namespace
        self.names = names
        core: Any = kubernetes.client.CoreV1Api(api_client)
        self._events: Any = kubernetes.client.EventsV1Api(api_client)
        self._lock = threading.Lock()
        self._seq = 0
        self._pods: dict[str, SeenPod] = {}
        self._hints: dict[tuple[str, str, float], SeenHint] = {}
        self._watches = [
            _Watch("pods", core.list_namespaced_pod, (namespace,), {}, self.on_pod,
                   self._pods_relisted),
            _Watch("placement hints", core.list_namespaced_config_map,
                   (names.hints_namespace,),
                   {"field_selector": f"metadata.name={names.hints_configmap}"},
                   self.on_hints, lambda _uids: None),
        ]

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> ClusterObserver:
        """Start both watches; returns once both have listed, so nothing later is missed."""
        for watch in self._watches:
            watch.start()
        for watch in self._watches:
            if not watch.listed.wait(timeout_s):
                self.stop()
                raise TimeoutError(f"the {watch.name} list did not answer within "
                                   f"{timeout_s:g}s: {'; '.join(watch.errors) or 'no error'}")
        return self

    def stop(self) -> None:
        for watch in self._watches:
            watch.stop()
        close_client(self._api_client)

    @property
    def errors(self) -> list[str]:
        return [e for watch in self._watches for e in watch.errors]

    # -- what the watches saw ----------------------------------------------------------------

    def mark(self) -> int:
        """The position of the latest event seen: "everything after this" for a later query."""
        with self._lock:
            return self._seq

    def pods(self) -> list[SeenPod]:
        """Every pod seen, in the order first seen (deleted and evicted ones included)."""
        with self._lock:
            return sorted(self._pods.values(), key=lambda p: p.seen_at)

    def pod(self, uid: str) -> SeenPod | None:
        with self._lock:
            return self._pods.get(uid)

    def hints(self, since: int = 0) -> list[SeenHint]:
        """Every distinct hint first seen after ``since``, in the order seen."""
        with self._lock:
            found = [h for h in self._hints.values() if h.seen_at > since]
        return sorted(found, key=lambda h: h.seen_at)

    def moves(self, since: int) -> list[ObservedMove]:
        """The evictions after ``since``, each with its owner's hints and replacement.

        Per owner, the k-th eviction is paired with the k-th hint written for that owner and
        the k-th new pod of that owner seen after it (the controller moves a pod at a time and
        waits for its replacement). The hints come from another watch, so their order against
        the pods' is not known; the pairing does not need it.
        """
        pods = self.pods()
        hints = self.hints(since)
        evicted = sorted((p for p in pods if p.evicted_at is not None and p.evicted_at > since),
                         key=lambda p: p.evicted_at or 0)
        moves = []
        taken: set[str] = set()
        count: dict[str, int] = {}
        for pod in evicted:
            k = count.get(pod.owner_uid, 0)
            count[pod.owner_uid] = k + 1
            owner_hints = [h.node for h in hints if h.owner_uid == pod.owner_uid]
            hinted = (owner_hints[k],) if k < len(owner_hints) else tuple(owner_hints)
            assert pod.evicted_at is not None
            fresh = [p for p in pods if p.owner_uid == pod.owner_uid and p.owner_uid
                     and p.seen_at > pod.evicted_at and p.uid not in taken]
            replacement = fresh[0] if fresh else None
            if replacement is not None:
                taken.add(replacement.uid)
            moves.append(ObservedMove(pod, hinted, replacement))
        return moves

    def scheduled(self, scheduler_name: str | None = None) -> list[Scheduled]:
        """The ``Scheduled`` Events of ``scheduler_name`` (default: gpufrag-scheduler) in
        this namespace, oldest first: the pods that scheduler bound, in bind order."""
        reporter = scheduler_name or self.names.scheduler_name
        answer = self._events.list_namespaced_event(self.namespace, _preload_content=False,
                                                    _request_timeout=10)
        found = []
        for event in orjson.loads(answer.data).get("items") or []:
            regarding = event.get("regarding") or {}
            if (event.get("reason") == "Scheduled" and event.get("reportingController") == reporter
                    and regarding.get("kind") == "Pod" and regarding.get("uid")):
                found.append(Scheduled(str(regarding["uid"]),
                                       f"{regarding.get('namespace')}/{regarding.get('name')}",
                                       str(event.get("eventTime") or "")))
        return sorted(found, key=lambda s: (s.at, s.pod))

    # -- the watches' handlers (called on their threads; tests feed them objects directly) ---

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def on_pod(self, event_type: str, obj: Obj) -> None:
        """One pod event (``ADDED``, ``MODIFIED``, ``DELETED``) as the API's JSON."""
        uid = uid_of(obj)
        if not uid:
            return
        try:
            key, labels, owner = key_of(obj), labels_of(obj), owner_uid(obj)
            node, gpus = node_name_of(obj), bound_gpus(obj, self.names) or ()
        except BadInput:
            return  # not a pod the demo made; the demo's own pods always read
        evicted = _evicted(obj)
        with self._lock:
            seq = self._next()
            old = self._pods.get(uid)
            if old is None:
                old = SeenPod(uid, key, labels.get("app", ""), owner, node, gpus, seen_at=seq)
            self._pods[uid] = replace(
                old, node=node or old.node, gpus=gpus or old.gpus,
                evicted_at=old.evicted_at if old.evicted_at is not None or not evicted else seq,
                deleted=old.deleted or event_type == "DELETED")

    def _pods_relisted(self, uids: set[str]) -> None:
        with self._lock:  # gone while the watch was down: deleted, eviction unknown
            for uid, pod in list(self._pods.items()):
                if uid not in uids and not pod.deleted:
                    self._pods[uid] = replace(pod, deleted=True)

    def on_hints(self, event_type: str, obj: Obj) -> None:
        """One event of the hints ConfigMap; each new (owner, node, expires) entry is a hint."""
        if event_type == "DELETED":
            return
        hints, _problems = hints_from_configmap(obj)  # the extender's own reader
        with self._lock:
            for owner, entries in hints.by_owner.items():
                for node, expires in entries:
                    if (owner, node, expires) not in self._hints:
                        self._hints[(owner, node, expires)] = SeenHint(owner, node, expires,
                                                                       self._next())


def _evicted(obj: Obj) -> bool:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and (
                condition.get("type"), condition.get("reason")) == EVICTED_CONDITION:
            return True
    return False
