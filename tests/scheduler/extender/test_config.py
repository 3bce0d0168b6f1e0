"""Configuration: defaults, YAML + environment + flags precedence, and validation errors that
name the exact field."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.extender.cli import main as extender_main
from scheduler.extender.config import (
    ConfigError,
    ExtenderConfig,
    config_from_mapping,
    config_to_mapping,
    load_config,
    parse_assignment,
)
from tests.scheduler.extender.helpers import Pki


def test_defaults_are_valid_and_round_trip() -> None:
    config = load_config(environ={})
    assert config == ExtenderConfig()
    assert config_from_mapping(config_to_mapping(config)) == config
    assert (config.policy, config.names.gpu, config.server.port) == ("fgd", "nvidia.com/gpu",
                                                                      8888)


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "extender.yaml"
    path.write_text("policy: bestfit\nweights: {affinity: 0.25}\n"
                    "affinity: {warm_window_s: 60, max_replicas_per_node: 3}\n"
                    "workload:\n  specs:\n  - {num_gpu: 1, gpu_milli: 500, popularity: 2}\n"
                    "  - {num_gpu: 2, gpu_spec: [A100, H100]}\n")
    env = {"GPUFRAG_EXTENDER__AFFINITY__WARM_WINDOW_S": "120",
           "GPUFRAG_EXTENDER__NAMES__LABEL_MODEL_VERSION": "1.10",
           "UNRELATED": "x"}
    config = load_config(path, environ=env, overrides=[("affinity.warm_window_s", "240"),
                                                       ("bind.enabled", "false")])
    assert config.policy == "bestfit"
    assert config.weights.affinity == 0.25 and config.weights.policy == 1.0
    assert config.affinity.warm_window_s == 240.0
    assert config.affinity.max_replicas_per_node == 3
    assert config.names.label_model_version == "1.10"  # a string field keeps the text
    assert config.bind.enabled is False
    assert [(s.num_gpu, s.gpu_milli, s.gpu_spec, s.popularity) for s in config.workload.specs] == [
        (1, 500, (), 2.0), (2, 1000, ("A100", "H100"), 1.0)]


@pytest.mark.parametrize(("data", "field", "message"), [
    ({"polcy": "fgd"}, "polcy", "unknown setting; known here: policy, seed"),
    ({"weights": {"affinty": 1}}, "weights.affinty", "known here: policy, affinity"),
    ({"policy": "fastest"}, "policy", "unknown policy 'fastest'; choose from random, dotprod"),
    ({"weights": {"policy": "high"}}, "weights.policy", "expected a number, got 'high'"),
    ({"weights": {"policy": 0, "affinity": 0}}, "weights", "cannot both be 0"),
    ({"weights": {"affinity": -1}}, "weights.affinity", "must be >= 0, got -1.0"),
    ({"affinity": {"warm": 1.5}}, "affinity.warm", "must be in 0..1, got 1.5"),
    ({"affinity": {"max_replicas_per_node": -2}}, "affinity.max_replicas_per_node",
     "must be >= 0 (0 = no cap)"),
    ({"affinity": {"cap_is_hard": "yes"}}, "affinity.cap_is_hard", "expected true or false"),
    ({"affinity": {"max_replicas_per_node": 2.5}}, "affinity.max_replicas_per_node",
     "expected an integer, got 2.5"),
    ({"workload": {"specs": [{"num_gpu": 2, "gpu_milli": 500}]}},
     "workload.specs[0].gpu_milli", "a GPU share (500 < 1000) needs num_gpu 1"),
    ({"workload": {"specs": [{"num_gpu": 1, "popularity": 0}]}},
     "workload.specs[0].popularity", "must be > 0"),
    ({"workload": {"specs": {"num_gpu": 1}}}, "workload.specs", "expected a list"),
    ({"workload": {"coverage": 0}}, "workload.coverage", "must be in (0, 1]"),
    ({"bind": {"assume_ttl_s": 0}}, "bind.assume_ttl_s", "must be > 0 seconds"),
    ({"filter": {"await_watch_s": 2}}, "filter.await_watch_s",
     "must be in [0, 1] seconds, got 2.0"),
    ({"filter": {"await_watch_s": -0.1}}, "filter.await_watch_s", "must be in [0, 1]"),
    ({"names": {"hints_configmap": ""}}, "names.hints_configmap", "must not be empty"),
    ({"watch": {"backoff_max_s": 0.1}}, "watch.backoff_max_s",
     "must be >= watch.backoff_initial_s (0.5)"),
    ({"watch": {"relist_s": 10}}, "watch.relist_s",
     "must be 0 (never) or >= watch.timeout_s (60.0), got 10"),
    ({"server": {"url_prefix": "gpufrag/"}}, "server.url_prefix",
     "must be empty or start with '/'"),
    ({"server": {"max_body_bytes": 10}}, "server.max_body_bytes", "must be >= 1024 bytes"),
    ({"server": {"port": 70000}}, "server.port", "must be in 1..65535"),
    ({"names": {"gpu": " "}}, "names.gpu", "is not a Kubernetes qualified name"),
    ({"names": {"gpu": ""}}, "names.gpu", "must not be empty"),
    ({"names": {"annotation_gpu_indices": "gpufrag.io/gpu indices"}},
     "names.annotation_gpu_indices", "is not a Kubernetes qualified name"),
    ({"names": {"label_model": "Example.COM/model"}}, "names.label_model",
     "prefix before '/' must be a DNS subdomain"),
    ({"names": {"label_model": "x" * 64}}, "names.label_model", "1-63 characters"),
    ({"server": "fast"}, "server", "expected a mapping, got 'fast'"),
    ({"server": {"read_timeout_s": 0}}, "server.read_timeout_s", "must be > 0 seconds"),
    ({"server": {"engine": "gunicorn"}}, "server.engine", "no longer a setting: the extender "
     "has one server"),
    ({"server": {"switch_interval_s": 0}}, "server.switch_interval_s", "must be > 0 and <= 0.1"),
    ({"server": {"switch_interval_s": 1}}, "server.switch_interval_s", "must be > 0 and <= 0.1"),
    ({"server": {"health_port": 8888}}, "server.health_port", "must differ from server.port"),
    ({"server": {"health_port": -1}}, "server.health_port", "or 0 for no separate health"),
    ({"server": {"tls_cert_file": "/etc/hostname"}}, "server.tls_key_file",
     "must be set too when server.tls_cert_file is"),
    ({"server": {"tls_key_file": "/etc/hostname"}}, "server.tls_cert_file",
     "must be set too when server.tls_key_file is"),
    ({"server": {"tls_client_ca_file": "/etc/hostname"}}, "server.tls_client_ca_file",
     "needs server.tls_cert_file and server.tls_key_file"),
    ({"dra": {"enabled": "yes"}}, "dra.enabled", "expected true or false"),
    ({"dra": {"driver": "GPU driver"}}, "dra.driver", "'GPU driver'"),
])
def test_invalid_settings_name_the_field(data: dict[str, object], field: str,
                                         message: str) -> None:
    with pytest.raises(ConfigError) as error:
        config_from_mapping(data)
    assert error.value.field == field
    assert f"field {field!r}: " in str(error.value)
    assert message in str(error.value)


def test_the_defaults_listen_on_loopback_only() -> None:
    server = ExtenderConfig().server
    assert (server.host, server.health_port, server.tls) == ("127.0.0.1", 0, False)


def test_tls_files_are_checked_at_load(pki: Pki, tmp_path: Path) -> None:
    good = {"tls_cert_file": str(pki.server_cert), "tls_key_file": str(pki.server_key),
            "tls_client_ca_file": str(pki.ca)}
    assert config_from_mapping({"server": good}).server.tls
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        ({"tls_key_file": str(tmp_path / "missing.key")}, "server.tls_key_file",
         "missing.key': No such file or directory"),
        ({"tls_key_file": str(pki.client_key)}, "server.tls_cert_file",
         "is not a usable PEM certificate and matching private key"),
        ({"tls_cert_file": str(garbage)}, "server.tls_cert_file", "is not a usable PEM"),
        ({"tls_client_ca_file": str(garbage)}, "server.tls_client_ca_file",
         "holds no usable PEM CA certificate"),
    ]
    for change, field, message in cases:
        with pytest.raises(ConfigError) as error:
            config_from_mapping({"server": {**good, **change}})
        assert error.value.field == field and message in str(error.value), str(error.value)


def test_several_problems_are_reported_together() -> None:
    with pytest.raises(ConfigError, match="2 problems: field 'policy': .*; field "
                                          "'bind.assume_ttl_s'"):
        config_from_mapping({"policy": "x", "bind": {"assume_ttl_s": -1}})


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("affinity:\n  warm: 7\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml, field 'affinity\.warm': must be in 0\.\.1"):
        load_config(path, environ={})
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top"):
        load_config(path, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", environ={})


def test_environment_and_set_errors_say_where_the_value_came_from() -> None:
    with pytest.raises(ConfigError, match="environment GPUFRAG_EXTENDER__SERVER__PORT"):
        load_config(environ={"GPUFRAG_EXTENDER__SERVER__PORT": "[unclosed"})
    with pytest.raises(ConfigError, match="is not PATH=VALUE"):
        parse_assignment("affinity.warm")


def test_cli_print_config_and_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert extender_main(["--print-config", "--policy", "bestfit", "--no-bind",
                          "--set", "affinity.warm_window_s=90", "--port", "9000"]) == 0
    out = capsys.readouterr().out
    assert "policy: bestfit" in out and "warm_window_s: 90.0" in out
    assert "enabled: false" in out and "port: 9000" in out
    assert extender_main(["--print-config", "--set", "weights.policy=-3"]) == 2
    assert "field 'weights.policy': must be >= 0, got -3.0" in capsys.readouterr().err


def test_cli_refuses_a_bad_snapshot_before_serving(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert extender_main(["--cluster-snapshot", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "List", "items": [')
    assert extender_main(["--cluster-snapshot", str(bad)]) == 2
    assert "bad.json: not valid JSON" in capsys.readouterr().err


NODE = '{"kind": "Node", "metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4"}}}'


@pytest.mark.parametrize(("name", "text", "message"), [
    ("nan.json", '{"kind": "List", "items": [' + NODE + ', {"x": NaN}]}', "not valid JSON"),
    ("inf.json", '{"kind": "List", "items": [{"x": -Infinity}]}', "not valid JSON"),
    ("big.json", '{"kind": "List", "items": [{"x": 1e400}]}', "not valid JSON"),
    ("deep.json", "[" * 5000 + "]" * 5000, "depth limit exceeded"),
    ("garbage.json", "\x00\x01garbage{", "not valid JSON"),
    ("garbage.yaml", "{[}: - :\n\t\x00", "not valid JSON or YAML"),  # a multi-line message
    ("deep.yaml", "items: " + "[" * 5000 + "]" * 5000, "not valid JSON or YAML"),
    ("scalar.yaml", "5\n", "document 0 is int, not an object"),
    ("odd-configmap.yaml", "kind: List\nitems:\n- kind: ConfigMap\n  metadata: 7\n",
     "not a usable cluster snapshot: AttributeError"),
])
def test_cli_refuses_a_garbled_snapshot_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str,
        message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert extender_main(["--cluster-snapshot", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gpufrag extender: {path}")
    assert message in err and "Traceback" not in err
