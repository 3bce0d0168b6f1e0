"""The GenAI memory samples go through the traces' one bounded CSV reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrag.errors import BadInput
from simulations.defrag_whatif import GENAI_FILE, genai_fractions
from tests.data import trace

HEADER = b"timestamp_anon,value,container_ip\n"


def _write(tmp_path: Path, body: bytes) -> Path:
    path = tmp_path / "memory.csv"
    path.write_bytes(body)
    return path


def test_samples_become_capped_fractions(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + b"1,0,a\n2,40e9,b\n3,1e12,c\n")
    fractions = genai_fractions(path, gpu_gib=80)
    assert fractions.tolist() == pytest.approx([0.0, 40e9 / (80 * 1024**3), 1.0])


@pytest.mark.parametrize(("body", "message", "row"), [
    (HEADER + b"1,nan,a\n", "not a number", 2),
    (HEADER + b"1,inf,a\n", "not a number", 2),
    (HEADER + b"1,-5,a\n", "outside 0..", 2),
    (HEADER + b"1,1e400,a\n", "outside 0..", 2),
    (HEADER + b"1,\xff\xfe,a\n", "not UTF-8", 2),
    (b"timestamp_anon,container_ip\n1,a\n", r"missing column\(s\) value", 1),
    (HEADER, "no samples", None),
])
def test_bad_samples_name_file_row_and_field(tmp_path: Path, body: bytes, message: str,
                                             row: int | None) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(BadInput, match=message) as e:
        genai_fractions(path)
    assert e.value.source == str(path)
    assert e.value.row == row
    assert "\n" not in str(e.value)


def test_shared_trace_reads() -> None:
    fractions = genai_fractions(trace("genai", GENAI_FILE))
    assert fractions.size > 100_000
    assert 0.0 <= float(fractions.min()) <= float(fractions.max()) <= 1.0
