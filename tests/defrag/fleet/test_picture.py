"""``gpufrag inspect --plot FILE``: one row per node, one bar per GPU, the nodes over the trigger
marked; compact at fleet scale; a bad FILE refused before anything is read, nothing partial."""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from defrag.fleet import picture
from defrag.fleet.cli import main
from gpufrag.plotting import PLOT_EXTRA
from tests.gpufrag.test_plotting import hide_matplotlib

SVG = "{http://www.w3.org/2000/svg}"


def _fleet(nodes: int, seed: int = 0) -> dict[str, Any]:
    """An inspect document of ``nodes`` 8-GPU nodes, GPU shares and peaks drawn at random;
    every seventh node over the trigger."""
    rng = np.random.default_rng(seed)
    return {"threshold": 0.25, "nodes": [
        {"node": f"gpu-{i:05d}", "gpu_memory_mib": 81_920,
         "trigger": "over" if i % 7 == 0 else "under",
         "gpus": [{"free_milli": int(free), "peak_mib": None if i % 50 == 0 else int(peak)}
                  for free, peak in zip(rng.choice([0, 250, 500, 1000], 8),
                                        rng.uniform(0, 81_920 * 0.7, 8), strict=True)]}
        for i in range(nodes)]}


def test_an_svg_has_a_row_per_node_and_a_mark_per_node_over_the_trigger(
        snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet.svg"
    assert main(["--snapshot", str(snapshot), "--plot", str(out)]) == 0
    assert "wrote" in capsys.readouterr().err
    root = ET.parse(out).getroot()
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert texts.count("n0") == 1 and texts.count("n1") == 1
    assert any(t and t.startswith("GPUs of cluster.json at 2026-01-01T00:00:00Z") for t in texts)
    (marks,) = [g for g in root.iter(f"{SVG}g") if g.get("id") == picture.MARK_GID]
    assert len(list(marks.iter(f"{SVG}use"))) == 1  # n0 only
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.json", "fleet.svg"]


def test_the_bars_form_draws_each_node_over_the_trigger_and_none_else(tmp_path: Path) -> None:
    doc = _fleet(30)
    drawn = picture.draw(doc, tmp_path / "f.svg", cluster="c", at="t")
    root = ET.parse(drawn.path).getroot()
    (marks,) = [g for g in root.iter(f"{SVG}g") if g.get("id") == picture.MARK_GID]
    assert (drawn.form, drawn.nodes, drawn.marked) == ("bars", 30, 5)
    assert len(list(marks.iter(f"{SVG}use"))) == 5
    names = {t.text for t in root.iter(f"{SVG}text")}
    assert all(n["node"] in names for n in doc["nodes"])


def test_5000_nodes_switch_to_strips_and_stay_small_and_quick(tmp_path: Path) -> None:
    doc = _fleet(5000)
    started = time.perf_counter()
    drawn = picture.draw(doc, tmp_path / "fleet.png", cluster="big", at="now")
    seconds = time.perf_counter() - started
    image = __import__("matplotlib.image", fromlist=["imread"]).imread(drawn.path)
    assert (drawn.form, drawn.marked) == ("strips", 715)
    # five panels of 1,000 one-pixel node rows: at least that many pixel rows
    assert image.shape[0] >= picture.PANEL_ROWS
    assert drawn.size_bytes < 2_000_000, drawn.size_bytes
    assert seconds < 60, seconds
    print(f"5,000 nodes: {seconds:.2f} s, {drawn.size_bytes:,} bytes, {image.shape}")


def test_the_strip_rows_carry_each_part_and_the_mark() -> None:
    split = np.array([[0.5, 0.25, 0.0, 0.25]])  # used, idle, unread, free
    image = picture.strip_image([split], [True], 1)
    row = image[0]
    assert (row[0] == picture.rgb(picture.MARK_COLOUR)).all()
    gpu = row[picture.MARK_PX:]
    colours = [tuple(c) for c in gpu[:-1]]
    used, idle, free = (tuple(picture.rgb(c)) for c in
                        (picture.COLOURS[0], picture.COLOURS[1], picture.COLOURS[3]))
    assert colours == [used] * 6 + [idle] * 3 + [free] * 2
    assert (picture.strip_image([split], [False], 1)[0, 0] == 255).all()


@pytest.mark.parametrize("name, says", [
    ("fleet.pdf", "suffix '.pdf'"), ("fleet", "suffix '(none)'"),
    ("missing/fleet.png", "does not exist"), ("cluster.json/fleet.png", "does not exist")])
def test_a_bad_file_is_exit_2_before_reading_and_leaves_nothing(
        snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str, says: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["--snapshot", str(snapshot), "--plot", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpufrag inspect: ") and says in err and "--plot" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_failure_while_writing_leaves_nothing_partial(
        snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def half_written(fig: Any, out: Path, name: str) -> Path:
        (out / name).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(picture, "save_figure", half_written)
    assert main(["--snapshot", str(snapshot), "--plot", str(tmp_path / "f.png")]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.json"]


def test_without_matplotlib_a_plot_is_refused_naming_the_extra(snapshot: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "f.png"
    result = subprocess.run(
        [sys.executable, "-m", "gpufrag.cli", "inspect", "--snapshot", str(snapshot),
         "--plot", str(out)], env=hide_matplotlib(tmp_path), capture_output=True, text=True,
        timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gpufrag inspect: cannot plot: matplotlib cannot be")
    assert f"pip install 'gpufrag[{PLOT_EXTRA}]'" in result.stderr and not out.exists()
