"""``gpufrag defrag`` flags and exit codes (the cycle itself runs in tests/e2e/test_defrag.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from defrag.controller.cli import build_parser, config_from
from gpufrag.cli import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threshold", "1.5"], "--threshold"),
        (["--rightsizing-percentile", "1.5"], "'--rightsizing-percentile': 1.5 must be in (0, 1]"),
        (["--rightsizing-min-mib", "-1"], "--rightsizing-min-mib"),
        (["--rightsizing-window-s", "10"], "--rightsizing-window-s"),
        (["--rightsizing-whole-gpu-min-intervals", "0"],
         "--rightsizing-whole-gpu-min-intervals"),
        (["--rightsizing-oom-bump-fraction", "-1"], "--rightsizing-oom-bump-fraction"),
        (["--rightsizing-oom-cooloff-s", "nan"], "--rightsizing-oom-cooloff-s"),
        (["--prometheus-peak-window-s", "1"], "--prometheus-peak-window-s"),
        (["--threshold", "abc"], "invalid float value: 'abc'"),
        (["--max-evictions-total", "-1"], "--max-evictions-total"),
        (["--max-evictions-per-node", "-3"], "--max-evictions-per-node"),
        (["--max-evictions-per-namespace", "x"], "invalid int value"),
        (["--max-pod-gpus", "0"], "--max-pod-gpus"),
        (["--max-mig-relabels", "-1"], "'--max-mig-relabels': -1 is outside 0..1000"),
        (["--policy", "magic"], "unknown policy 'magic'"),
        (["--policy", "random"], "random cannot predict"),
        (["--output", "xml"], "'xml' is not one of table, json"),
        (["--prometheus", "prometheus:9090"], "is not an http(s) URL"),
        (["--pushgateway", "ftp://gw"], "is not an http(s) URL"),
        (["--bind-timeout-s", "0"], "--bind-timeout-s"),
        (["--hint-ttl-s", "10"], "shorter than --bind-timeout-s"),
        (["--stale-intervals", "0"], "--stale-intervals"),
        (["--coverage", "2"], "--coverage"),
        (["--node-cooldown-s", "-1"], "'--node-cooldown-s': -1.0 is outside 0..604800"),
        (["--node-cooldown-s", "nan"], "--node-cooldown-s"),
        (["--max-evictions-per-day-pct", "101"], "'--max-evictions-per-day-pct': 101.0 is "
                                                 "outside 0..100"),
        (["--max-evictions-per-day-pct", "nan"], "--max-evictions-per-day-pct"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "no usable Kubernetes configuration"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["defrag", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["defrag", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--threshold", "--max-evictions-per-node", "--max-evictions-per-namespace",
                 "--max-evictions-total", "--max-priority", "--dry-run", "--output",
                 "--prometheus", "--pushgateway", "--max-mig-relabels",
                 "--node-cooldown-s", "--max-evictions-per-day-pct"):
        assert flag in out


def test_defaults_and_flags_make_the_config() -> None:
    args = build_parser().parse_args(["--threshold", "0.4", "--max-evictions-total", "3",
                                      "--exclude-namespaces", "a, b", "--dry-run",
                                      "--namespaces", "serving",
                                      "--pushgateway", "gw:9091"])
    config = config_from(args)
    assert (config.threshold, config.limits.total, config.limits.per_node) == (0.4, 3, 2)
    # No daily budget unless asked; a node cooldown of a day.
    assert (config.max_evictions_per_day_pct, config.node_cooldown_s) == (None, 86400.0)
    set_both = config_from(build_parser().parse_args(["--max-evictions-per-day-pct", "1",
                                                      "--node-cooldown-s", "0"]))
    assert (set_both.max_evictions_per_day_pct, set_both.node_cooldown_s) == (1.0, 0.0)
    assert config.excluded_namespaces == frozenset({"a", "b"}) and config.dry_run
    assert config.namespaces == frozenset({"serving"})


def test_unreachable_api_server_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    assert main(["defrag", "--kubeconfig", str(kubeconfig), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "stopped before acting: listing nodes: cannot reach the API server" in err
