"""The inspect benchmark's reference command reads a snapshot and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import snapshot_read
from scheduler.kube.convert import node_to_k8s
from scheduler.kube.snapshot import write_snapshot
from tests.builders import node


def test_it_reads_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    write_snapshot(path, [node_to_k8s(node("n0"))], [])
    assert snapshot_read.main([str(path)]) == 0


def test_it_needs_one_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert snapshot_read.main([]) == 2
    err = capsys.readouterr().err
    assert err == "snapshot_read: give one snapshot file\n"
