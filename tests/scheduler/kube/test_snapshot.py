"""Snapshot files: what export-snapshot writes and kubectl prints, read back the same."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from gpufrag.errors import BadInput
from scheduler.core import PodRequest
from scheduler.kube.convert import node_from_k8s, node_to_k8s, pod_from_k8s, pod_to_k8s
from scheduler.kube.export import main as export_main
from scheduler.kube.snapshot import read_snapshot, write_snapshot
from tests.builders import node, pod


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_write_then_read(tmp_path: Path, suffix: str) -> None:
    nodes = [node_to_k8s(node("n0")), node_to_k8s(node("n1", gpu_count=8))]
    pods = [pod_to_k8s(pod("p", namespace="ns"), node="n0", gpus=(1,))]
    path = tmp_path / f"snap{suffix}"
    assert write_snapshot(path, nodes, pods) == 3
    snapshot = read_snapshot(path)
    assert [n["metadata"]["name"] for n in snapshot.nodes] == ["n0", "n1"]
    assert pod_from_k8s(snapshot.pods[0]) == pod("p", namespace="ns")
    doc = orjson.loads(path.read_bytes()) if suffix == ".json" else yaml.safe_load(
        path.read_text())
    assert doc["kind"] == "List" and {i["kind"] for i in doc["items"]} == {"Node", "Pod"}


def test_kubectl_shapes(tmp_path: Path) -> None:
    # kubectl get nodes -o yaml: a NodeList whose items carry no kind; then a second document.
    path = tmp_path / "cluster.yaml"
    node_obj = node_to_k8s(node("n0"))
    del node_obj["kind"]
    hints = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "gpufrag-placement-hints", "namespace": "gpufrag-system"},
             "data": {}}
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "NodeList", "items": [node_obj]})
                    + "---\n" + yaml.safe_dump(pod_to_k8s(pod("p"))) + "---\n"
                    + yaml.safe_dump(hints) + "---\n"
                    + yaml.safe_dump({"kind": "List", "items": [{"kind": "Service"}]}))
    snapshot = read_snapshot(path)
    assert (len(snapshot.nodes), len(snapshot.pods), len(snapshot.configmaps)) == (1, 1, 1)
    assert snapshot.configmap("gpufrag-system", "gpufrag-placement-hints") is not None
    assert snapshot.configmap("other", "gpufrag-placement-hints") is None


@pytest.mark.parametrize(("name", "text", "message"), [
    ("bad.json", "{", "not valid JSON"),
    ("bad.yaml", "a: [", "not valid JSON or YAML"),
    ("list.json", "[1]", "document 0 is list, not an object"),
    ("kindless.json", '{"kind": "List", "items": [{"metadata": {}}]}',
     "field 'items[0].kind': item without kind"),
    ("other.json", '{"kind": "Deployment"}', "neither a List nor a Node or Pod"),
])
def test_bad_files_say_what_is_wrong(tmp_path: Path, name: str, text: str,
                                     message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(BadInput) as error:
        read_snapshot(path)
    assert message in str(error.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read"):
        read_snapshot(tmp_path / "nope.json")


@pytest.mark.parametrize("request_", [
    pod("whole", num_gpu=4, namespace="ns"),
    pod("share", gpu_milli=470, gpu_spec=frozenset({"T4", "V100M16"}), namespace="ns",
        model="llama", model_version="3"),
    pod("cpu", num_gpu=0, gpu_milli=0, cpu_milli=2500, memory_mib=100, namespace="ns"),
])
def test_core_types_round_trip_through_kubernetes_objects(request_: PodRequest) -> None:
    assert pod_from_k8s(pod_to_k8s(request_)) == request_
    spec = node("gpu-1", gpu_count=8, gpu_product="A100", gpu_memory_mib=81920,
                labels={"zone": "a"})
    back = node_from_k8s(node_to_k8s(spec))
    assert (back.name, back.cpu_milli, back.memory_mib, back.gpu_count, back.gpu_product,
            back.gpu_memory_mib, back.labels["zone"]) == (
        "gpu-1", spec.cpu_milli, spec.memory_mib, 8, "A100", 81920, "a")


@pytest.mark.parametrize("size", ["0", "-3", "many"])
def test_export_snapshot_refuses_a_bad_page_size_at_parsing(
        size: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 naming the flag, before any attempt to reach a cluster."""
    with pytest.raises(SystemExit) as exited:
        export_main([str(tmp_path / "out.json"), "--page-size", size,
                     "--kubeconfig", str(tmp_path / "no-such-kubeconfig")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--page-size" in err and repr(size) in err and "Traceback" not in err
