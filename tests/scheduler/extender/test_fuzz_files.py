"""Every file the extender reads (its YAML configuration, a cluster snapshot) is bad input or
usable, for any content: never another exception, always quick."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufrag.errors import BadInput
from scheduler.core.types import NodeSpec, PodRequest
from scheduler.extender.cli import _snapshot_runtime
from scheduler.extender.config import ExtenderConfig, load_config
from scheduler.kube.convert import node_to_k8s, pod_to_k8s
from tests.scheduler.extender.helpers import json_paths

FUZZ = settings(max_examples=150, deadline=1000, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

ODD = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["1e999999999", "9" * 3000, "NaN", "-1", "1.5", "", "0x10", "1Ki5"]),
)
JSONISH = st.recursive(ODD, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20)


def _skeleton() -> dict[str, Any]:
    node = node_to_k8s(NodeSpec("n0", cpu_milli=64_000, memory_mib=256_000, gpu_count=8,
                                gpu_product="NVIDIA-A100", gpu_memory_mib=81_920))
    pod = pod_to_k8s(PodRequest("p0", namespace="ns", cpu_milli=1000, memory_mib=1024,
                                num_gpu=1, gpu_milli=500), node="n0", gpus=(0,))
    return {"apiVersion": "v1", "kind": "List", "items": [node, pod]}


def _replace(tree: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    tree[path[0]] = _replace(tree[path[0]], path[1:], new)
    return tree


@FUZZ
@given(data=st.data(), odd=JSONISH)
def test_a_snapshot_with_any_value_anywhere_is_usable_or_bad_input(
        tmp_path: Path, data: st.DataObject, odd: Any) -> None:
    doc = _skeleton()
    path = data.draw(st.sampled_from(json_paths(doc)))
    doc = _replace(doc, path, odd)
    # json.dumps writes NaN/Infinity tokens, which strict JSON readers refuse: part of the test.
    file = tmp_path / "snapshot.json"
    file.write_text(json.dumps(doc))
    try:
        _snapshot_runtime(str(file), ExtenderConfig())
    except BadInput as e:
        assert "\n" not in str(e)


@FUZZ
@given(raw=st.binary(max_size=300))
def test_a_snapshot_of_random_bytes_is_bad_input(tmp_path: Path, raw: bytes) -> None:
    file = tmp_path / "snapshot.yaml"
    file.write_bytes(raw)
    with contextlib.suppress(BadInput):
        _snapshot_runtime(str(file), ExtenderConfig())


SECTIONS = ["policy", "seed", "names", "weights", "affinity", "workload", "bind", "hints",
            "watch", "server", "maintenance_interval_s"]


@FUZZ
@given(tree=st.dictionaries(st.sampled_from(SECTIONS) | st.text(max_size=8), JSONISH,
                            max_size=4))
def test_a_config_file_with_any_content_loads_or_is_bad_input(tmp_path: Path,
                                                               tree: dict[str, Any]) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(tree))
    try:
        load_config(file, environ={})
    except BadInput as e:
        assert "\n" not in str(e)
