"""``gpufrag inspect --summary`` on a snapshot file, read by the reader the live path uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from defrag.controller.convergence import DefragState
from defrag.controller.inspect import main as inspect_main
from defrag.fleet.cli import main
from defrag.fleet.split import FREE, IDLE, UNREAD, USED, node_split
from defrag.fleet.summary import evictions
from tests.defrag.fleet.conftest import NOW, T4_MIB


def test_the_summary_adds_up_the_fleet_and_says_what_is_not_recorded(
        snapshot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--snapshot", str(snapshot), "--summary", "-o", "json"]) == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert (s["cluster"], s["nodes"], s["gpus"], s["free_whole_gpus"]) == (
        "cluster.json", 2, 4, 2)
    used = 5000 / T4_MIB + 16_000 / T4_MIB
    assert s["gpus_by_part"] == {"used": round(used, 3), "reserved but idle":
                                 round(1.8 - used, 3), "reserved, no reading": 0.0,
                                 "free": 2.2}
    assert (s["nodes_over_trigger"], s["pending_gpu_pods"]) == (["n0"], 1)
    # web gives back 300 milli of one GPU, for the two hours since it started
    assert s["rightsized"] == {"pods": 1, "gpus_given_back": 0.3,
                               "gpu_hours_given_back": 0.6, "pods_without_start_time": 0}
    assert s["gpu_hours_given_back"] == {"value": pytest.approx(0.6), "at_least": True,
                                         "detail": s["gpu_hours_given_back"]["detail"]}
    assert s["free_whole_gpus_gained"]["value"] is None
    assert s["evictions"]["value"] is None
    assert "snapshot holds no defrag state" in s["evictions"]["detail"]


def test_the_idle_ratio_and_trigger_are_inspects_own(
        snapshot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert inspect_main(["--snapshot", str(snapshot), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["--snapshot", str(snapshot), "--summary", "-o", "json"]) == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert s["idle_ratio"] == doc["cluster"]["idle_ratio"]
    assert s["nodes_over_trigger"] == [n["node"] for n in doc["nodes"] if n["trigger"] == "over"]
    # the split's reserved-but-idle memory is the measure's idle memory, node by node
    for node in doc["nodes"]:
        split = node_split(node)
        assert split.sum(axis=1) == pytest.approx([1.0] * len(node["gpus"]))
        assert split[:, IDLE].sum() * node["gpu_memory_mib"] == pytest.approx(
            node["idle_mib"], abs=1.0)


def test_a_gpu_with_no_reading_is_its_own_part_never_guessed() -> None:
    node = {"gpu_memory_mib": T4_MIB, "gpus": [
        {"free_milli": 250, "peak_mib": None}, {"free_milli": 1000, "peak_mib": 0},
        {"free_milli": 0, "peak_mib": 20_000}]}
    split = node_split(node)
    assert split[0].tolist() == [0.0, 0.0, 0.75, 0.25]
    assert split[1].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert (split[2, USED], split[2, IDLE], split[2, UNREAD], split[2, FREE]) == (1, 0, 0, 0)


def test_the_table_form_prints_each_line(snapshot: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--snapshot", str(snapshot), "--summary"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cluster cluster.json at 2026-01-01T00:00:00Z: 2 node(s), 4 GPU(s)")
    assert any(line.startswith("nodes over the trigger: 1 of 2 (n0)") for line in out)
    assert any(line.startswith("GPU-hours given back:   at least 0.6 (by the 1 right-sized")
               for line in out)
    assert any(line.startswith("free whole GPUs gained: not recorded (") for line in out)


def test_evictions_are_a_lower_bound_from_the_defrag_states_cooldown_record() -> None:
    state = DefragState(moved={"a": NOW - 1800, "b": NOW - 600})
    figure = evictions(state, "", NOW)
    assert (figure.value, figure.at_least) == (2, True)
    assert "since 2025-12-31T23:30:00Z, 0.5 h ago" in figure.detail
    assert evictions(DefragState(), "", NOW).value == 0
    unknown = evictions(None, "ConfigMap x/y not readable: this account may not get it", NOW)
    assert unknown.value is None and unknown.text(",.0f").startswith("not recorded (ConfigMap")


def test_without_summary_or_plot_it_is_inspect_unchanged(
        snapshot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--snapshot", str(snapshot), "-o", "json"]) == 0
    via_entry = capsys.readouterr().out
    assert inspect_main(["--snapshot", str(snapshot), "-o", "json"]) == 0
    assert via_entry == capsys.readouterr().out


@pytest.mark.parametrize("args, pods", [([], 1), (["--namespace", "ns"], 1),
                                        (["--namespace", "other"], 0), (["--node", "n1"], 0)])
def test_the_right_sized_pods_counted_are_those_the_filters_show(
        snapshot: Path, capsys: pytest.CaptureFixture[str], args: list[str], pods: int) -> None:
    assert main(["--snapshot", str(snapshot), "--summary", "-o", "json", *args]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["rightsized"]["pods"] == pods
