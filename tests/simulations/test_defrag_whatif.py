"""``gpufrag whatif --defrag`` on small synthetic clusters: output, figures, exit codes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from defrag.rightsizing.recommender import Mode, RightsizingConfig
from gpufrag.cli import main
from simulations import defrag_whatif
from simulations.defrag_whatif import (
    FrontierPoint,
    WhatIfResult,
    genai_fractions,
    plot_frontier,
    run_whatif,
    sampler,
    targets,
    with_gpu_memory,
)
from simulations.synthetic import synthetic_nodes, synthetic_pods

GIB = 1024**3


def genai_csv(tmp_path: Path) -> Path:
    path = tmp_path / "pod_gpu_memory_used_bytes_anon.csv"
    rows = ["timestamp_anon,value,container_ip"]
    rows += [f"1.0,{f * 48 * GIB:.1f},c{i}" for i, f in enumerate((0.2, 0.4, 0.5, 0.6, 1.2))]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_cli_writes_summary_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["whatif", "--defrag", "--synthetic-nodes", "40", "--cycles", "2",
                 "--genai-memory", str(genai_csv(tmp_path)), "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "free whole GPUs" in text and "evictions" in text and "usage from genai trace" in text
    summary = json.loads((out / "defrag_summary.json").read_text())
    for side in ("before", "after"):
        assert {"idle_ratio", "frag_ratio", "free_whole_gpus", "pending_pods"} <= set(
            summary[side])
    assert summary["pods"] > 0 and 0 <= summary["evictions"] <= 2 * max(1, summary["pods"] * 15
                                                                         // 1000)
    assert len(summary["cycles"]) == 2
    assert (out / "defrag.png").stat().st_size > 0


@pytest.fixture(scope="module")
def small() -> WhatIfResult:
    """60 synthetic nodes filled at random, 6 cycles every 15 min (the defaults)."""
    nodes = with_gpu_memory(synthetic_nodes(60, seed=0), 32)
    return run_whatif(nodes, synthetic_pods(600, seed=0), fill=0.85, seed=3)


def test_defrag_frees_whole_gpus_on_a_randomly_filled_cluster(small: WhatIfResult) -> None:
    result = small
    assert result.evictions > 0
    # The moves free whole GPUs (pending pods placed in the window may take some of them).
    first = result.cycles[0]
    assert first.free_whole_gpus_after_moves + first.pending_placed > (
        result.before.free_whole_gpus)
    assert result.after.frag_gpus < result.before.frag_gpus
    assert result.after.allocated_gpus >= result.before.allocated_gpus - sum(
        c.reclaimed_milli for c in result.cycles) / 1000
    assert result.usage_source.startswith("synthetic Beta")


def test_every_cycle_keeps_its_budgets(small: WhatIfResult) -> None:
    budget = max(1, int(small.pods * 0.015))
    for c in small.cycles:
        assert c.evicted == len(c.moves) <= budget
        per_node = Counter(m.source for m in c.moves)
        assert max(per_node.values(), default=0) <= 2
        # A node that received a pod is not drained in the same cycle.
        assert not {m.source for m in c.moves} & {m.target for m in c.moves}


def test_no_owner_moves_again_within_its_cooldown(small: WhatIfResult) -> None:
    last: dict[str, float] = {}
    for c in small.cycles:
        for m in c.moves:
            assert m.owner_uid not in last or c.at_s - last[m.owner_uid] >= 3600.0
            last[m.owner_uid] = c.at_s
    assert small.moved_twice == 0  # 6 cycles, 15 min apart: 75 min, one cooldown at most


def test_cycles_converge_when_nothing_is_worth_an_eviction() -> None:
    nodes = with_gpu_memory(synthetic_nodes(30, seed=0), 32)
    result = run_whatif(nodes, synthetic_pods(300, seed=0), fill=0.8, seed=5, cycles=10,
                        eviction_budget_pct=5.0)
    planned = [c.planned for c in result.cycles]
    assert planned[0] > 0 and planned[-1] == 0
    settled = result.settled_cycle
    assert settled is not None and result.cycles[settled - 1].convergence.settled
    assert "no move improves" in result.cycles[settled - 1].convergence.why


def test_auto_right_sizing_gives_memory_back_recommend_does_not() -> None:
    nodes = with_gpu_memory(synthetic_nodes(40, seed=0), 32)
    pods = synthetic_pods(400, seed=0)
    auto = run_whatif(nodes, pods, fill=0.85, seed=3, cycles=3)
    plain = run_whatif(nodes, pods, fill=0.85, seed=3, cycles=3, rightsizing=Mode.RECOMMEND)
    assert sum(c.rightsized for c in plain.cycles) == 0
    assert set(plain.cycles[0].admission_skips) == {"mode_recommend"}
    assert sum(c.rightsized for c in auto.cycles) > 0
    assert sum(c.cuts_idle for c in auto.cycles) > 0
    assert all(m.new_milli < m.gpu_milli for c in auto.cycles for m in c.moves
               if m.new_milli and "idle" in m.purposes)
    # Same usage at the same times: what right-sizing gives back shows in the idle memory.
    assert auto.after.idle_gib < plain.after.idle_gib
    assert auto.ceiling is not None and auto.ceiling.summary.idle_ratio < auto.before.idle_ratio


def test_reservations_keep_every_landing_on_its_target(small: WhatIfResult) -> None:
    assert all(c.committed for c in small.cycles)
    assert sum(c.landed_elsewhere for c in small.cycles) == 0
    assert sum(c.landed for c in small.cycles) == small.evictions


def test_targets_are_judged_on_the_figures(small: WhatIfResult) -> None:
    rows = {t.name: t for t in targets(small)}
    assert rows["pods moved twice"].met == (small.moved_twice == 0)
    assert rows["pods moved twice"].figure == str(small.moved_twice)
    assert rows["evictions in total"].figure.startswith(f"{small.evictions} (")
    assert rows["evictions in total"].met == (small.evictions <= 0.1 * small.pods)
    assert set(rows) >= {"idle ratio once settled", "free whole GPUs", "evictions in total",
                         "trigger off once settled"}


def test_the_new_targets_are_judged_on_their_figures(small: WhatIfResult) -> None:
    rows = {t.name: t for t in targets(small)}
    over = small.over_share
    assert rows["samples above the share (out of sample)"].met == (over.ratio <= 0.01)
    assert rows["over the share again after a raise"].met == (over.over_again == 0)
    assert rows["nodes flapping on/off/on"].met == (not small.flapped)
    assert rows["free whole GPUs"].goal == ">= +100%"


def test_a_frontier_point_carries_the_end_state_the_risk_and_the_bound(
        small: WhatIfResult, tmp_path: Path) -> None:
    point = FrontierPoint.of(RightsizingConfig(), small)
    assert (point.idle_ratio, point.free_whole_gpus) == (small.after.idle_ratio,
                                                         small.after.free_whole_gpus)
    assert small.ceiling is not None
    assert point.bound_idle_ratio == small.ceiling.summary.idle_ratio
    assert point.over_share_ratio == small.over_share.ratio
    assert "headroom  15% +  256 MiB: idle" in point.line()
    path = plot_frontier([point, point], tmp_path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_genai_fractions_and_sampler(tmp_path: Path) -> None:
    fractions = genai_fractions(genai_csv(tmp_path))
    np.testing.assert_allclose(fractions, [0.2, 0.4, 0.5, 0.6, 1.0])  # capped at the GPU
    draws = sampler(fractions, seed=1)(1000)
    assert set(np.round(draws, 6)) <= {0.2, 0.4, 0.5, 0.6, 1.0}
    beta = sampler(None, seed=1)(5000)
    assert 0.45 < beta.mean() < 0.51 and beta.min() >= 0 and beta.max() <= 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fill-policy", "magic"], "unknown policy 'magic'"),
        (["--policy", "random"], "random cannot predict"),
        (["--fill", "0"], "--fill"),
        (["--nodes", "x.csv"], "--nodes and --pods go together"),
        (["--genai-memory", "missing.csv"], "missing.csv: cannot read"),
        (["--max-evictions-total", "-2"], "--max-evictions-total"),
        (["--rightsizing-mode", "always"], "'always' is not one of off, recommend, auto"),
        (["--min-gain-gpus", "-1"], "--min-gain-gpus"),
        (["--whole-gpu-min-intervals", "0"], "--whole-gpu-min-intervals"),
        (["--cycle-interval-s", "0"], "--cycle-interval-s"),
        (["--cooldown-s", "-5"], "--cooldown-s"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--defrag", "--synthetic-nodes", "5", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_genai_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "g.csv"
    bad.write_text("timestamp_anon,value\n1,abc\n")
    assert main(["whatif", "--defrag", "--synthetic-nodes", "5", "--genai-memory", str(bad)]) == 2
    assert "row 2, field 'value': not a number" in capsys.readouterr().err


def test_without_the_default_memory_trace_the_fallback_says_where_it_looked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "genai" / "pod_gpu_memory_used_bytes_anon.csv"
    monkeypatch.setattr(defrag_whatif, "DEFAULT_GENAI", missing)
    assert main(["whatif", "--defrag", "--synthetic-nodes", "5", "--cycles", "0",
                 "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert f"no GenAI memory trace at {missing}: using the synthetic stand-in" in err
    assert "GPUFRAG_DATA_ROOT" in err
