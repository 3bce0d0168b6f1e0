"""The openb loader: good files load, bad ones name the file, row and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrag.errors import BadInput
from simulations.openb import load_nodes, load_pods
from tests.data import trace

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\nn1,32000,131072,0,\n"
PODS = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"
        "p0,1000,2048,1,470,,LS\np1,4000,8192,2,1000,T4|V100M16,BE\np2,500,100,0,0,,LS\n")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_loads_nodes_and_pods(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, "n.csv", NODES))
    assert [(n.name, n.gpu_count, n.gpu_product) for n in nodes] == [("n0", 2, "T4"), ("n1", 0, "")]
    pods = load_pods(write(tmp_path, "p.csv", PODS), {"T4", "V100M16"})
    assert [(p.num_gpu, p.gpu_milli, p.gpu_spec) for p in pods] == [
        (1, 470, frozenset()), (2, 1000, frozenset({"T4", "V100M16"})), (0, 0, frozenset())]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sn,cpu_milli,memory_mib,gpu\nn0,1,1,1\n", r"n\.csv, row 1: missing column\(s\) model"),
        (NODES + "n2,-5,1,1,T4\n", r"row 4, field 'cpu_milli': -5 outside 0\.\."),
        (NODES + "n2,abc,1,1,T4\n", r"row 4, field 'cpu_milli': not a number: 'abc'"),
        (NODES + "n2,,1,1,T4\n", r"row 4, field 'cpu_milli': missing number"),
        (NODES + "n0,1,1,1,T4\n", r"row 4, field 'sn': duplicate node name 'n0'"),
        (NODES + "n3,1,1,2\n", r"row 4: expected 5 fields"),
        (NODES + "n3,1,1,2,\n", r"row 4, field 'model': GPU node without a GPU model"),
        (NODES + "n3,1,1,99,T4\n", r"field 'gpu': 99 outside 0..16"),
        ("sn,cpu_milli,memory_mib,gpu,model\n", r"no nodes"),
    ],
)
def test_bad_node_files(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        load_nodes(write(tmp_path, "n.csv", text))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("p3,1,1,1,0,,LS\n", r"row 5, field 'gpu_milli': a GPU pod needs gpu_milli > 0"),
        ("p3,1,1,2,500,,LS\n", r"row 5, field 'gpu_milli': 500 milli per GPU with 2 GPUs"),
        ("p3,1,1,1,1500,,LS\n", r"row 5, field 'gpu_milli': 1500 outside 0..1000"),
        ("p3,1,1,1,500,A100,LS\n", r"row 5, field 'gpu_spec': unknown GPU product\(s\) A100"),
        ("p3,1,x,1,500,,LS\n", r"row 5, field 'memory_mib': not a number"),
    ],
)
def test_bad_pod_rows(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        load_pods(write(tmp_path, "p.csv", PODS + extra), {"T4", "V100M16"})


def test_unreadable_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read"):
        load_nodes(tmp_path / "missing.csv")
    bad = tmp_path / "bin.csv"
    bad.write_bytes(b"sn,cpu_milli,memory_mib,gpu,model\n\xff\xfe,1,1,1,T4\n")
    with pytest.raises(BadInput, match="not UTF-8"):
        load_nodes(bad)


def test_a_nul_byte_is_refused_with_its_row(tmp_path: Path) -> None:
    """csv would keep the NUL inside the pod's name and the replay would go on without a word."""
    with pytest.raises(BadInput, match=r"row 5: NUL byte at byte 1 of the line"):
        load_pods(write(tmp_path, "p.csv", PODS + "p\x003,1,1,1,500,,LS\n"), {"T4", "V100M16"})


def test_real_openb_files_load() -> None:
    nodes = load_nodes(trace("openb", "openb_node_list_gpu_node.csv"))
    assert len(nodes) == 1213 and sum(n.gpu_count for n in nodes) == 6212
    products = {n.gpu_product for n in nodes}
    for variant in ("default", "cpu050", "gpushare40", "gpuspec33", "multigpu20"):
        pods = load_pods(trace("openb", f"openb_pod_list_{variant}.csv"), products)
        assert pods
