"""Settings are validated once, naming the field to fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from node.deviceplugin.config import DevicePluginConfig, Kind, parse_kinds


@pytest.mark.parametrize(("overrides", "field"), [
    ({"node_name": ""}, "node_name"),
    ({"node_name": "Node_1"}, "node_name"),
    ({"node_name": "n" * 254}, "node_name"),
    ({"socket_dir": "relative/dir"}, "socket_dir"),
    ({"socket_dir": "/" + "d" * 100}, "socket_dir"),
    ({"kubelet_socket": "sub/kubelet.sock"}, "kubelet_socket"),
    ({"kinds": ()}, "resources"),
    ({"kinds": (Kind.WHOLE, Kind.WHOLE)}, "resources"),
    ({"health_interval_s": 0}, "health_interval_s"),
    ({"watch_interval_s": -1}, "watch_interval_s"),
    ({"mps_pipe_dir": "/run/mps"}, "mps_pipe_dir"),
    ({"mps": True, "mps_pipe_dir": "run/mps"}, "mps_pipe_dir"),
    ({"annotation_allocated": "not a key!"}, "annotation_allocated"),
    ({"names": KubeNames(gpu="gpu")}, "names.gpu"),
])
def test_bad_settings_name_their_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(BadInput) as raised:
        DevicePluginConfig(**{"node_name": "n", **overrides}).validate()
    assert raised.value.field == field


@pytest.mark.parametrize("field", ["socket_dir", "dev_root"])
def test_a_directory_that_does_not_exist_is_refused_at_start(tmp_path: Path,
                                                             field: str) -> None:
    """Not waited for: a missing kubelet directory or /dev is a wrong mount or flag."""
    dirs = {"socket_dir": str(tmp_path), "dev_root": str(tmp_path)}
    config = DevicePluginConfig(node_name="n", **{**dirs, field: str(tmp_path / "missing")})
    with pytest.raises(BadInput, match="is not a directory") as raised:
        config.validate().require_paths()
    assert raised.value.field == field
    DevicePluginConfig(node_name="n", **dirs).validate().require_paths()


def test_defaults_are_valid_and_name_the_sockets() -> None:
    config = DevicePluginConfig(node_name="n").validate()
    assert config.kubelet_socket_path == "/var/lib/kubelet/device-plugins/kubelet.sock"
    assert config.socket_path(Kind.SHARE) == "/var/lib/kubelet/device-plugins/gpufrag-share.sock"
    assert [config.resource(k) for k in config.kinds] == ["nvidia.com/gpu",
                                                          "gpufrag.io/gpu-milli"]


def test_resources_flag() -> None:
    assert parse_kinds("share") == (Kind.SHARE,)
    assert parse_kinds("whole, share") == (Kind.WHOLE, Kind.SHARE)
    with pytest.raises(BadInput, match="'gpus': choose from whole"):
        parse_kinds("gpus")
