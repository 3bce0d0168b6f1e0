"""benchmarks.mig_extender_latency: bad arguments end with a one-line usage error (exit 2)
naming what is wrong, before any cluster is built."""

from __future__ import annotations

import pytest

from benchmarks import mig_extender_latency


@pytest.mark.parametrize(("argv", "words"), [
    (["--sizes", "1000,lots"], "--sizes must be node counts separated by commas, got "
                               "'1000,lots'"),
    (["--sizes", "0"], "--sizes must be 1..20000 nodes each"),
    (["--requests", "0"], "--requests and --threads must be at least 1, got 0, 8"),
    (["--threads", "x"], "must be integers and --held a number, got '500', 'x', '1', '0.6'"),
    (["--held", "1.5"], "--held must be in [0, 1], got 1.5"),
])
def test_a_bad_argument_is_named(argv: list[str], words: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        mig_extender_latency.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
