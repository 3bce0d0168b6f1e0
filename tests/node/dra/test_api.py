"""The committed stubs are what the committed protos generate, and the protos are upstream's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.dra import api
from tests import skips

API_DIR = Path(api.__file__).resolve().parent
KUBELET_MODULE = "k8s.io/kubelet@v0.36.3"
HEADER_LINES = 9  # the lines prepended to protoc's output (see each api_pb2.py)
PROTOS = {"dra/v1/api.proto": "pkg/apis/dra/v1/api.proto",
          "drahealth/v1alpha1/api.proto": "pkg/apis/dra-health/v1alpha1/api.proto",
          "pluginregistration/v1/api.proto": "pkg/apis/pluginregistration/v1/api.proto"}


@pytest.mark.parametrize("proto", sorted(PROTOS))
@pytest.mark.parametrize("name", ["api_pb2.py", "api_pb2.pyi"])
def test_committed_stubs_match_a_fresh_generation(tmp_path: Path, proto: str, name: str) -> None:
    skips.importorskip("grpc_tools", skips.NOT_INSTALLED,
                       "grpcio-tools (the dev extra) regenerates the stubs")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}",
                    f"--pyi_out={tmp_path}", proto], cwd=API_DIR, check=True)
    folder = Path(proto).parent
    committed = (API_DIR / folder / name).read_text().splitlines(keepends=True)
    assert committed[0] == "# ruff: noqa\n"
    assert "".join(committed[HEADER_LINES:]) == (tmp_path / folder / name).read_text()


@pytest.mark.parametrize("proto", sorted(PROTOS))
def test_vendored_protos_are_the_kubelets(proto: str) -> None:
    go = shutil.which("go")
    if go is None:
        skips.skip(skips.NO_GO, "the dev kit's module cache holds the upstream proto")
    cache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True,
                           check=True).stdout.strip()
    upstream = Path(cache, KUBELET_MODULE, PROTOS[proto])
    if not upstream.exists():
        subprocess.run([go, "mod", "download", KUBELET_MODULE], check=True,
                       cwd=API_DIR, capture_output=True)
    assert (API_DIR / proto).read_bytes() == upstream.read_bytes()


def test_the_glue_names_the_services_the_kubelet_calls() -> None:
    assert api.DRA_PLUGIN == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert api.REGISTRATION == "pluginregistration.Registration"
    assert api.DRA_HEALTH == "v1alpha1.DRAResourceHealth"  # the kubelet's healthClient path
    assert set(api.healthpb.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name
               ) == {"NodeWatchResources"} == set(api.HealthService.__dict__) & {
                   "NodeWatchResources"}
    assert set(api.drapb.DESCRIPTOR.services_by_name["DRAPlugin"].methods_by_name) == set(
        api.DraPluginService.__dict__) & {"NodePrepareResources", "NodeUnprepareResources"}
