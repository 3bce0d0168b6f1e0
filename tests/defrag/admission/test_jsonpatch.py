"""The webhook's own patches applied to a copy of the pod."""

from __future__ import annotations

import pytest

from defrag.admission.jsonpatch import applied


def test_add_replace_remove_in_order_on_a_copy() -> None:
    doc = {"spec": {"a/b": "1", "items": [1]}}
    out = applied(doc, [
        {"op": "replace", "path": "/spec/a~1b", "value": "2"},
        {"op": "add", "path": "/spec/items/-", "value": 2},
        {"op": "add", "path": "/spec/items/0", "value": 0},
        {"op": "remove", "path": "/spec/items/1"},
        {"op": "add", "path": "/metadata", "value": {"x": "~"}},
        {"op": "remove", "path": "/spec/a~1b"},
    ])
    assert out == {"spec": {"items": [0, 2]}, "metadata": {"x": "~"}}
    assert doc == {"spec": {"a/b": "1", "items": [1]}}


@pytest.mark.parametrize("op", [
    {"op": "remove", "path": "/spec/missing"},
    {"op": "replace", "path": "/spec/missing", "value": 1},
    {"op": "add", "path": "/nowhere/deep", "value": 1},
    {"op": "move", "path": "/spec", "from": "/x"},
    {"op": "add", "path": "spec", "value": 1},
])
def test_a_patch_that_does_not_resolve_is_a_value_error(op: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="patch"):
        applied({"spec": {}}, [op])
