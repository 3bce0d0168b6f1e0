"""benchmarks/gpu_check.py's CPU half, with tiny settings: it runs end to end where there is no
GPU (CI), writes both reports, and says of each GPU step that it was skipped and why, so the
script the day a GPU is lent runs is the one this test keeps working. The inventory comparison
and the nvidia-smi reader are checked on their own below (no GPU needed for those)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu_check import compare_inventories, main, nvidia_smi_inventory, targets
from benchmarks.results import Results
from gpufrag.nvml import GpuReadError, NoGpuError, NvmlReader
from node.gpus import Gpu
from tests import skips


def has_gpu() -> bool:
    try:
        with NvmlReader():
            return True
    except (NoGpuError, GpuReadError):
        return False


@skips.skip_if(has_gpu(), skips.GPU_PRESENT, "the full check runs there, not its CPU half")
def test_the_cpu_half_runs_and_says_what_it_skipped(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    code = main(["--out", str(out), "--sizes", "1,2", "--seconds", "0.4",
                 "--cache", str(tmp_path / "cache"), "--results", str(tmp_path / "r.json")])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    report = json.loads((out / "report.json").read_text())
    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == ["inventory", "mps", "tensorrt", "serving"]
    for name in ("inventory", "mps", "tensorrt"):
        assert steps[name]["status"] == "skipped", steps[name]
        assert steps[name]["why"].startswith("no usable NVIDIA GPU: ")
        assert f"[{name}] skipped: no usable NVIDIA GPU" in stdout
    serving = steps["serving"]
    assert serving["status"] == "ran", serving
    figures = serving["figures"]
    assert (figures["backend"], figures["backend_kind"]) == ("onnxruntime", "onnxruntime-cpu")
    assert figures["why_not_tensorrt"].startswith("no usable NVIDIA GPU")
    rows = figures["rows"]
    assert [r["max_batch"] for r in rows] == [1, 2]
    for row in rows:
        assert row["qps"] > 0 and row["direct_img_s"] > 0 and row["batches"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["server_over_direct"] == pytest.approx(row["qps"] / row["direct_img_s"],
                                                          rel=0.01)
        assert row["gpu_util_pct"] is None and row["memory_growth_mib_per_batch"] is None
    assert rows[0]["v100_seed"] == {"qps": 120, "p99_ms": 45, "gpu_util_pct": 18}
    assert rows[1]["v100_seed"] is None
    markdown = (out / "report.md").read_text()
    assert "| NVML inventory: agent, device plugin, nvidia-smi -q | skipped | no usable" in markdown
    assert "| 1 |" in markdown and "120 / 45 / 18" in markdown
    assert "skipped: inventory, mps, tensorrt" in stdout
    verdicts = {t["target"].split(" ", 1)[0]: t for t in figures["targets"]}
    ratio = verdicts["server/direct"]
    assert ratio["measured"] == min(r["server_over_direct"] for r in rows)
    assert ratio["met"] is (ratio["measured"] >= 0.9)
    assert verdicts["p99"]["met"] is None and verdicts["batch"]["met"] is None  # no 8, no 32
    assert verdicts["GPU"]["met"] is None  # no GPU: no memory readings
    assert "| GPU memory growth alarm silent over 10,000 batches | 0 alarms over" in markdown
    # Issue 29's targets are for a GPU: a CPU half records its figures and judges none.
    recorded = Results.from_json((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert recorded.verdict == "no target"
    assert "serving: ran" in recorded.notes and len(recorded.figures) == 6


SMI = """<?xml version="1.0" ?>
<nvidia_smi_log>
  <gpu id="00000000:07:00.0">
    <product_name>NVIDIA H200</product_name>
    <uuid>GPU-aaaa</uuid>
    <mig_mode><current_mig>Disabled</current_mig><pending_mig>Disabled</pending_mig></mig_mode>
    <fb_memory_usage><total>143771 MiB</total><used>0 MiB</used></fb_memory_usage>
  </gpu>
  <gpu id="00000000:08:00.0">
    <product_name>NVIDIA H200</product_name>
    <uuid>GPU-bbbb</uuid>
    <mig_mode><current_mig>Enabled</current_mig></mig_mode>
    <fb_memory_usage><total>143771 MiB</total></fb_memory_usage>
  </gpu>
</nvidia_smi_log>
"""


def test_nvidia_smi_s_xml_is_read_gpu_by_gpu() -> None:
    assert nvidia_smi_inventory(SMI) == [
        {"uuid": "GPU-aaaa", "product": "NVIDIA H200", "memory_total_mib": 143771,
         "mig_mode": "Disabled"},
        {"uuid": "GPU-bbbb", "product": "NVIDIA H200", "memory_total_mib": 143771,
         "mig_mode": "Enabled"}]


def test_the_three_inventories_are_compared_by_uuid() -> None:
    smi = nvidia_smi_inventory(SMI)
    plugin = (Gpu(0, "GPU-aaaa", "NVIDIA H200", 143771), Gpu(1, "GPU-bbbb", "NVIDIA H200",
                                                             143771))
    agent = [{"uuid": "GPU-aaaa"}, {"uuid": "GPU-bbbb"}]
    assert compare_inventories(agent, plugin, smi) == []
    wrong = (Gpu(0, "GPU-aaaa", "NVIDIA H100", 143771), Gpu(1, "GPU-bbbb", "NVIDIA H200", 80000))
    assert compare_inventories(agent, wrong, smi) == [
        "GPU-aaaa: product 'NVIDIA H100' vs nvidia-smi 'NVIDIA H200'",
        "GPU-bbbb: 80000 MiB vs nvidia-smi 143771 MiB"]
    assert compare_inventories(agent[:1], plugin, smi)[0].startswith("GPU sets differ")


def _row(size: int, *, ratio: float, p99: float, direct: float, batches: int,
         alarms: int) -> dict[str, object]:
    return {"max_batch": size, "server_over_direct": ratio, "p99_ms": p99,
            "direct_img_s": direct, "batches": batches, "growth_alarms": alarms,
            "memory_growth_mib_per_batch": 0.0}


def test_the_targets_are_judged_from_a_gpu_run_s_rows() -> None:
    rows = [_row(8, ratio=0.95, p99=12.0, direct=4000, batches=6000, alarms=0),
            _row(32, ratio=0.91, p99=40.0, direct=9000, batches=5000, alarms=0)]
    assert [(t["measured"], t["met"]) for t in targets(rows)] == [
        (0.91, True), (12.0, True), (9000, True), ("0 alarms over 11000 batches", True)]
    rows[1].update(server_over_direct=0.85, direct_img_s=8000, growth_alarms=1)
    rows[0]["p99_ms"] = 25.0
    assert [t["met"] for t in targets(rows)] == [False, False, False, False]
