"""Device IDs for whole GPUs and shares, the ListAndWatch list, and the preference."""

from __future__ import annotations

import pytest

from node.deviceplugin.api import HEALTHY, UNHEALTHY
from node.deviceplugin.config import Kind
from node.deviceplugin.devices import (
    DeviceList,
    check_ids,
    device_ids,
    gpu_of,
    preferred,
    share_id,
)
from node.gpus import Gpu
from tests.node.deviceplugin.builders import UUIDS, build_gpus


def test_a_whole_gpu_is_one_device_named_by_its_uuid() -> None:
    gpu = build_gpus(1)[0]
    assert device_ids(Kind.WHOLE, gpu) == (UUIDS[0],)
    assert gpu_of(UUIDS[0]) == UUIDS[0]


def test_a_gpu_is_1000_share_devices_that_name_it() -> None:
    ids = device_ids(Kind.SHARE, build_gpus(1)[0])
    assert len(ids) == len(set(ids)) == 1000
    assert ids[0] == f"{UUIDS[0]}::000" and ids[-1] == f"{UUIDS[0]}::999"
    assert {gpu_of(i) for i in ids} == {UUIDS[0]}
    assert max(len(i) for i in ids) <= 63


def test_uuids_too_long_for_device_ids_are_refused_at_start() -> None:
    check_ids([Gpu(0, "MIG-" + "a" * 36, "x", 1)])
    with pytest.raises(ValueError, match="longer than 63"):
        check_ids([Gpu(0, "GPU-" + "a" * 60, "x", 1)])


def test_the_list_follows_health_and_is_rebuilt_only_when_it_changes() -> None:
    devices = DeviceList(Kind.SHARE, build_gpus(2))
    healthy = devices.response({UUIDS[0]: True, UUIDS[1]: True})
    assert devices.response({UUIDS[0]: True, UUIDS[1]: True}) is healthy
    one_lost = devices.response({UUIDS[0]: True, UUIDS[1]: False})
    by_health = {h: sum(d.health == h for d in one_lost.devices) for h in (HEALTHY, UNHEALTHY)}
    assert by_health == {HEALTHY: 1000, UNHEALTHY: 1000}


@pytest.mark.parametrize(("available", "must", "size", "target", "expected"), [
    (["b", "a", "c"], [], 2, [], ["a", "b"]),
    (["b", "a", "c"], ["c"], 2, [], ["c", "a"]),
    ([UUIDS[1], UUIDS[0]], [], 1, [UUIDS[1]], [UUIDS[1]]),
    ([share_id(UUIDS[0], 1), share_id(UUIDS[1], 0), share_id(UUIDS[1], 5)], [], 2,
     [UUIDS[1]], [share_id(UUIDS[1], 0), share_id(UUIDS[1], 5)]),
    # The chosen GPU has too few free devices in the kubelet's books: the rest from others.
    ([share_id(UUIDS[0], 1), share_id(UUIDS[1], 0)], [], 2, [UUIDS[1]],
     [share_id(UUIDS[1], 0), share_id(UUIDS[0], 1)]),
])
def test_preferred(available: list[str], must: list[str], size: int, target: list[str],
                   expected: list[str]) -> None:
    assert preferred(available, must, size, target) == expected
