"""gpufrag/plotting.py: where matplotlib cannot be imported (the images leave it out), the
what-if still writes its tables and says in one line that the plots were skipped and how to get
them; a plot asked for directly fails naming the extra. Run in a child process whose path puts
an unimportable ``matplotlib`` first: the real CLI, with matplotlib really not importable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufrag.plotting import PLOT_EXTRA, missing_reason, plots_wanted

REPO = Path(__file__).resolve().parents[2]


def hide_matplotlib(tmp_path: Path) -> dict[str, str]:
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), str(REPO)])}


def test_whatif_without_matplotlib_writes_its_tables_and_says_the_plots_were_skipped(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "gpufrag.cli", "whatif", "--synthetic-nodes", "20", "--seeds",
         "1", "--jobs", "1", "--policies", "fgd", "--out", str(out)],
        env=hide_matplotlib(tmp_path), capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    skipped = [line for line in result.stderr.splitlines() if "plots skipped" in line]
    assert len(skipped) == 1, result.stderr
    assert skipped[0].startswith("gpufrag whatif: plots skipped: matplotlib cannot be imported")
    assert f"pip install 'gpufrag[{PLOT_EXTRA}]'" in skipped[0]
    assert (out / "allocation.csv").stat().st_size > 0 and (out / "summary.json").is_file()
    assert list(out.glob("*.png")) == []
    assert ".png" not in result.stdout  # the closing line names only what was written


def test_the_sweep_job_without_matplotlib_says_so_once_at_the_merge(tmp_path: Path) -> None:
    # The cluster image's Indexed Job: shards write runs only (no word about plots), the merge
    # writes comparison.csv and says the plot was skipped.
    env, out = hide_matplotlib(tmp_path), tmp_path / "sweep"
    small = ["--synthetic-nodes", "12", "--genai", "synthetic", "--set", "hours=2", "--set",
             "serving_models=2", "--set", "serving_peak_rps=600", "--policies", "fgd,bestfit",
             "--jobs", "1", "--out", str(out)]
    for shard in ("0/2", "1/2"):
        result = subprocess.run([sys.executable, "-m", "gpufrag.cli", "whatif", "sweep", *small,
                                 "--shard", shard], env=env, capture_output=True, text=True,
                                timeout=300, check=False)
        assert result.returncode == 0, result.stderr
        assert "plot" not in result.stderr
    merged = subprocess.run([sys.executable, "-m", "gpufrag.cli", "whatif", "merge", str(out)],
                            env=env, capture_output=True, text=True, timeout=300, check=False)
    assert merged.returncode == 0, merged.stderr
    assert merged.stderr.count("gpufrag whatif merge: plots skipped: ") == 1
    assert (out / "comparison.csv").stat().st_size > 0 and not (out / "timeline.png").exists()
    assert "timeline.png" not in merged.stdout


def test_a_plot_asked_for_without_matplotlib_fails_naming_the_extra(tmp_path: Path) -> None:
    code = ("from gpufrag.plotting import PlottingUnavailable, pyplot\n"
            "try:\n    pyplot()\nexcept PlottingUnavailable as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code], env=hide_matplotlib(tmp_path),
                            capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.startswith("cannot plot: matplotlib cannot be imported")
    assert f"gpufrag[{PLOT_EXTRA}]" in result.stdout


def test_with_matplotlib_plots_are_drawn_unless_turned_off(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert missing_reason() is None  # a pip install has it (requirements/plot.in)
    assert plots_wanted(False, "x") is True
    assert plots_wanted(True, "x") is False
    assert capsys.readouterr().err == ""
