"""``gpufrag demo`` end to end on the session's control plane, plus its pure parts and its CLI.

The demo runs in-process against the shared ``control_plane`` (``run_demo(..., plane=...)``), so
the test pays for the scenario, not for another control plane: fake GPU nodes, a spread
"before" layout, gpufrag-scheduler (kube-scheduler + extender subprocess) scaling the model
Deployments, ``gpufrag serve`` stand-ins under open-loop load, usage through one ``gpufrag agent``
process per node reading a recorded-NVML file, one real ``gpufrag defrag`` cycle, and the summary
files; the demo sees what they did only through the API server.

Checked: the summary JSON has every field; fragmentation does not rise and free whole GPUs do not
fall across the cycle; every replacement followed its hint; every Deployment is back at full
replicas; and everything the demo made or started is gone afterwards.
"""

from __future__ import annotations

import io
import json
import math
import random
import urllib.request
from pathlib import Path

import kubernetes
import pytest

from devkit import demo
from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from gpufrag.conventions import DEFAULT_NAMES
from gpufrag.nvml import MIB, GpuReading, NvmlReader, ProcessReading
from gpufrag.nvml_recorded import RecordedNvml

PHASE_FIELDS = ("frag_ratio", "frag_gpus", "idle_ratio", "idle_gib", "free_whole_gpus",
                "placements", "cold_loads_avoided", "cold_loads", "placed_by", "p50_ms",
                "p99_ms", "requests", "errors", "mean_batch", "p99_ms_by_deployment")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False


def test_the_demo_defragments_and_cleans_up(control_plane: ControlPlane, tmp_path: Path) -> None:
    screen = io.StringIO()
    summary = demo.run_demo(demo.DemoOptions(out=tmp_path, nodes=6, seed=3, load_s=2.0),
                            plane=control_plane, out=screen)
    text = screen.getvalue()
    doc = json.loads((tmp_path / "demo_summary.json").read_text())
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The fields, for both phases.
    for phase in ("before", "after"):
        missing = [f for f in PHASE_FIELDS if f not in doc[phase]]
        assert not missing, (phase, missing)
        assert doc[phase]["requests"] > 0 and doc[phase]["errors"] == 0
        assert math.isfinite(doc[phase]["p99_ms"]) and doc[phase]["p99_ms"] > 0
    assert doc["gpu_memory_source"].startswith(("recorded", "nvml"))
    assert set(doc["layout"]["before"]) == {n["name"] for n in doc["nodes"]}

    # The defrag cycle: not worse on fragmentation, no whole GPU lost, every hint followed.
    before, after = doc["before"], doc["after"]
    assert after["frag_ratio"] <= before["frag_ratio"] + 1e-9
    assert after["free_whole_gpus"] >= before["free_whole_gpus"]
    assert doc["defrag"]["exit_code"] == 0 and doc["defrag"]["moves_planned"] >= 1
    assert doc["defrag"]["landed_on_hint"] == len(doc["defrag"]["moves"])
    # Placements: spread ones counted for "before", gpufrag-scheduler's (scale-up + the
    # replacements) for "after".
    assert before["placements"] == sum(d.legacy_replicas for d in demo.DEPLOYMENTS)
    scale_up = sum(d.replicas - d.legacy_replicas for d in demo.DEPLOYMENTS)
    assert after["placements"] == scale_up + len(doc["defrag"]["moves"])
    assert 0 <= after["cold_loads_avoided"] <= after["placements"]

    # Every Deployment back at full replicas.
    for d in doc["deployments"]:
        assert d["ready_replicas"] == d["replicas"] == d["available_replicas"], d
    assert "6/6 before / after" in text
    assert "RECORDED NVML" in text or "GPU present" in text

    # Cleaned up: stand-ins and extender stopped, the nodes and the namespace going.
    for s in summary.standins:
        assert not _answers(f"{s['url']}/v2/health/live")
    assert summary.extender_url and not _answers(f"{summary.extender_url}/healthz")
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    assert not [n for n in core.list_node().items if n.metadata.name.startswith("demo-")]

    def namespace_going() -> bool:
        try:
            ns = core.read_namespace(summary.namespace)
        except kubernetes.client.ApiException as e:
            return e.status == 404
        return ns.metadata.deletion_timestamp is not None

    wait_until(namespace_going, timeout_s=30, what="the demo namespace to be deleted")


# ------------------------------------------------------------------------------- pure parts


def test_spread_placement_opens_a_fresh_gpu_per_share_and_honours_products() -> None:
    nodes = demo.node_layout(4)
    pods = [demo.LegacyPod(f"p{i}", milli=250) for i in range(6)]
    pods.append(demo.LegacyPod("big", milli=500, products=(demo.V100.product,)))
    pods.append(demo.LegacyPod("whole", whole=4))
    placed = demo.spread_placement(nodes, pods, random.Random(0))
    shares = [placed[p.key] for p in pods if p.milli]
    assert len(set(shares)) == len(shares)  # never two shares on one GPU while GPUs are free
    assert placed["big"][0] == "demo-v100-0"
    assert len(placed["whole"][1]) == 4
    with pytest.raises(demo.BadInput, match="--nodes"):
        demo.spread_placement(nodes, [demo.LegacyPod("huge", whole=9)], random.Random(0))


def test_cold_loads_count_warm_nodes_in_bind_order_across_phases() -> None:
    spread = demo.ColdLoads()
    assert not spread.place("n1", ("m", "1"))
    assert spread.place("n1", ("m", "1"))
    assert not spread.place("n1", ("m", "2"))  # another version is a cold load
    later = spread.phase()
    assert later.placements == 0
    assert later.place("n1", ("m", "2")) and not later.place("n2", ("m", "1"))
    assert later.as_dict() == {"placements": 2, "cold_loads_avoided": 1, "cold_loads": 1}


def test_a_node_recording_reads_through_the_agent_reader(tmp_path: Path) -> None:
    proc = demo.FakeProcRoot(tmp_path / "proc")
    pods = [demo.GpuPod("0b8f0c8e-1111-4a4a-9b9b-000000000001", (0,), 1400),
            demo.GpuPod("0b8f0c8e-2222-4a4a-9b9b-000000000002", (0, 2), 900)]
    gpus = demo.recorded_gpus("demo-t4-0", demo.T4, pods, proc.pid_of)
    # The file 'gpufrag agent --nvml-recording' reads, read back the way the agent reads it.
    recording = demo.write_recording(tmp_path / "nvml.json", gpus)
    with NvmlReader(RecordedNvml.load(recording)) as reader:
        readings = reader.read()
    assert [r.memory_used_mib for r in readings] == [2300, 0, 900, 0]
    assert {r.memory_total_mib for r in readings} == {demo.T4.gpu_memory_mib}
    assert readings[0].product == "Tesla T4"
    from node.agent.cgroup import pod_uid_for_pid

    pid = readings[2].processes[0].pid
    assert pod_uid_for_pid(pid, proc.root) == pods[1].uid


def _pod(name: str, uid: str, *, owner: str = "rs-chat", node: str = "", gpus: str = "",
         evicted: bool = False) -> dict[str, object]:
    """A pod as the API's JSON, with the fields the observer reads."""
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": {"app": "chat"},
                         "annotations": {DEFAULT_NAMES.annotation_gpu_indices: gpus}
                         if gpus else {},
                         "ownerReferences": [{"kind": "ReplicaSet", "uid": owner,
                                              "controller": True}]},
            "spec": {"nodeName": node},
            "status": {"conditions": [{"type": "DisruptionTarget", "status": "True",
                                       "reason": "EvictionByEvictionAPI"}] if evicted else []}}


def test_the_observer_pairs_each_eviction_with_its_hint_and_replacement() -> None:
    observer = demo.ClusterObserver(kubernetes.client.ApiClient(), "ns")  # no call is made
    observer.on_pod("ADDED", _pod("chat-a", "u1", node="n1", gpus="2"))
    observer.on_pod("ADDED", _pod("chat-b", "u2", node="n2", gpus="0"))
    since = observer.mark()
    observer.on_hints("MODIFIED", {"data": {"rs-chat": '[{"node": "n3", "expires": 9e9}]'}})
    observer.on_pod("MODIFIED", _pod("chat-a", "u1", node="n1", gpus="2", evicted=True))
    observer.on_pod("DELETED", _pod("chat-a", "u1", node="n1", gpus="2", evicted=True))
    observer.on_pod("ADDED", _pod("chat-c", "u3"))
    observer.on_pod("MODIFIED", _pod("chat-c", "u3", node="n3", gpus="1"))
    observer.on_hints("MODIFIED", {"data": {}})  # removed once the replacement is bound

    (move,) = observer.moves(since)
    assert (move.evicted.name, move.evicted.node, move.evicted.gpus) == ("chat-a", "n1", (2,))
    assert move.hinted == ("n3",) and move.landed_on == "n3" and move.on_hint
    assert move.replacement is not None and move.replacement.name == "chat-c"
    assert [p.name for p in observer.pods() if p.live] == ["chat-b", "chat-c"]
    assert [h.node for h in observer.hints(since)] == ["n3"]
    assert observer.moves(observer.mark()) == []  # nothing evicted after the cycle


def test_live_nvml_figures_replace_recorded_ones_only_for_stand_ins_on_a_gpu() -> None:
    readings = (GpuReading(0, "GPU-a", "NVIDIA H100", 9000 * MIB, 81559 * MIB, 40,
                           (ProcessReading(111, 700 * MIB), ProcessReading(222, 300 * MIB))),
                GpuReading(1, "GPU-b", "NVIDIA H100", 100 * MIB, 81559 * MIB, 0,
                           (ProcessReading(111, 50 * MIB),)))
    assert demo.live_model_memory(readings, {"chat": 111, "embed": 333}) == {"chat": 750}


# ------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("argv", [["--nodes", "2"], ["--nodes", "x"], ["--bogus"],
                                  ["--load-s", "0"]])
def test_bad_flags_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    assert demo.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpufrag demo: ") and err.count("\n") == 1


def test_missing_go_is_said_plainly(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(demo.BINARY_ENV, raising=False)
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)
    assert demo.main(["--out", "unused"]) == 1
    assert "Go is not installed" in capsys.readouterr().err
