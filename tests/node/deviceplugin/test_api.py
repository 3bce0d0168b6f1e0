"""The committed stubs are what the committed proto generates, and the proto is upstream's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.deviceplugin import api
from node.deviceplugin.api.v1beta1 import api_pb2
from tests import skips

API_DIR = Path(api.__file__).resolve().parent
KUBELET_MODULE = "k8s.io/kubelet@v0.36.3"
HEADER_LINES = 10  # the lines prepended to protoc's output (see api_pb2.py)


@pytest.mark.parametrize("name", ["api_pb2.py", "api_pb2.pyi"])
def test_committed_stubs_match_a_fresh_generation(tmp_path: Path, name: str) -> None:
    skips.importorskip("grpc_tools", skips.NOT_INSTALLED,
                       "grpcio-tools (the dev extra) regenerates the stubs")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}",
                    f"--pyi_out={tmp_path}", "v1beta1/api.proto"], cwd=API_DIR, check=True)
    committed = (API_DIR / "v1beta1" / name).read_text().splitlines(keepends=True)
    assert committed[0] == "# ruff: noqa\n"
    assert "".join(committed[HEADER_LINES:]) == (tmp_path / "v1beta1" / name).read_text()


def test_vendored_proto_is_the_kubelets() -> None:
    go = shutil.which("go")
    if go is None:
        skips.skip(skips.NO_GO, "the dev kit's module cache holds the upstream proto")
    cache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True,
                           check=True).stdout.strip()
    upstream = Path(cache, KUBELET_MODULE, "pkg/apis/deviceplugin/v1beta1/api.proto")
    if not upstream.exists():
        subprocess.run([go, "mod", "download", KUBELET_MODULE], check=True,
                       cwd=API_DIR, capture_output=True)
    assert (API_DIR / "v1beta1" / "api.proto").read_bytes() == upstream.read_bytes()


def test_the_glue_serves_every_method_of_the_proto() -> None:
    methods = set(api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name)
    assert methods == set(api.DevicePluginService.__dict__) & methods
    assert api.DEVICE_PLUGIN == "v1beta1.DevicePlugin"
    assert api.REGISTRATION == "v1beta1.Registration"
