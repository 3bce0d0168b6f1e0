"""``gpufrag whatif`` end to end on small inputs: outputs, table, exit codes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpufrag.cli import main
from tests.simulations.test_openb import NODES, PODS


def test_synthetic_default_writes_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    code = main(["whatif", "--synthetic-nodes", "20", "--seeds", "1,2", "--out", str(tmp_path),
                 "--jobs", "1", "--policies", "fgd,bestfit"])
    assert code == 0
    out = capsys.readouterr().out
    assert "fgd" in out and "bestfit" in out and "alloc@130%" in out
    with (tmp_path / "allocation.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows[0][:5] == ["workload", "sc_policy", "tune", "seed", "0"] and rows[0][-1] == "130"
    assert len(rows) == 1 + 4 and {r[1] for r in rows[1:]} == {"fgd", "bestfit"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {p["policy"] for p in summary["policies"]} == {"fgd", "bestfit"}
    for name in ("frag_ratio.csv", "frag_amount.csv", "allocation.png", "frag_ratio.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_trace_files(tmp_path: Path) -> None:
    (tmp_path / "n.csv").write_text(NODES)
    (tmp_path / "p.csv").write_text(PODS.replace("T4|V100M16", "T4"))
    code = main(["whatif", "--nodes", str(tmp_path / "n.csv"), "--pods", str(tmp_path / "p.csv"),
                 "--out", str(tmp_path / "o"), "--no-plots", "--jobs", "1"])
    assert code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "fgd,magic"], "unknown policy magic"),
        (["--policies", "kube-defaults"], "choose from random,dotprod,gpu-clustering,"
                                          "gpu-packing,bestfit,fgd,kube-default"),
        (["--tune", "0"], "--tune 0.0 outside"),
        (["--nodes", "x.csv"], "--nodes and --pods go together"),
        (["--nodes", "missing.csv", "--pods", "missing.csv"], "missing.csv: cannot read"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("load", ["1e308", "inf", "0", "nan"])
def test_a_sweep_load_out_of_bounds_is_refused_in_one_line(
        load: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "sweep", "--load", load]) == 2
    err = capsys.readouterr().err
    assert "--load" in err and "Traceback" not in err


def test_unknown_command_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert main([]) == 0 and "whatif" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--seeds", "a,b"], "argument --seeds: 'a' is not a seed"),
        (["--seeds", "-1"], "argument --seeds: '-1' is not a seed"),
        (["--seeds", "1,01"], "argument --seeds: seed 1 given more than once"),
        (["--tune", "lots"], "argument --tune: invalid float value: 'lots'"),
        (["--tune", "nan"], "--tune nan outside (0, 10]"),
        (["--policies", ","], "argument --policies: expected a comma-separated list"),
        (["--policies", "fgd,fgd"], "argument --policies: fgd given more than once"),
        (["--jobs"], "argument --jobs: expected one argument"),
        (["--synthetic-nodes", "10000000"], "--synthetic-nodes 10000000 outside 1..100000"),
        (["--device-choice", "best"], "argument --device-choice: invalid choice: 'best'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], message: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--out", str(tmp_path), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert message in captured.err and "usage:" not in captured.err


def test_help_still_prints_usage_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--help"]) == 0
    assert "usage: gpufrag whatif" in capsys.readouterr().out


def test_resampled_names_never_clash_with_trace_names(tmp_path: Path) -> None:
    """A trace holding both ``p0`` and ``p0-r0``: resampling ``p0`` must not reuse the name
    (the cluster state would see one pod placed twice)."""
    (tmp_path / "n.csv").write_text(NODES)
    pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
        f"p0{suffix},1,1,1,100\n" for suffix in ["", *(f"-r{k}" for k in range(10))])
    (tmp_path / "p.csv").write_text(pods)
    code = main(["whatif", "--nodes", str(tmp_path / "n.csv"), "--pods", str(tmp_path / "p.csv"),
                 "--out", str(tmp_path / "o"), "--no-plots", "--jobs", "1", "--policies", "fgd"])
    assert code == 0


def test_kss_compat_is_seeded_and_recorded(tmp_path: Path) -> None:
    args = ["whatif", "--synthetic-nodes", "20", "--seeds", "3", "--jobs", "1", "--no-plots",
            "--policies", "fgd,bestfit", "--kss-compat"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    first = json.loads((tmp_path / "a" / "summary.json").read_text())
    second = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert first["kss_compat"] is True
    assert [p["allocation_at_end"] for p in first["policies"]] == [
        p["allocation_at_end"] for p in second["policies"]]
    assert (tmp_path / "a" / "allocation.csv").read_text() == (
        tmp_path / "b" / "allocation.csv").read_text()


def test_kss_compat_without_gpu_pods_is_bad_input(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "n.csv").write_text(NODES)
    (tmp_path / "p.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nc,500,100,0,0\n")
    code = main(["whatif", "--nodes", str(tmp_path / "n.csv"), "--pods", str(tmp_path / "p.csv"),
                 "--out", str(tmp_path / "o"), "--no-plots", "--jobs", "1", "--kss-compat"])
    assert code == 2
    assert "no pod asks for a GPU" in capsys.readouterr().err


def test_device_choice_runs_are_labelled_and_recorded(tmp_path: Path) -> None:
    code = main(["whatif", "--synthetic-nodes", "20", "--seeds", "1", "--out", str(tmp_path),
                 "--jobs", "1", "--no-plots", "--policies", "fgd,kube-default",
                 "--device-choice", "first-fit"])
    assert code == 0
    with (tmp_path / "allocation.csv").open() as handle:
        labels = [row[1] for row in list(csv.reader(handle))[1:]]
    assert labels == ["fgd/first-fit", "kube-default/first-fit"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["device_choice"] == "first-fit"


def test_a_default_run_records_no_device_choice(tmp_path: Path) -> None:
    assert main(["whatif", "--synthetic-nodes", "20", "--seeds", "1", "--out", str(tmp_path),
                 "--jobs", "1", "--no-plots", "--policies", "fgd"]) == 0
    assert "device_choice" not in json.loads((tmp_path / "summary.json").read_text())
