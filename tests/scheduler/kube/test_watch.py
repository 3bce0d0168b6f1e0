"""The reflector's list + watch loop, driven by a scripted list call (the same keyword calls it
makes on ``CoreV1Api``): paging, resuming from the last resourceVersion, relisting on 410 Gone
(as an ERROR event or an HTTP status), and backing off on other failures. Its behaviour against
a real API server is tested in tests/e2e/test_extender_watch.py."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import orjson
import pytest

from gpufrag.conventions import DEFAULT_NAMES
from scheduler.extender.config import WatchConfig
from scheduler.kube.cache import ClusterCache
from scheduler.kube.convert import node_to_k8s, pod_to_k8s
from scheduler.kube.skipreport import (
    SkipReporter,
)
from scheduler.kube.watch import Backoff, ClusterWatcher, PodSink, Reflector, list_objects
from tests.builders import node, pod


class FakeResponse:
    def __init__(self, data: bytes = b"", chunks: tuple[bytes, ...] = ()) -> None:
        self.data = data
        self.chunks = chunks
        self.closed = False

    def stream(self, amt: Any = None, decode_content: bool = True) -> Iterator[bytes]:
        yield from self.chunks

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def shutdown(self) -> None:
        self.closed = True


def listing(names: list[str], version: str = "", token: str = "") -> FakeResponse:
    meta = {"resourceVersion": version, **({"continue": token} if token else {})}
    return FakeResponse(orjson.dumps({"metadata": meta, "items": [obj(n, version)
                                                                  for n in names]}))


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


def event(kind: str, name: str, version: str) -> bytes:
    return orjson.dumps({"type": kind, "object": obj(name, version)}) + b"\n"


class Script:
    """Answers each call with the next step (a response, or an exception to raise); when the
    script runs out it stops the reflector."""

    def __init__(self, steps: list[Any], stop: threading.Event) -> None:
        self.steps = steps
        self.stop = stop
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if not self.steps:
            self.stop.set()
            raise ConnectionError("script finished")
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step


class RecordingSink:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def replace(self, objs: list[Any]) -> None:
        self.seen.append(("replace", [o["metadata"]["name"] for o in objs]))

    def upsert(self, o: Any) -> None:
        self.seen.append(("upsert", o["metadata"]["name"]))

    def delete(self, o: Any) -> None:
        self.seen.append(("delete", o["metadata"]["name"]))


def test_list_watch_resume_relist_and_backoff() -> None:
    stop = threading.Event()
    added = event("ADDED", "n3", "11")
    script = Script([
        listing(["n1"], token="page-2"),
        listing(["n2"], version="10"),
        # One event split across chunks; a bookmark only moves the version on.
        FakeResponse(chunks=(added[:9], added[9:] + event("MODIFIED", "n1", "12"),
                             event("DELETED", "n2", "13") + event("BOOKMARK", "", "14"))),
        FakeResponse(chunks=(orjson.dumps({"type": "ERROR", "object": {
            "kind": "Status", "code": 410, "message": "too old resource version"}}) + b"\n",)),
        listing(["n1"], version="20"),
        kubernetes.client.ApiException(status=410, reason="Gone"),
        listing(["n1", "n4"], version="30"),
        kubernetes.client.ApiException(status=500, reason="Internal Server Error"),
        ConnectionResetError("reset by peer"),
        FakeResponse(chunks=(event("ADDED", "n5", "31"),)),
    ], stop)
    sink = RecordingSink()
    config = WatchConfig(timeout_s=5, page_size=2, backoff_initial_s=0.001, backoff_max_s=0.002)
    reflector = Reflector("nodes", script, sink, config, stop, rng=random.Random(1))
    reflector.run()

    assert sink.seen == [
        ("replace", ["n1", "n2"]),
        ("upsert", "n3"), ("upsert", "n1"), ("delete", "n2"),
        ("replace", ["n1"]),                       # after the 410 ERROR event
        ("replace", ["n1", "n4"]),                 # after the HTTP 410
        ("upsert", "n5"),                          # after two failures and backoffs
    ]
    lists = [c for c in script.calls if not c.get("watch")]
    watches = [c for c in script.calls if c.get("watch")]
    assert [(c["limit"], c["_continue"]) for c in lists] == [
        (2, None), (2, "page-2"), (2, None), (2, None)]
    assert [c["resource_version"] for c in watches] == ["10", "14", "20", "30", "30", "30", "31"]
    assert all(c["allow_watch_bookmarks"] and c["timeout_seconds"] == 5 for c in watches)
    assert reflector.lists == 3 and reflector.events == 4
    assert reflector.last_error == "ConnectionError('script finished')"


def test_a_periodic_relist_follows_a_watch_that_ends_after_relist_s() -> None:
    stop = threading.Event()
    now = [0.0]
    script = Script([
        listing(["n1", "n2"], version="10"),
        FakeResponse(chunks=(event("ADDED", "n3", "11"),)),  # ends at 100 s: not due yet
        FakeResponse(chunks=(event("MODIFIED", "n3", "12"),)),  # ends at 200 s: relist due
        listing(["n1", "n3"], version="20"),  # n2's DELETED was never delivered
        FakeResponse(chunks=()),
    ], stop)
    sink = RecordingSink()

    def timed(**kwargs: Any) -> Any:
        """The script, where each watch takes 100 s of the fake clock."""
        if kwargs.get("watch"):
            now[0] += 100.0
        return script(**kwargs)

    config = WatchConfig(timeout_s=60, relist_s=150, backoff_initial_s=0.001,
                         backoff_max_s=0.001)
    reflector = Reflector("nodes", timed, sink, config, stop, clock=lambda: now[0])
    reflector.run()
    assert sink.seen == [("replace", ["n1", "n2"]), ("upsert", "n3"), ("upsert", "n3"),
                         ("replace", ["n1", "n3"])]
    assert reflector.lists == 2
    watches = [c["resource_version"] for c in script.calls if c.get("watch")]
    assert watches[:3] == ["10", "11", "20"]  # then the call the finished script refuses


def test_relist_s_zero_never_relists_on_its_own() -> None:
    stop = threading.Event()
    script = Script([listing(["n1"], version="10"), FakeResponse(chunks=()),
                     FakeResponse(chunks=())], stop)
    reflector = Reflector("nodes", script, RecordingSink(), WatchConfig(
        relist_s=0, backoff_initial_s=0.001, backoff_max_s=0.001), stop,
        clock=lambda: 1e12)
    reflector.run()
    assert reflector.lists == 1


def test_a_list_without_resource_version_is_an_error() -> None:
    stop = threading.Event()
    script = Script([listing(["n1"], version="")], stop)
    reflector = Reflector("nodes", script, RecordingSink(),
                          WatchConfig(backoff_initial_s=0.001, backoff_max_s=0.001), stop)
    reflector.run()
    assert reflector.errors[0] == "WatchError('nodes list carried no resourceVersion')"


def test_a_relist_streams_each_page_to_the_sink_before_reading_the_next() -> None:
    """The sink sees a page's objects while later pages are still unread: a relist holds one
    page of JSON, not the cluster's. A failure on a later page keeps what earlier pages
    applied (newer state), drops nothing the list did not reach, and lists again."""
    stop = threading.Event()
    script = Script([
        listing(["n1", "n2"], token="p2"), listing(["n3"], token="p3"),
        ConnectionResetError("reset mid-list"),
        listing(["n1"], token="p2"), listing(["n3"], version="7"),
    ], stop)
    calls_when_seen: list[tuple[str, int]] = []

    class Watching(RecordingSink):
        def replace(self, objs: Any) -> None:
            names = []
            for o in objs:
                calls_when_seen.append((o["metadata"]["name"], len(script.calls)))
                names.append(o["metadata"]["name"])
            self.seen.append(("replace", names))

    sink = Watching()
    reflector = Reflector("nodes", script, sink, WatchConfig(
        page_size=2, backoff_initial_s=0.001, backoff_max_s=0.001), stop)
    reflector.run()
    # n1 and n2 arrived after the first call only; n3 after the second.
    assert calls_when_seen[:3] == [("n1", 1), ("n2", 1), ("n3", 2)]
    assert sink.seen == [("replace", ["n1", "n3"])]  # the failed list never completed
    assert reflector.errors[0] == "ConnectionResetError('reset mid-list')"
    assert reflector.lists == 1
    assert [c.get("resource_version") for c in script.calls if c.get("watch")] == ["7"]


def test_a_failed_relist_keeps_the_cache_and_the_next_one_drops_what_is_gone() -> None:
    """On a real cache: the pages a failed relist applied stay (and nothing is dropped, since
    the list did not finish); the next complete list drops the node no page had."""
    stop = threading.Event()

    def nodes_page(names: list[str], version: str = "", token: str = "") -> FakeResponse:
        meta = {"resourceVersion": version, **({"continue": token} if token else {})}
        return FakeResponse(orjson.dumps({"metadata": meta, "items": [
            node_to_k8s(node(n)) for n in names]}))

    cache = ClusterCache()
    cache.replace_nodes([node_to_k8s(node(n)) for n in ("a", "b", "c")])
    script = Script([nodes_page(["a"], token="p2"), ConnectionResetError("reset"),
                     nodes_page(["a"], token="p2"), nodes_page(["b"], version="9")], stop)
    from_cache: list[list[str]] = []

    class Sink:
        def replace(self, objs: Any) -> None:
            try:
                cache.replace_nodes(objs)
            finally:
                from_cache.append(sorted(cache.state.index))

        def upsert(self, o: Any) -> None: ...

        def delete(self, o: Any) -> None: ...

    Reflector("nodes", script, Sink(), WatchConfig(
        page_size=1, backoff_initial_s=0.001, backoff_max_s=0.001), stop).run()
    active = [cache.state.names[int(r)] for r in cache.state.active_rows()]
    assert from_cache[0] == ["a", "b", "c"]  # the failed list dropped nothing
    assert sorted(active) == ["a", "b"] and cache.relist_dropped["node"] == 1


def test_a_slim_list_drops_managed_fields_and_nothing_else() -> None:
    fields = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    body = {"metadata": {"resourceVersion": "5"}, "items": [
        {"metadata": {"name": "a", "managedFields": fields, "labels": {"x": "1"}},
         "spec": {"nodeName": "n"}}, {"metadata": None}]}
    stop = threading.Event()
    kept, version = list_objects(Script([FakeResponse(orjson.dumps(body))], stop))
    slim, _ = list_objects(Script([FakeResponse(orjson.dumps(body))], stop), slim=True)
    assert version == "5" and kept[0]["metadata"]["managedFields"] == fields
    assert slim == [{"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"nodeName": "n"}},
                    {"metadata": None}]


def test_an_event_that_fails_to_apply_is_not_stepped_over_a_relist_follows() -> None:
    """A lost bind must not count its GPUs free until the hourly relist: the watch ends at
    the event it could not apply, and a full list (after the backoff) brings the object back;
    the failure is counted."""
    stop = threading.Event()

    class Fussy(RecordingSink):
        def upsert(self, o: Any) -> None:
            if o["metadata"]["name"] == "bad":
                raise RuntimeError("bug")
            super().upsert(o)

    script = Script([listing([], version="1"), FakeResponse(chunks=(
        event("ADDED", "bad", "2"), event("ADDED", "good", "3"))),
        listing(["bad", "good"], version="4")], stop)
    sink = Fussy()
    failures: list[str] = []
    reflector = Reflector("pods", script, sink, WatchConfig(backoff_initial_s=0.001,
                                                            backoff_max_s=0.001), stop,
                          on_apply_failed=lambda: failures.append("pods"))
    reflector.run()
    assert sink.seen == [("replace", []), ("replace", ["bad", "good"])]
    assert reflector.apply_failures == 1 and failures == ["pods"]
    assert [c["resource_version"] for c in script.calls if c.get("watch")] == ["1", "4"]
    assert reflector.errors[0] == "pods ADDED event not applied: relisting"


def test_the_extender_counts_failed_applies_by_kind() -> None:
    cache = ClusterCache()
    cache.count_apply_failure("pods")
    cache.count_apply_failure("pods")
    assert cache.apply_failures == {"pods": 2}


@pytest.mark.parametrize("seed", range(5))
def test_backoff_is_capped_exponential_with_full_jitter(seed: int) -> None:
    backoff = Backoff(0.5, 30.0, random.Random(seed))
    delays = [backoff.next_delay() for _ in range(12)]
    ceilings = [min(30.0, 0.5 * 2 ** i) for i in range(12)]
    assert all(0 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    backoff.reset()
    assert backoff.next_delay() <= 0.5




def test_a_hung_api_server_never_stalls_the_watch() -> None:
    """The writer thread is stuck in a write; the watch goes on applying events at once, and
    reports past the queue's capacity are dropped, not waited for."""
    release, writing = threading.Event(), threading.Event()
    written: list[str] = []

    def hung(namespace: str, body: dict[str, Any]) -> None:
        writing.set()
        release.wait(30)
        written.append(body["involvedObject"]["name"])

    reporter = SkipReporter(hung, instance="i", capacity=2)
    cache = ClusterCache(on_skip=reporter.report)
    cache.replace_nodes([node_to_k8s(node("n0", gpu_count=8))])
    reporter.start()
    stop = threading.Event()
    lines = b"".join(pod_event(f"bad-{i}", "9" * 5000) for i in range(5))
    lines += pod_event("good", "1")
    script = Script([listing([], version="1"), FakeResponse(chunks=(lines,))], stop)
    try:
        cache.apply_pod(bad_pod("first", "9" * 5000))
        assert writing.wait(10)  # the writer is now stuck on "first"
        Reflector("pods", script, PodSink(cache), WatchConfig(
            backoff_initial_s=0.001, backoff_max_s=0.001), stop).run()
        assert "default/good" in cache.state.pods   # applied while the writer hangs
        assert cache.skipped_counts()["pod"] == 5     # "first" was not in the list
        assert reporter.outcomes["dropped"] == 3    # 5 reports, room for 2
    finally:
        release.set()
        reporter.stop()
    assert written[0] == "first"


def bad_pod(name: str, quantity: str) -> dict[str, Any]:
    body = pod_to_k8s(pod(name), node="n0")
    body["metadata"]["uid"] = f"uid-{name}"
    requests = body["spec"]["containers"][0]["resources"]["requests"]
    requests["nvidia.com/gpu"] = quantity
    return body


def pod_event(name: str, quantity: str) -> bytes:
    return orjson.dumps({"type": "ADDED", "object": bad_pod(name, quantity)}) + b"\n"


def test_claims_slices_and_classes_are_watched_only_with_dra_on() -> None:
    """With the cache's DRA driver set, three more reflectors list ResourceClaims, the
    driver's ResourceSlices and the DeviceClasses into it."""
    client = kubernetes.client.ApiClient()
    for driver, kinds in (("", {"nodes", "pods", "reservations"}),
                          ("gpu.gpufrag.io", {"nodes", "pods", "reservations",
                                              "resourceclaims", "resourceslices",
                                              "deviceclasses"})):
        watcher = ClusterWatcher(client, ClusterCache(dra_driver=driver), WatchConfig(),
                                 names=DEFAULT_NAMES, hints=False)
        assert {r.kind for r in watcher.reflectors} == kinds
