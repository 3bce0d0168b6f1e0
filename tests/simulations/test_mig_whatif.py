"""simulations.mig_whatif: the same demand on a MIG fleet under whole GPUs, fixed layouts and
the advisor's, on clusters small enough to know the answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpufrag.cli import main
from scheduler.core.mig import MIG_MODELS
from scheduler.core.types import NodeSpec, PodRequest
from simulations.mig_whatif import mig_cluster, mig_pod, run_mig_whatif

A100_80 = MIG_MODELS["A100-80GB"]


def _node(name: str, product: str, gpus: int = 1, memory_mib: int = 0) -> NodeSpec:
    return NodeSpec(name, 64_000, 262_144, gpus, product, memory_mib)


def test_openb_s_eight_gpu_products_become_the_a100_class_and_the_rest_is_left_out() -> None:
    cluster = mig_cluster([_node("g2", "G2", 8), _node("g3", "G3", 8), _node("t4", "T4", 2),
                           _node("a40", "NVIDIA-A100-SXM4-40GB", 8, 40_960),
                           _node("cpu", "", 0)])
    assert [(n.name, n.model.family, n.gpus) for n in cluster] == [
        ("g2", "A100-80GB", 8), ("g3", "H100-80GB", 8), ("a40", "A100-40GB", 8)]


@pytest.mark.parametrize(("num_gpu", "gpu_milli", "memory_mib", "need"), [
    (1, 1000, 0, ("7g.80gb", 1)),
    (4, 1000, 0, ("7g.80gb", 4)),
    (1, 125, 0, ("1g.10gb", 1)),  # 10 GiB: exactly a one-slice 1g
    (1, 130, 0, ("1g.20gb", 1)),
    (1, 460, 0, ("3g.40gb", 1)),  # never a 4g.40gb: it has a 3g.40gb's memory
    (1, 600, 0, ("7g.80gb", 1)),
    (1, 100, 30_000, ("3g.40gb", 1)),  # a GPU-memory ask above the share wins
])
def test_a_pod_gets_the_smallest_profile_holding_its_memory(
        num_gpu: int, gpu_milli: int, memory_mib: int, need: tuple[str, int]) -> None:
    pod = PodRequest("p", 1000, 0, num_gpu, gpu_milli, gpu_memory_mib=memory_mib)
    assert mig_pod(pod, [A100_80]).needs == {"A100-80GB": need}


def test_small_shares_rank_the_modes_as_expected() -> None:
    # Two 80 GB GPUs and pods of a tenth of one (8 GiB: a one-slice 1g.10gb each), tuned to
    # 130% of capacity (26 pods). Whole GPUs hold 2 of them, 7 x 1g 14, the balanced cut 4,
    # 2 x 3g none; the advisor, seeing one profile, cuts 7 x 1g.
    pods = [PodRequest(f"p{i}", 1000, 0, 1, 100) for i in range(20)]
    result = run_mig_whatif([_node("a", "G2"), _node("b", "G3")], pods, workload="t",
                            tune=1.3, seed=7)
    runs = {r.mode: r for r in result.runs}
    assert {m: r.placed for m, r in runs.items()} == {
        "whole-gpu": 2, "all-1g.10gb": 14, "all-balanced": 4, "all-3g.40gb": 0, "advisor": 14}
    assert runs["advisor"].alloc_pct_at_100 == runs["advisor"].alloc_pct_at_end == 70.0
    assert runs["whole-gpu"].alloc_pct_at_end == 10.0
    assert runs["whole-gpu"].held_pct_at_end == 100.0 and runs["whole-gpu"].stranded_slices == 0
    assert runs["advisor"].stranded_slices == 2  # slice 7 of each GPU: no 1g starts there
    assert runs["all-3g.40gb"].stranded_slices == 16
    assert {layout.name for layout in result.advised.values()} == {"7x1g.10gb"}
    again = run_mig_whatif([_node("a", "G2"), _node("b", "G3")], pods, workload="t",
                           tune=1.3, seed=7)
    assert again == result  # seeded: the same figures every time


def test_no_mig_gpu_or_no_gpu_pod_is_bad_input() -> None:
    with pytest.raises(ValueError, match="no MIG-capable GPU node"):
        run_mig_whatif([_node("t", "T4")], [PodRequest("p", 1, 0, 1, 100)], workload="t",
                       tune=1.3, seed=1)
    with pytest.raises(ValueError, match="no pod asks for a GPU"):
        run_mig_whatif([_node("a", "G2")], [PodRequest("p", 1)], workload="t", tune=1.3, seed=1)


def test_the_cli_runs_synthetic_and_writes_the_advisor_s_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--mig", "--synthetic-nodes", "40", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "synthetic cluster (no trace given)" in out
    assert "| advisor |" in out and "| whole-gpu |" in out and "alloc@130%" in out
    summary = json.loads((tmp_path / "mig-summary.json").read_text())
    assert [r["mode"] for r in summary["runs"]] == [
        "whole-gpu", "all-1g.10gb", "all-balanced", "all-3g.40gb", "advisor"]
    config = yaml.safe_load((tmp_path / "mig-parted-config.yaml").read_text())
    labels = json.loads((tmp_path / "mig-config-labels.json").read_text())
    assert labels and set(labels.values()) <= set(config["mig-configs"])


@pytest.mark.parametrize(("args", "message"), [
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--tune", "0.5"], "--tune 0.5 outside [1, 10]"),
    (["--tune", "nan"], "--tune nan outside [1, 10]"),
    (["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    (["--seed", "-1"], "--seed -1 outside"),
    (["--synthetic-nodes", "0"], "--synthetic-nodes 0 outside"),
    (["--nodes", "x.csv"], "--nodes and --pods go together"),
    (["--nodes", "missing.csv", "--pods", "missing.csv"], "missing.csv: cannot read"),
])
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--mig", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
