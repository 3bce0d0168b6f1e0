"""The published figures are the results files' (benchmarks/render.py): docs/benchmarks.md and
every marked block in the README and docs/ are what the committed results render, and a change
to either side alone fails here, naming the file, the line and the command that regenerates it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from benchmarks import render
from benchmarks.results import REPO_ROOT, Figure, Target
from tests.benchmarks.test_results import make_results


def test_the_committed_docs_are_what_the_committed_results_render() -> None:
    problems = render.differences()
    assert not problems, "\n".join(problems)


def test_the_readme_shows_the_rendered_summary() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert "<!-- benchmarks:begin -->" in readme and "<!-- benchmarks:end -->" in readme


def _checkout(tmp_path: Path, readme_block: str) -> tuple[Path, Path]:
    """A repository-shaped folder with one results file and a README block."""
    results_dir = tmp_path / "benchmarks" / "results"
    results_dir.mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (results_dir / "defrag_planner.json").write_text(make_results(
        Figure("plan, budget 10", 0.3, "s", Target("<=", 2.0)),
        Figure("plan, budget 100", 2.5, "s", Target("<=", 2.0))).to_json(), encoding="utf-8")
    (tmp_path / "README.md").write_text(
        f"# x\n\n<!-- benchmarks:begin -->\n{readme_block}<!-- benchmarks:end -->\ntail\n",
        encoding="utf-8")
    return tmp_path, results_dir


def test_a_stale_block_is_named_with_its_line_and_the_command(tmp_path: Path) -> None:
    root, results_dir = _checkout(tmp_path, "| typed by hand | 0.2 s | met |\n")
    problems = render.differences(root, results_dir)
    readme = next(p for p in problems if p.startswith("README.md:"))
    assert readme.startswith("README.md:4: differs from benchmarks/results")
    assert "typed by hand" in readme and "run `python -m benchmarks.render`" in readme
    assert any(p.startswith("docs/benchmarks.md:1:") for p in problems)  # not written yet


def test_rendered_files_pass_the_check_and_show_the_missed_sub_figure(tmp_path: Path) -> None:
    root, results_dir = _checkout(tmp_path, "")
    for path, text in render.rendered(root, results_dir).items():
        path.write_text(text, encoding="utf-8")
    assert render.differences(root, results_dir) == []
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert ("| [`defrag_planner`](docs/benchmarks.md#defrag_planner) | plan, budget 100 | "
            "2.5 s | ≤ 2 s | **missed** |") in readme
    assert readme.endswith("<!-- benchmarks:end -->\ntail\n")
    page = (root / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "Verdict: **missed** (computed from every figure with a target)" in page
    assert "no results recorded yet: run `python -m benchmarks.whatif_matrix`" in page


def test_a_transcribed_record_is_marked_as_not_re_run(tmp_path: Path) -> None:
    root, results_dir = _checkout(tmp_path, "")
    old = make_results(Figure("soak", 1.0, "h"), benchmark="deviceplugin_soak")
    transcribed = type(old)(**{**old.__dict__, "provenance": "transcribed",
                               "source": "README at commit 927c561"})
    (results_dir / "deviceplugin_soak.json").write_text(transcribed.to_json(), encoding="utf-8")
    rendered = render.rendered(root, results_dir)
    assert ("**Transcribed, not re-run**: copied from README at commit 927c561"
            in rendered[root / "docs" / "benchmarks.md"])
    assert "[`deviceplugin_soak`](docs/benchmarks.md#deviceplugin_soak) (transcribed)" in \
        rendered[root / "README.md"]


def test_a_block_naming_no_benchmark_is_refused(tmp_path: Path) -> None:
    root, results_dir = _checkout(tmp_path, "")
    (root / "docs" / "x.md").write_text("<!-- benchmarks:begin nosuch -->\n"
                                        "<!-- benchmarks:end -->\n", encoding="utf-8")
    with pytest.raises(ValueError, match="names 'nosuch', which is not a benchmark"):
        render.rendered(root, results_dir)


@pytest.mark.parametrize("name", render.benchmark_names())
def test_every_benchmark_writes_its_figures_through_the_results_format(name: str) -> None:
    """Read from the source, not imported: some benchmarks import what only a GPU machine
    has. A module that is no benchmark belongs in render.HELPERS."""
    source = (REPO_ROOT / "benchmarks" / f"{name}.py").read_text(encoding="utf-8")
    calls = {node.func.attr for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "results"}
    assert {"add_arguments", "record"} <= calls, (
        f"benchmarks/{name}.py: take --results with `results.add_arguments` and write its "
        "figures with `results.record`")
