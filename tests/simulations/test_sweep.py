"""``gpufrag whatif sweep`` and ``merge``: the grid, per-run files, reruns, shards, errors."""

from __future__ import annotations

import io
import json
import shlex
import socket
from pathlib import Path

import pytest
import yaml

from gpufrag.cli import main
from gpufrag.errors import BadInput
from simulations import sweep
from simulations.cli import build_sweep_parser
from simulations.events import EventConfig

SMALL = ["--synthetic-nodes", "12", "--genai", "synthetic", "--set", "hours=2",
         "--set", "serving_models=2", "--set", "serving_peak_rps=600"]


def _inputs() -> sweep.Inputs:
    return sweep.load_inputs(nodes_path=None, pods_path=None, genai="synthetic",
                             synthetic_node_count=12, load=None, start_s=None, hours=2,
                             workload_seed=0, coverage=0.95)


def _configs(**grid: list[object]) -> list[EventConfig]:
    base = EventConfig(hours=2, serving_models=2, serving_peak_rps=600)
    return sweep.expand({"policy": ["fgd", "bestfit"], "seed": [1, 2], **grid}, base)


def test_grid_expands_in_order_and_names_runs_by_knobs_and_inputs() -> None:
    configs = _configs(defrag_interval_min=[0, 15])
    assert len(configs) == 8
    assert [(c.policy, c.seed, c.defrag_interval_min) for c in configs[:3]] == [
        ("fgd", 1, 0), ("fgd", 1, 15), ("fgd", 2, 0)]
    ids = {sweep.run_id(c, "inputs-a") for c in configs}
    assert len(ids) == 8
    assert sweep.run_id(configs[0], "inputs-a") != sweep.run_id(configs[0], "inputs-b")


def test_sweep_writes_each_run_and_a_rerun_skips_them(tmp_path: Path) -> None:
    inputs, configs = _inputs(), _configs()
    progress = io.StringIO()
    first = sweep.sweep(inputs, configs, tmp_path, jobs=2, stream=progress)
    assert (first.ran, first.skipped) == (4, 0)
    files = sorted((tmp_path / "runs").glob("*.json"))
    assert len(files) == 4 and not list((tmp_path / "runs").glob(".*"))  # no temp files left
    assert "4/4 runs" in progress.getvalue()
    again = sweep.sweep(inputs, configs, tmp_path, jobs=2, stream=io.StringIO())
    assert (again.ran, again.skipped) == (0, 4)
    assert sweep.same_results(first.records, again.records)
    # a damaged file is redone, the others kept
    files[0].write_text("{not json")
    third = sweep.sweep(inputs, configs, tmp_path, jobs=1, stream=io.StringIO())
    assert (third.ran, third.skipped) == (1, 3)
    assert sweep.same_results(first.records, third.records)


def test_shards_merge_to_the_local_run(tmp_path: Path) -> None:
    inputs, configs = _inputs(), _configs()
    whole = sweep.sweep(inputs, configs, tmp_path / "whole", jobs=1, stream=io.StringIO())
    for i in range(3):
        part = sweep.sweep(inputs, configs, tmp_path / f"shard{i}", shard=(i, 3),
                           stream=io.StringIO())
        assert part.ran == len(range(i, 4, 3))
    merged = sweep.collect([tmp_path / f"shard{i}" for i in range(3)])
    assert sweep.same_results(merged, whole.records)
    assert main(["whatif", "merge", *(str(tmp_path / f"shard{i}") for i in range(3)),
                 "--out", str(tmp_path / "merged")]) == 0
    rows = (tmp_path / "merged" / "comparison.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[0].startswith("policy,seed,run_id,gpu_hours_allocated")
    assert (tmp_path / "merged" / "timeline.png").stat().st_size > 0


def test_cli_sweep_prints_the_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    out = tmp_path / "o"
    code = main(["whatif", "sweep", *SMALL, "--policies", "fgd,bestfit", "--set",
                 "warm_window_s=0,1800", "--out", str(out), "--jobs", "1"])
    assert code == 0
    captured = capsys.readouterr()
    assert "policy" in captured.out and "warm_window_s" in captured.out
    assert "GPU-h alloc" in captured.out and "over SLO %" in captured.out
    assert "4/4 runs" in captured.err
    record = json.loads(next((out / "runs").glob("fgd-*.json")).read_text())
    assert {"gpu_hours_allocated", "gpu_hours_used", "pending_pod_s", "wait_p99_s",
            "cold_starts", "cold_start_s", "requests_over_slo", "evictions"} <= set(
        record["totals"])
    assert {"frag_ratio", "idle_ratio", "allocated_gpus"} <= set(record["samples"])
    assert (out / "timeline.png").stat().st_size > 0
    assert main(["whatif", "sweep", *SMALL, "--policies", "fgd,bestfit", "--set",
                 "warm_window_s=0,1800", "--out", str(out), "--jobs", "1"]) == 0
    assert "skipped 4 already done" in capsys.readouterr().out


def test_grid_file(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("policy: [fgd, gpu-packing]\nthreshold: [0.2, 0.3]\nserving: false\n")
    parsed = sweep.read_grid(grid)
    assert parsed == {"policy": ["fgd", "gpu-packing"], "threshold": [0.2, 0.3],
                      "serving": [False]}


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "speed=1,2"], "unknown knob 'speed'; knobs are policy, seed, hours"),
    (["--set", "policy"], "'policy' is not knob=value"),
    (["--set", "seed=one"], "field 'seed': 'one' is not a int"),
    (["--set", "threshold=2"], "field 'threshold': 2.0: not a ratio"),
    (["--policies", "magic"], "unknown policy magic"),
    (["--shard", "3/2"], "the index must be in 0..1"),
    (["--shard", "x"], "is not i/N"),
    (["--ray", "auto", "--shard", "0/2"], "pick one"),
    (["--jobs", "0"], "field '--jobs'"),
    (["--nodes", "n.csv"], "--nodes and --pods go together"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "sweep", *SMALL, "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_knob_in_a_grid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("policy: [fgd]\ncron_minutes: [5, 15]\n")
    assert main(["whatif", "sweep", *SMALL, "--grid", str(grid), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{grid}" in err and "unknown knob 'cron_minutes'" in err


def test_merge_of_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "merge", str(tmp_path)]) == 2
    assert "no run files found" in capsys.readouterr().err
    assert main(["whatif", "merge", str(tmp_path / "missing")]) == 2


def test_the_grid_is_bounded() -> None:
    with pytest.raises(BadInput, match="narrow it"):
        sweep.expand({"seed": list(range(200)), "threshold": [x / 100 for x in range(60)]})


def test_indexed_job_manifest_matches_the_cli() -> None:
    path = Path(__file__).resolve().parents[2] / "manifests" / "jobs" / "whatif-sweep.yaml"
    docs = {d["kind"]: d for d in yaml.safe_load_all(path.read_text())}
    job = docs["Job"]["spec"]
    assert job["completionMode"] == "Indexed"
    script = job["template"]["spec"]["containers"][0]["args"][0]
    argv = shlex.split(script.replace("exec gpufrag whatif sweep", "").replace(
        '"$JOB_COMPLETION_INDEX', "\"3"))
    args = build_sweep_parser().parse_args(argv)
    assert sweep.parse_shard(args.shard) == (3, job["completions"])
    grid = yaml.safe_load(docs["ConfigMap"]["data"]["grid.yaml"])
    assert set(grid) <= set(EventConfig.knobs())
    assert len(sweep.expand({k: [sweep.knob_value(k, str(v)) for v in vs]
                             for k, vs in grid.items()})) >= job["completions"]
    merge = docs["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert merge["args"][:2] == ["whatif", "merge"]


def test_a_ray_address_where_nothing_listens_is_refused_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not Ray's minutes of retries: one line, exit 2, naming the address."""
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    assert main(["whatif", "sweep", *SMALL, "--out", str(tmp_path), "--ray", address]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the two lines that say what is swept
    assert f"cannot connect to the Ray cluster at {address!r}: nothing answers there" in last
    assert "Traceback" not in err


def test_without_the_default_genai_trace_the_fallback_says_where_it_looked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "DEFAULT_DIR", tmp_path / "genai")
    inputs = sweep.load_inputs(nodes_path=None, pods_path=None, genai=None,
                               synthetic_node_count=12, load=None, start_s=None, hours=2,
                               workload_seed=0, coverage=0.95)
    assert inputs.serving_trace.source == "synthetic"
    assert any(f"no GenAI trace at {tmp_path / 'genai'}: using the synthetic" in note
               and "GPUFRAG_DATA_ROOT" in note for note in inputs.notes)
