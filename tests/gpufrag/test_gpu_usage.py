from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrag.errors import BadInput
from gpufrag.gpu_usage import (
    REFRESH_INTERVALS,
    SCHEMA_VERSION,
    STALE_AFTER_INTERVALS,
    GpuUsage,
    NodeGpuUsage,
    PodGpuUsage,
    StrayProcess,
    parse,
)

EXAMPLE = {
    "version": 1,
    "node": "gpu-node-7",
    "timestamp": 1732900000.0,
    "interval_s": 15.0,
    "gpus": [
        {"index": 0, "uuid": "GPU-aaaa", "product": "NVIDIA A100-SXM4-80GB",
         "memory_used_mib": 30512, "memory_total_mib": 81920, "utilization_pct": 63,
         "pods": [{"namespace": "serving", "name": "llama-7b-0", "uid": "uid-a",
                   "memory_used_mib": 20000},
                  {"namespace": "serving", "name": "mistral-7b-0", "uid": "uid-b",
                   "memory_used_mib": 10000}]},
        {"index": 1, "uuid": "GPU-bbbb", "product": "NVIDIA A100-SXM4-80GB",
         "memory_used_mib": 300, "memory_total_mib": 81920, "utilization_pct": 0, "pods": [],
         "strays": [{"pid": 4242, "memory_used_mib": 256, "reason": "pod_gone"},
                    {"pid": 7070, "memory_used_mib": 44, "reason": "no_pod"}]},
    ],
}


def build_gpu(**overrides: Any) -> GpuUsage:
    base = GpuUsage(index=0, uuid="GPU-aaaa", product="NVIDIA A100-SXM4-80GB",
                    memory_used_mib=30512, memory_total_mib=81920, utilization_pct=63,
                    pods=(PodGpuUsage("serving", "llama-7b-0", "uid-a", 20000),))
    return replace(base, **overrides)


def build_usage(*gpus: GpuUsage, **overrides: Any) -> NodeGpuUsage:
    base = NodeGpuUsage(node="gpu-node-7", timestamp=1732900000.0, interval_s=15.0,
                        gpus=gpus or (build_gpu(),))
    return replace(base, **overrides)


def test_example_parses_into_the_dataclasses() -> None:
    usage = parse(json.dumps(EXAMPLE))
    assert usage.node == "gpu-node-7"
    assert usage.gpus[0].pods[1] == PodGpuUsage("serving", "mistral-7b-0", "uid-b", 10000)
    assert usage.gpus[0].memory_free_mib == 81920 - 30512
    assert usage.gpus[0].memory_unattributed_mib == 512
    assert usage.gpus[1].pods == ()
    assert usage.gpus[0].strays == ()
    assert usage.gpus[1].strays == (StrayProcess(4242, 256, "pod_gone"),
                                    StrayProcess(7070, 44, "no_pod"))
    assert usage.gpus[1].strays[0].why == "its pod is gone from this node"


def test_an_annotation_from_an_agent_before_strays_reads_as_none() -> None:
    doc = copy.deepcopy(EXAMPLE)
    del doc["gpus"][1]["strays"]  # type: ignore[index]
    usage = parse(json.dumps(doc))
    assert usage.gpus[1].strays == ()
    assert "strays" not in json.loads(usage.to_json())["gpus"][1]  # written only when some


def test_a_reason_this_reader_does_not_know_still_reads() -> None:
    usage = parse(_mutated("gpus.1.strays.0.reason", "mps_server"))
    assert usage.gpus[1].strays[0].why == "mps_server"


def test_round_trip_is_exact_and_keys_keep_their_order() -> None:
    usage = parse(json.dumps(EXAMPLE))
    text = usage.to_json()
    assert parse(text) == usage
    assert json.loads(text) == EXAMPLE
    assert list(json.loads(text)) == ["version", "node", "timestamp", "interval_s", "gpus"]
    # Compact: annotations count against the Node object's size limit.
    assert text == json.dumps(EXAMPLE, separators=(",", ":"), ensure_ascii=False)


def test_parse_accepts_bytes_and_integer_timestamps() -> None:
    doc = {**EXAMPLE, "timestamp": 1732900000, "interval_s": 15}
    usage = parse(json.dumps(doc).encode())
    assert usage.timestamp == 1732900000.0
    assert isinstance(usage.interval_s, float)


_pods = st.lists(
    st.builds(PodGpuUsage, st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8),
              st.uuids().map(str), st.integers(0, 10**6)),
    max_size=3, unique_by=lambda p: p.uid,
)


_strays = st.lists(
    st.builds(StrayProcess, st.integers(1, 2**22), st.integers(0, 10**6),
              st.sampled_from(["pod_gone", "no_pod"])),
    max_size=2, unique_by=lambda s: s.pid,
)


@st.composite
def _usages(draw: st.DrawFn) -> NodeGpuUsage:
    count = draw(st.integers(0, 4))
    gpus = []
    for index in range(count):
        total = draw(st.integers(0, 200_000))
        gpus.append(GpuUsage(index=index, uuid=f"GPU-{index}", product=draw(st.text(min_size=1)),
                             memory_used_mib=draw(st.integers(0, total)), memory_total_mib=total,
                             utilization_pct=draw(st.integers(0, 100)),
                             pods=tuple(draw(_pods)), strays=tuple(draw(_strays))))
    return NodeGpuUsage(node=draw(st.text(min_size=1, max_size=20)),
                        timestamp=draw(st.floats(0, 4e9)),
                        interval_s=draw(st.floats(0.001, 3600)), gpus=tuple(gpus))


@settings(max_examples=60, deadline=None)
@given(_usages())
def test_any_valid_usage_round_trips(usage: NodeGpuUsage) -> None:
    assert parse(usage.to_json()) == usage


def _mutated(path: str, value: Any) -> str:
    """EXAMPLE with the value at a dotted path (list indices as digits) replaced or deleted."""
    doc = copy.deepcopy(EXAMPLE)
    *parents, last = path.split(".")
    target: Any = doc
    for key in parents:
        target = target[int(key)] if key.isdigit() else target[key]
    slot: Any = int(last) if last.isdigit() else last
    if value is _DELETE:
        del target[slot]
    else:
        target[slot] = value
    return json.dumps(doc)


_DELETE = object()


@pytest.mark.parametrize(("path", "value", "field", "says"), [
    ("version", _DELETE, "version", "missing"),
    ("version", 2, "version", "not supported"),
    ("version", "1", "version", "integer"),
    ("node", "", "node", "non-empty string"),
    ("node", 7, "node", "non-empty string"),
    ("timestamp", _DELETE, "timestamp", "missing"),
    ("timestamp", -1, "timestamp", ">= 0"),
    ("timestamp", "now", "timestamp", "number"),
    ("timestamp", True, "timestamp", "number"),
    ("interval_s", 0, "interval_s", "> 0"),
    ("gpus", {}, "gpus", "array"),
    ("gpus.0", [], "gpus[0]", "object"),
    ("gpus.0.index", -1, "gpus[0].index", ">= 0"),
    ("gpus.0.index", 1.5, "gpus[0].index", "integer"),
    ("gpus.1.index", 0, "gpus[1].index", "repeats gpus[0].index"),
    ("gpus.1.uuid", "GPU-aaaa", "gpus[1].uuid", "repeats"),
    ("gpus.0.uuid", _DELETE, "gpus[0].uuid", "missing"),
    ("gpus.0.product", None, "gpus[0].product", "non-empty string"),
    ("gpus.0.memory_used_mib", 90000, "gpus[0].memory_used_mib", "exceeds memory_total_mib"),
    ("gpus.0.memory_used_mib", True, "gpus[0].memory_used_mib", "integer"),
    ("gpus.0.memory_total_mib", -5, "gpus[0].memory_total_mib", ">= 0"),
    ("gpus.0.utilization_pct", 101, "gpus[0].utilization_pct", "0..100"),
    ("gpus.0.pods", None, "gpus[0].pods", "array"),
    ("gpus.0.pods.1", "pod", "gpus[0].pods[1]", "object"),
    ("gpus.0.pods.1.namespace", _DELETE, "gpus[0].pods[1].namespace", "missing"),
    ("gpus.0.pods.1.name", "", "gpus[0].pods[1].name", "non-empty"),
    ("gpus.0.pods.1.uid", "uid-a", "gpus[0].pods[1].uid", "repeats gpus[0].pods[0].uid"),
    ("gpus.0.pods.0.memory_used_mib", -1, "gpus[0].pods[0].memory_used_mib", ">= 0"),
    ("gpus.0.pods.0.memory_used_mib", "1 GiB", "gpus[0].pods[0].memory_used_mib", "integer"),
    ("gpus.1.strays", {}, "gpus[1].strays", "array"),
    ("gpus.1.strays.0.pid", 0, "gpus[1].strays[0].pid", ">= 1"),
    ("gpus.1.strays.1.pid", 4242, "gpus[1].strays[1].pid", "repeats gpus[1].strays[0].pid"),
    ("gpus.1.strays.0.memory_used_mib", -1, "gpus[1].strays[0].memory_used_mib", ">= 0"),
    ("gpus.1.strays.0.reason", "", "gpus[1].strays[0].reason", "non-empty string"),
])
def test_every_malformed_field_is_named(path: str, value: Any, field: str, says: str) -> None:
    with pytest.raises(BadInput) as caught:
        parse(_mutated(path, value))
    assert caught.value.field == field
    assert says in str(caught.value)
    assert "gpufrag.io/gpu-usage" in str(caught.value)


@pytest.mark.parametrize(("text", "field", "says"), [
    ("{not json", None, "not valid JSON"),
    ("[]", "(root)", "object"),
    ("", None, "not valid JSON"),
])
def test_not_a_usage_document(text: str, field: str | None, says: str) -> None:
    with pytest.raises(BadInput) as caught:
        parse(text)
    assert caught.value.field == field
    assert says in str(caught.value)


def test_source_names_where_the_text_came_from() -> None:
    with pytest.raises(BadInput, match=r"^node gpu-node-7 annotation, field 'node'"):
        parse(_mutated("node", ""), source="node gpu-node-7 annotation")


def test_version_constant_matches_what_is_written() -> None:
    assert json.loads(build_usage().to_json())["version"] == SCHEMA_VERSION


@pytest.mark.parametrize(("age_s", "max_intervals", "stale"), [
    (0.0, 3, False),
    (45.0, 3, False),  # exactly 3 intervals old: still fresh
    (45.1, 3, True),
    (15.0 * STALE_AFTER_INTERVALS, STALE_AFTER_INTERVALS, False),
    (15.0 * STALE_AFTER_INTERVALS + 1, STALE_AFTER_INTERVALS, True),
])
def test_is_stale(age_s: float, max_intervals: float, stale: bool) -> None:
    usage = build_usage()
    assert usage.is_stale(usage.timestamp + age_s, max_intervals) is stale
    assert usage.age_s(usage.timestamp + age_s) == pytest.approx(age_s)


def test_default_staleness_leaves_room_for_the_refresh() -> None:
    usage = build_usage()
    # An unchanged reading is republished after REFRESH_INTERVALS; that must not look stale.
    assert not usage.is_stale(usage.timestamp + REFRESH_INTERVALS * usage.interval_s + 1)


_POD_A = PodGpuUsage("serving", "llama-7b-0", "uid-a", 20000)
_STRAY = StrayProcess(4242, 100, "pod_gone")


@pytest.mark.parametrize(("other", "changed"), [
    (build_usage(timestamp=1732900999.0), False),  # time alone never counts
    (build_usage(build_gpu(memory_used_mib=30512 + 64)), False),  # at the tolerance
    (build_usage(build_gpu(memory_used_mib=30512 + 65)), True),
    (build_usage(build_gpu(memory_used_mib=30512 - 65)), True),
    (build_usage(build_gpu(utilization_pct=63 + 10)), False),
    (build_usage(build_gpu(utilization_pct=63 - 11)), True),
    (build_usage(build_gpu(pods=(replace(_POD_A, memory_used_mib=20064),))), False),
    (build_usage(build_gpu(pods=(replace(_POD_A, memory_used_mib=19935),))), True),
    (build_usage(build_gpu(pods=())), True),  # a pod left the GPU
    (build_usage(build_gpu(pods=(_POD_A, PodGpuUsage("b", "x", "uid-x", 0)))), True),
    (build_usage(build_gpu(pods=(replace(_POD_A, uid="uid-new"),))), True),  # pod replaced
    (build_usage(build_gpu(uuid="GPU-other")), True),
    (build_usage(build_gpu(product="NVIDIA H100 80GB HBM3")), True),
    (build_usage(build_gpu(memory_total_mib=40960)), True),
    (build_usage(build_gpu(), build_gpu(index=1, uuid="GPU-bbbb")), True),  # GPU appeared
    (build_usage(build_gpu(index=1)), True),  # same GPU, other index
    (build_usage(node="gpu-node-8"), True),
    (build_usage(interval_s=30.0), True),
    (build_usage(build_gpu(strays=(_STRAY,))), True),  # a stray appeared (or left)
])
def test_changed_beyond_tolerance(other: NodeGpuUsage, changed: bool) -> None:
    base = build_usage()
    assert base.changed_beyond(other, tolerance_mib=64, tolerance_pct=10) is changed
    assert other.changed_beyond(base, tolerance_mib=64, tolerance_pct=10) is changed


@pytest.mark.parametrize(("stray", "changed"), [
    (_STRAY, False),
    (replace(_STRAY, reason="no_pod"), True),  # why changed
    (replace(_STRAY, memory_used_mib=100 + 64), False),  # at the tolerance
    (replace(_STRAY, memory_used_mib=100 - 65), True),
    (replace(_STRAY, pid=1), True),  # another process
])
def test_a_stray_changes_the_reading_as_a_pod_does(stray: StrayProcess, changed: bool) -> None:
    base, other = build_usage(build_gpu(strays=(_STRAY,))), build_usage(build_gpu(strays=(stray,)))
    assert base.changed_beyond(other, tolerance_mib=64, tolerance_pct=10) is changed
    assert other.changed_beyond(base, tolerance_mib=64, tolerance_pct=10) is changed


def test_changed_beyond_ignores_gpu_order() -> None:
    gpu0, gpu1 = build_gpu(), build_gpu(index=1, uuid="GPU-bbbb", pods=())
    assert not build_usage(gpu0, gpu1).changed_beyond(build_usage(gpu1, gpu0), 0, 0)


def test_zero_tolerance_sees_every_mib() -> None:
    assert build_usage().changed_beyond(build_usage(build_gpu(memory_used_mib=30513)), 0, 0)
