"""The node's pod cache: one parse per pod version; gone pods are forgotten."""

from __future__ import annotations

from gpufrag.conventions import ANNOTATION_GPU_ALLOCATED, DEFAULT_NAMES
from node.deviceplugin.pods import NodePods
from tests.node.deviceplugin.builders import build_pod


def test_replace_upsert_delete() -> None:
    gone: list[str] = []
    pods = NodePods(DEFAULT_NAMES, annotation_allocated=ANNOTATION_GPU_ALLOCATED,
                    on_gone=gone.append)
    pods.replace([build_pod("a", whole=1), build_pod("b", milli=300),
                  build_pod("cpu", containers={"main": 0})])
    assert sorted(p.name for p in pods.asks()) == ["a", "b"] and pods.synced.is_set()
    pods.upsert(build_pod("a", whole=1, allocated={"main": ["GPU-x"]}))
    assert next(p for p in pods.asks() if p.name == "a").allocated == {"main": ("GPU-x",)}
    pods.upsert(build_pod("b", containers={"main": 0}))  # no longer asks for a GPU
    pods.delete(build_pod("a", whole=1))
    assert pods.asks() == [] and gone == ["uid-a"]
    pods.replace([build_pod("c", whole=1)])
    assert len(pods) == 1


def test_an_unreadable_pod_is_kept_with_its_problem() -> None:
    pods = NodePods(DEFAULT_NAMES, annotation_allocated=ANNOTATION_GPU_ALLOCATED)
    bad = build_pod("bad", whole=1)
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1e999999"
    pods.replace([bad])
    [ask] = pods.asks()
    assert "cannot be read" in ask.problem
