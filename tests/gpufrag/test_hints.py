"""Placement hints from the defrag controller's ConfigMap."""

from __future__ import annotations

from typing import Any

from gpufrag.conventions import NO_HINTS, hints_from_configmap


def configmap(data: Any) -> dict[str, Any]:
    return {"metadata": {"name": "gpufrag-placement-hints"}, "data": data}


def test_hints_by_owner_with_expiry() -> None:
    hints, problems = hints_from_configmap(configmap({
        "rs-1": '[{"node": "gpu-3", "expires": 200}, {"node": "gpu-4", "expires": 100.5}]',
        "rs-2": '{"node": "gpu-9", "expires": 300}',  # one hint, as the annotation carries it
    }))
    assert problems == []
    assert hints.nodes_for("rs-1", 100) == {"gpu-3", "gpu-4"}
    assert hints.nodes_for("rs-1", 150) == {"gpu-3"}
    assert hints.nodes_for("rs-1", 200) == frozenset()
    assert hints.nodes_for("rs-2", 0) == {"gpu-9"}
    assert hints.nodes_for("", 0) == frozenset()
    assert hints.nodes_for("unknown", 0) == frozenset()


def test_bad_entries_are_skipped_and_reported() -> None:
    hints, problems = hints_from_configmap(configmap({
        "ok": '[{"node": "gpu-1", "expires": 10}]',
        "not-json": "[",
        "no-node": '[{"expires": 10}]',
        "bad-expiry": '[{"node": "gpu-1", "expires": "soon"}]',
        "number": "5",
    }))
    assert len(hints) == 1 and hints.nodes_for("ok", 0) == {"gpu-1"}
    assert len(problems) == 4
    assert any("'node' must be a non-empty string" in p for p in problems)
    assert any("'expires' must be unix seconds, got 'soon'" in p for p in problems)


def test_no_configmap_or_no_data_means_no_hints() -> None:
    assert hints_from_configmap(None) == (NO_HINTS, [])
    assert len(hints_from_configmap(configmap(None))[0]) == 0
    assert hints_from_configmap(configmap(["x"]))[1] == ["data is list, not a mapping"]
