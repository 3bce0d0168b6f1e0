"""The ``mig`` part of the usage annotation: a GPU's MIG instances, read and written exactly."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import orjson
import pytest

from gpufrag.errors import BadInput
from gpufrag.gpu_usage import GpuUsage, MigInstanceUsage, NodeGpuUsage, PodGpuUsage, parse

POD = PodGpuUsage("serving", "bert-0", "uid-a", 4800)
A100_MIG = GpuUsage(
    index=0, uuid="GPU-aaaa", product="NVIDIA A100-SXM4-80GB", memory_used_mib=4800,
    memory_total_mib=81920, utilization_pct=0, pods=(POD,),
    mig=(MigInstanceUsage("3g.40gb", 0, "MIG-0", 4800, 40192, None, ("uid-a",)),
         MigInstanceUsage("2g.20gb", 4, "MIG-1", 0, 19968, None),
         MigInstanceUsage("1g.10gb", 6, "MIG-2", 0, 9856, None)))
USAGE = NodeGpuUsage("gpu-node-1", 1732900000.0, 15.0, (A100_MIG,))


def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(USAGE.to_json())
    return copy.deepcopy(loaded)


def test_mig_instances_round_trip_and_sit_in_start_order() -> None:
    assert parse(USAGE.to_json()) == USAGE
    shuffled = doc()
    shuffled["gpus"][0]["mig"].reverse()
    assert [i.start for i in parse(orjson.dumps(shuffled)).gpus[0].mig] == [0, 4, 6]


def test_a_gpu_not_in_mig_mode_writes_no_key_and_reads_as_none() -> None:
    plain = replace(USAGE, gpus=(replace(A100_MIG, mig=()),))
    assert "mig" not in orjson.loads(plain.to_json())["gpus"][0]
    assert not parse(plain.to_json()).gpus[0].mig_mode
    assert parse(USAGE.to_json()).gpus[0].mig_mode


def test_an_instance_is_in_use_when_a_pod_runs_on_it_or_it_holds_memory() -> None:
    taken, free, _ = A100_MIG.mig
    assert taken.in_use and not free.in_use
    assert replace(free, memory_used_mib=1).in_use


@pytest.mark.parametrize(("path", "value", "field", "says"), [
    (("start",), 8, "gpus[0].mig[1].start", "in 0..7"),
    (("start",), 0, "gpus[0].mig[1].start", "repeats"),
    (("uuid",), "MIG-0", "gpus[0].mig[1].uuid", "repeats"),
    (("profile",), "", "gpus[0].mig[1].profile", "non-empty"),
    (("memory_used_mib",), 20000, "gpus[0].mig[1].memory_used_mib", "exceeds"),
    (("utilization_pct",), 101, "gpus[0].mig[1].utilization_pct", "in 0..100"),
    (("pods",), ["uid-x"], "gpus[0].mig[1].pods[0]", "not in gpus[0].pods"),
    (("pods",), [3], "gpus[0].mig[1].pods[0]", "non-empty pod uid"),
    (("pods",), ["uid-a", "uid-a"], "gpus[0].mig[1].pods", "repeats"),
])
def test_every_malformed_mig_field_is_named(path: tuple[str, ...], value: Any, field: str,
                                           says: str) -> None:
    bad = doc()
    bad["gpus"][0]["mig"][1][path[0]] = value
    with pytest.raises(BadInput) as caught:
        parse(orjson.dumps(bad))
    assert caught.value.field == field
    assert says in str(caught.value)


def test_a_change_of_layout_or_of_who_uses_an_instance_counts_but_noise_does_not() -> None:
    def with_mig(*instances: MigInstanceUsage) -> NodeGpuUsage:
        return replace(USAGE, gpus=(replace(A100_MIG, mig=instances),))

    first, second, third = A100_MIG.mig
    assert not USAGE.changed_beyond(with_mig(replace(first, memory_used_mib=4810), second, third),
                                    tolerance_mib=64, tolerance_pct=5)
    assert USAGE.changed_beyond(with_mig(first, replace(second, pods=("uid-a",)), third),
                                tolerance_mib=64, tolerance_pct=5)
    assert USAGE.changed_beyond(with_mig(first, second), tolerance_mib=64, tolerance_pct=5)
    assert USAGE.changed_beyond(with_mig(first, second, replace(third, utilization_pct=40)),
                                tolerance_mib=64, tolerance_pct=5)
