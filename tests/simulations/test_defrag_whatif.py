"""``gpufrag whatif --defrag`` on small synthetic clusters: output, figures, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpufrag.cli import main
from simulations.defrag_whatif import genai_fractions, run_whatif, sampler, with_gpu_memory
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
        assert {"waste_ratio", "frag_ratio", "free_whole_gpus", "pending_pods"} <= set(
            summary[side])
    assert summary["pods"] > 0 and 0 <= summary["evictions"] <= 2 * max(1, summary["pods"] * 15
                                                                         // 1000)
    assert len(summary["cycles"]) == 2
    assert (out / "defrag.png").stat().st_size > 0


def test_defrag_frees_whole_gpus_on_a_randomly_filled_cluster() -> None:
    nodes = with_gpu_memory(synthetic_nodes(60, seed=0), 32)
    result = run_whatif(nodes, synthetic_pods(600, seed=0), fill=0.85, cycles=2, seed=3)
    assert result.evictions > 0
    assert result.evictions <= 2 * max(1, int(result.pods * 0.015))
    # The moves free whole GPUs (pending pods may then take some of them).
    assert result.cycles[0].free_whole_gpus_after_moves > result.before.free_whole_gpus
    assert result.after.frag_gpus < result.before.frag_gpus
    assert result.after.allocated_gpus >= result.before.allocated_gpus
    assert result.usage_source.startswith("synthetic Beta")


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
