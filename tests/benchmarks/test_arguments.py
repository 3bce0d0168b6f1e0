"""Bad arguments to the benchmarks added for issue 16 end with a usage error (exit 2) that
names what is wrong, before anything is built or started."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from benchmarks import (
    dra_device_choice,
    dra_throughput,
    fleet_scale,
    mig_extender_latency,
    preempt_latency,
    scheduling_throughput,
)


def _usage_error(main: Callable[[list[str]], int], argv: list[str],
                 capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_scheduling_throughput_names_an_unknown_row(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(scheduling_throughput.main, ["--rows", "default,fastest"], capsys)
    assert "unknown rows ['fastest']" in err and "gpufrag-decide-0.5ms" in err


def test_scheduling_throughput_needs_a_round(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(scheduling_throughput.main, ["--rounds", "0"], capsys)
    assert "--rounds must be at least 1" in err


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--nodes", "0"], ["--pods", "-1"]])
def test_dra_throughput_needs_a_cluster_pods_and_a_round(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(dra_throughput.main, argv, capsys)
    assert "--nodes, --pods and --rounds must be at least 1" in err


@pytest.mark.parametrize(("argv", "words"), [
    (["--sizes", "300,lots"], "--sizes must be node counts separated by commas, got '300,lots'"),
    (["--sizes", "0"], "--sizes must be 1..50000 nodes each"),
    (["--victims", "100"], "--victims 1..64"),
])
def test_preempt_latency_names_a_bad_argument(argv: list[str], words: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert words in _usage_error(preempt_latency.main, argv, capsys)


@pytest.mark.parametrize(("argv", "words"), [
    (["--nodes", "100,lots"], "--nodes must be counts 1..50000 separated by commas, got "
                              "'100,lots'"),
    (["--pods", "0"], "--pods must be counts 1..200000"),
    (["--nodes", "10,20", "--pods", "100"], "--nodes, --pods and --residents pair up: 2 node "
                                             "counts, 1 pod"),
    (["--residents", "-5"], "--residents must be counts 0..200000"),
    (["--nodes", "10", "--pods", "10", "--residents", "0,5"], "1 pod counts, 2 resident"),
    (["--max-demand", "1.5"], "--max-demand must be in (0, 1], got 1.5"),
    (["--seed", "x"], "--seed and --failover-kills integers"),
    (["--failover-kills", "-1"], "--failover-kills must be 0..100"),
    (["--arrivals-per-s", "0"], "--arrivals-per-s in (0, 1000.0]"),
])
def test_fleet_scale_names_a_bad_argument(argv: list[str], words: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(fleet_scale.main, argv, capsys)
    assert words in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("argv", "words"), [
    (["--sizes", "1000,lots"], "--sizes must be node counts separated by commas, got "
                               "'1000,lots'"),
    (["--sizes", "0"], "--sizes must be 1..20000 nodes each"),
    (["--requests", "0"], "--requests and --threads must be at least 1, got 0, 8"),
    (["--threads", "x"], "must be integers and --held a number, got '500', 'x', '1', '0.6'"),
    (["--held", "1.5"], "--held must be in [0, 1], got 1.5"),
])
def test_mig_extender_latency_names_a_bad_argument(argv: list[str], words: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(mig_extender_latency.main, argv, capsys)
    assert words in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("argv", "words"), [
    (["--traces", "default,gpushare55"], "--traces: unknown gpushare55; choose from default,"),
    (["--seeds", "0"], "--seeds must be 1..100, --jobs at least 1 and --hours in (0, 168]"),
    (["--loads", "0.9,lots"], "loads in (0, 2] separated by commas, got '0.9,lots'"),
])
def test_dra_device_choice_names_a_bad_argument(argv: list[str], words: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert words in _usage_error(dra_device_choice.main, argv, capsys)
