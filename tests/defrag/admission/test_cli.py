"""``gpufrag admission`` refuses to start without what it needs, in one line (exit 2)."""

from __future__ import annotations

import pytest

from defrag.admission.cli import main
from gpufrag.errors import EXIT_BAD_INPUT


@pytest.mark.parametrize("argv", [[], ["--tls-cert-file=x"], ["--insecure-http",
                                                               "--lookup-timeout-s=0"],
                                  ["--insecure-http", "--port=70000"]])
def test_bad_flags_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("gpufrag admission:") and err.count("\n") == 1
