"""benchmarks.procstat's peak RSS of a command: the child's own, not the parent's it was
forked with."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

from benchmarks.procstat import peak_rss_command, read_peak_rss_mib

HELD_MIB = 256


def test_a_command_reports_its_own_peak_not_its_big_parents(tmp_path: Path) -> None:
    held = b"x" * (HELD_MIB << 20)  # written, so resident in this (the parent) process
    data = tmp_path / "in.json"
    data.write_text(json.dumps({"a": [1, 2]}))
    report = str(tmp_path / "peak")
    process = subprocess.Popen([*peak_rss_command("json.tool", report), str(data)],
                               stdout=subprocess.PIPE)
    out = process.stdout.read() if process.stdout is not None else b""
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert json.loads(out) == {"a": [1, 2]}  # the module ran, with its arguments
    peak = read_peak_rss_mib(report)
    assert 1 < peak < HELD_MIB / 2  # a small interpreter's
    # What os.wait4 says of the same child carries the parent's memory: the reason.
    assert usage.ru_maxrss / 1024 >= HELD_MIB
    assert len(held) == HELD_MIB << 20


def test_a_missing_report_reads_as_nan(tmp_path: Path) -> None:
    assert math.isnan(read_peak_rss_mib(str(tmp_path / "none")))
