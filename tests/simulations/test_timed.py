"""Pods with times, the GenAI series, and the bad input both must refuse in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrag.cli import main
from gpufrag.errors import BadInput
from simulations.genai import load_serving_trace, read_demand, synthetic_serving_trace
from simulations.timed import (
    TimedPod,
    copies_for_load,
    load_timed_pods,
    mean_demand_milli,
    synthetic_timed,
    window,
)
from tests import data
from tests.builders import pod

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time"
NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\nn1,32000,131072,1,T4\n"


def _pods(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    path = tmp_path / "pods.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_times_and_models_are_read(tmp_path: Path) -> None:
    path = _pods(tmp_path, "a,1000,1024,1,500,,0,100,,", "b,1000,1024,0,0,,5,5,,",
                 "c,1000,1024,1,1000,,7,70,sd,M0001",
                 header=HEADER + ",model,model_version")
    timed = load_timed_pods(path, {"T4"}, {"M0001"})
    assert [(t.pod.name, t.arrive_s, t.leave_s) for t in timed] == [
        ("a", 0, 100), ("b", 5, 5), ("c", 7, 70)]
    assert (timed[2].pod.model, timed[2].pod.model_version) == ("sd", "M0001")


@pytest.mark.parametrize(("rows", "row", "field", "message"), [
    (["a,1000,1024,1,500,,,100"], 2, "creation_time", "missing number"),
    (["a,1000,1024,1,500,,0,"], 2, "deletion_time", "missing number"),
    (["a,1000,1024,1,500,,10,20", "b,1000,1024,1,500,,5,20"], 3, "creation_time",
     "before the previous row's 10; sort the trace"),
    (["a,1000,1024,1,500,,10,5"], 2, "deletion_time", "before creation_time 10"),
    (["a,1000,1024,1,500,,-1,5"], 2, "creation_time", "outside 0.."),
    (["a,1000,1024,1,500,,x,5"], 2, "creation_time", "not a number"),
    (["a,1000,1024,1,500,,1,5,sd,M9999"], 2, "model_version", "unknown model version 'M9999'"),
    (["a,1000,1024,1,500,,1,5,,M0001"], 2, "model", "model_version without a model"),
])
def test_bad_times_and_versions_name_file_row_and_field(
        tmp_path: Path, rows: list[str], row: int, field: str, message: str) -> None:
    path = _pods(tmp_path, *rows, header=HEADER + ",model,model_version" if any(
        r.count(",") == 9 for r in rows) else HEADER)
    with pytest.raises(BadInput, match=message) as e:
        load_timed_pods(path, {"T4"}, {"M0001"})
    assert (e.value.source, e.value.row, e.value.field) == (str(path), row, field)
    assert "\n" not in str(e.value)


def test_missing_time_columns(tmp_path: Path) -> None:
    path = _pods(tmp_path, "a,1000,1024,1,500", header="name,cpu_milli,memory_mib,num_gpu,"
                 "gpu_milli")
    with pytest.raises(BadInput, match=r"missing column\(s\) creation_time, deletion_time"):
        load_timed_pods(path)


@pytest.mark.parametrize(("row", "message"), [
    ("a,1000,1024,1,500,,10,5", "row 2, field 'deletion_time': deletion_time 5 is before"),
    ("a,1000,1024,1,500,,,5", "row 2, field 'creation_time': missing number"),
])
def test_sweep_exits_2_with_one_line(tmp_path: Path, row: str, message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    path = _pods(tmp_path, "z,1000,1024,1,500,,0,5", row.replace("a,", "y,"))
    code = main(["whatif", "sweep", "--nodes", str(tmp_path / "nodes.csv"), "--pods",
                 str(path), "--genai", "synthetic", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert str(path) in lines[0] and message.replace("row 2", "row 3") in lines[0]


def test_window_copies_and_load() -> None:
    trace = [TimedPod(pod("long", gpu_milli=1000), 0.0, 1000.0),
             TimedPod(pod("short", gpu_milli=500), 400.0, 500.0)]
    assert mean_demand_milli(trace, 1000.0) == pytest.approx((1000 * 1000 + 500 * 100) / 1000)
    got = window(trace, 450.0, 100 / 3600)
    assert [(t.pod.name, t.arrive_s, t.leave_s) for t in got] == [
        ("long", 0.0, 550.0), ("short", 0.0, 50.0)]
    # the period is 401 s (first to last creation, plus 1): one copy holds 2.62 GPUs
    copies = copies_for_load(trace, capacity_milli=8000, load=0.5)
    assert copies == 2
    tiled = window(trace, 0.0, 1000 / 3600, copies=3, seed=1)
    names = [t.pod.name for t in tiled]
    assert len(set(names)) == len(names) and {"long-c1", "long-c2"} <= set(names)
    assert all(0 <= t.arrive_s < 1000 for t in tiled)
    assert window(trace, 0.0, 1.0, copies=3, seed=1) == window(trace, 0.0, 1.0, copies=3,
                                                                seed=1)
    with pytest.raises(BadInput, match="needs .* copies"):
        copies_for_load(trace, capacity_milli=10**9, load=1.0)


def test_synthetic_workload_holds_about_the_load() -> None:
    capacity = 400_000
    timed = synthetic_timed(capacity, 24, 0.6, seed=3)
    assert timed == synthetic_timed(capacity, 24, 0.6, seed=3)
    start_demand = sum(t.pod.gpu_demand_milli for t in timed if t.arrive_s == 0)
    assert 0.3 * capacity < start_demand < 0.9 * capacity
    assert all(t.leave_s is not None and t.leave_s > t.arrive_s for t in timed)


QPS = "timestamp_anon,value,container_ip,request_type\n"


@pytest.mark.parametrize(("body", "row", "field", "message"), [
    (QPS + "10,1,a,x\n5,1,b,x\n", 3, "timestamp_anon", "before the previous row's 10"),
    (QPS + ",1,a,x\n", 2, "timestamp_anon", "missing number"),
    (QPS + "10,nan,a,x\n", 2, "value", "not a number"),
])
def test_bad_demand_series(tmp_path: Path, body: str, row: int, field: str,
                           message: str) -> None:
    path = tmp_path / "qps.csv"
    path.write_text(body)
    with pytest.raises(BadInput, match=message) as e:
        read_demand(path)
    assert (e.value.row, e.value.field) == (row, field)


def test_demand_sums_pods_per_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "qps.csv"
    path.write_text(QPS + "100,1,a,x\n100,2,b,x\n157,0.5,a,x\n")
    t, rps = read_demand(path)
    assert t.tolist() == [0, 57] and rps.tolist() == [3, 0.5]


def test_serving_trace_shape() -> None:
    trace = synthetic_serving_trace(0)
    assert trace.cold_start_s.min() >= 10 > trace.warm_start_s.max()
    names, share = trace.top(3)
    assert names == ("M0000", "M0001", "M0002") and share.sum() == pytest.approx(1.0)
    assert trace.rps_at(0.0) == trace.rps_at(trace.period_s)  # it repeats


def test_shared_serving_trace_shape() -> None:
    real = load_serving_trace(data.trace("genai"))
    assert real.versions[0] == "M0002" and real.unversioned_requests == 25
    assert float(real.curve_rps.min()) >= 0.09 and float(real.curve_rps.max()) < 10
    assert real.period_s == pytest.approx(22.3 * 3600, rel=0.01)
    assert np.all((real.duty >= 0) & (real.duty <= 1))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["a", "0", "5", "1e3", "-1", "", ",", "\n", "nan", "10", "x,y",
                                 "1000", "470", "T4", "|", '"', "\r\n", "2.5", "\xff"]),
                max_size=40))
def test_any_pod_file_is_pods_or_one_bad_input(tmp_path_factory: pytest.TempPathFactory,
                                               parts: list[str]) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "pods.csv"
    path.write_bytes((HEADER + "\n" + "".join(parts)).encode("utf-8", "surrogateescape"))
    try:
        timed = load_timed_pods(path, {"T4"})
    except BadInput as e:
        assert "\n" not in str(e) and e.source == str(path)
        return
    assert all(t.leave_s is not None and t.leave_s >= t.arrive_s for t in timed)
    assert [t.arrive_s for t in timed] == sorted(t.arrive_s for t in timed)
