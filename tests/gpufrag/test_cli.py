"""The ``gpufrag`` command itself: version, unknown commands, bad input from any subcommand."""

from __future__ import annotations

import importlib

import pytest

from gpufrag import cli, logs
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_OK, BadInput


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out.strip() == f"gpufrag {cli.version()}"


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == EXIT_BAD_INPUT
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize(("level", "env", "field"), [
    ("bogus", None, "--log-level"),
    (None, "loud", "environment GPUFRAG_LOG_LEVEL"),
])
def test_unknown_log_level_is_bad_input(level: str | None, env: str | None, field: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if env is not None:
        monkeypatch.setenv("GPUFRAG_LOG_LEVEL", env)
    with pytest.raises(BadInput, match="unknown log level") as e:
        logs.configure(level)
    assert e.value.field == field


def test_a_subcommand_bad_log_level_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["defrag", "--log-level", "bogus", "--dry-run"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "unknown log level 'bogus'" in err[0]


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_module_imports(name: str) -> None:
    module = importlib.import_module(cli.COMMANDS[name][0])
    assert callable(module.main)
