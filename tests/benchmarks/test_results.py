"""The results format (benchmarks/results.py): the verdict is computed from every figure with a
target, a file reads back as written, and a run writes it only when asked to."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import results
from benchmarks.results import Commit, Figure, Machine, Results, Target, verdict_of


def make_results(*figures: Figure, benchmark: str = "defrag_planner") -> Results:
    return Results(benchmark=benchmark, commit=Commit("0123456789abcdef", dirty=False),
                   machine=Machine(cores=2, cpu_model="a CPU", memory_mib=8192),
                   started_utc="2026-01-01T00:00:00+00:00", load_average_start=1.5,
                   load_average_end=2.0, arguments={"nodes": 5000}, figures=figures)


@pytest.mark.parametrize(("comparison", "value", "met"), [
    ("<=", 2.0, True), ("<=", 2.01, False), ("<", 2.0, False), ("<", 1.99, True),
    (">=", 2.0, True), (">=", 1.99, False), (">", 2.0, False), (">", 2.01, True),
])
def test_a_target_compares_the_value_with_its_bound(comparison: results.Comparison,
                                                    value: float, met: bool) -> None:
    assert Figure("x", value, "s", Target(comparison, 2.0)).met is met


def test_a_missed_sub_figure_makes_the_benchmark_missed() -> None:
    quoted = Figure("p99 at 5,000 nodes", 4.0, "ms", Target("<=", 5.0))
    other = Figure("p99 at 10,000 nodes", 12.0, "ms", Target("<=", 10.0))
    assert verdict_of([quoted]) == "met"
    assert verdict_of([quoted, other]) == "missed"
    assert make_results(quoted, other).verdict == "missed"


def test_figures_without_a_target_are_context_not_a_verdict() -> None:
    context = Figure("numpy form", 6.2, "s")
    assert verdict_of([context]) == "no target"
    assert verdict_of([context, Figure("c", 0.9, "s", Target("<=", 1.0))]) == "met"


def test_an_unknown_comparison_is_refused() -> None:
    with pytest.raises(ValueError, match="comparison must be one of"):
        Target("=~", 1.0)  # type: ignore[arg-type]


def test_a_file_reads_back_as_written_with_sorted_keys() -> None:
    written = make_results(Figure("plan", 0.3, "s", Target("<=", 2.0)), Figure("n", 5, ""))
    text = written.to_json()
    assert Results.from_json(text) == written
    record = json.loads(text)
    assert list(record) == sorted(record)
    assert record["verdict"] == "met" and record["figures"][0]["met"] is True
    assert "met" not in record["figures"][1]


def test_a_hand_edited_verdict_is_refused() -> None:
    record = json.loads(make_results(Figure("plan", 3.0, "s", Target("<=", 2.0))).to_json())
    record["verdict"] = "met"
    with pytest.raises(ValueError, match="the file says 'met' but its figures make it 'missed'"):
        Results.from_json(json.dumps(record))


def _parsed(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=results.REPO_ROOT / "x" / "openb")
    results.add_arguments(parser, "defrag_planner")
    return parser.parse_args(argv)


def test_a_run_writes_its_record_where_asked(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out.json"
    args = _parsed(["--results", str(path)])
    start = results.Start.now()
    results.record(args, "defrag_planner", start, [Figure("plan", 3.0, "s", Target("<=", 2.0))])
    written = Results.from_json(path.read_text(encoding="utf-8"))
    assert written.verdict == "missed" and written.started_utc == start.utc
    # Paths are kept relative, so no results file names the machine it ran on.
    assert written.arguments == {"data": "x/openb"}
    assert "verdict (every figure with a target): missed" in capsys.readouterr().out


def test_no_results_writes_nothing(tmp_path: Path) -> None:
    args = _parsed(["--no-results"])
    assert args.results == results.default_path("defrag_planner")
    results.record(args, "defrag_planner", results.Start.now(), [Figure("plan", 1.0, "s")])
    assert not any(tmp_path.iterdir())


def test_results_and_no_results_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parsed(["--no-results", "--results", "x.json"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_numpy_figure_is_written_as_a_plain_number() -> None:
    figure = Figure("sweep", np.float64(44.0), "s", Target("<=", 300.0))
    record = json.loads(make_results(figure).to_json())
    assert record["figures"][0] == {"name": "sweep", "value": 44.0, "unit": "s", "met": True,
                                    "target": {"comparison": "<=", "bound": 300.0}}
