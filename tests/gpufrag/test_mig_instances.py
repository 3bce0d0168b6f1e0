"""MIG instances made and destroyed through the NVML adapter, against a recorded NVML that
enforces NVIDIA's placement rules (no GPU here: the real NVML path needs one, and the same
calls are checked to exist in the real pynvml by tests/gpufrag/test_nvml.py)."""

from __future__ import annotations

import pytest

from gpufrag.mig_instances import MigInstances, MigShape, MigWriteError
from tests.node.dra.builders import build_gpus
from tests.node.dra.fakes import mig_nvml

ONE_SLICE_1G = MigShape(compute_slices=1, memory_mib=10_240, start=6, slices=1)
TWO_SLICE_1G = MigShape(compute_slices=1, memory_mib=20_480, start=6, slices=2)


def test_the_profile_is_the_one_with_those_compute_slices_and_the_nearest_memory() -> None:
    nvml = mig_nvml(build_gpus(1))
    small = MigInstances(nvml).ensure(0, ONE_SLICE_1G)
    assert [(m.profile_id, m.start, m.size) for m in nvml.devices[0].mig or []] == [(19, 6, 1)]
    assert MigInstances(nvml).destroy(0, small.gpu_instance_id, small.compute_instance_id)
    big = MigInstances(nvml).ensure(0, TWO_SLICE_1G)
    assert [(m.profile_id, m.start, m.size) for m in nvml.devices[0].mig or []] == [(15, 6, 2)]
    assert big.uuid.startswith("MIG-")


def test_a_start_the_profile_does_not_allow_is_refused_with_the_placement() -> None:
    nvml = mig_nvml(build_gpus(1))
    with pytest.raises(MigWriteError, match="GPU 0: MIG instance of 3 compute slices at memory "
                                            "slice 2"):
        MigInstances(nvml).ensure(0, MigShape(3, 40_960, 2, 4))
    assert nvml.gpu_instances[0] == {}


def test_a_shape_the_gpu_has_no_profile_for_is_refused() -> None:
    with pytest.raises(MigWriteError, match="no GPU instance profile of 5 compute slices"):
        MigInstances(mig_nvml(build_gpus(1))).ensure(0, MigShape(5, 50_000, 0, 8))


def test_the_recorded_instance_is_used_and_one_gone_is_destroyed_already() -> None:
    nvml = mig_nvml(build_gpus(1))
    made: list[int] = []
    first = MigInstances(nvml).ensure(0, ONE_SLICE_1G, on_created=made.append)
    assert made == [first.gpu_instance_id]
    again = MigInstances(nvml).ensure(0, ONE_SLICE_1G, gpu_instance_id=first.gpu_instance_id,
                                      on_created=made.append)
    assert again == first and made == [first.gpu_instance_id]  # nothing made twice
    found = MigInstances(nvml).ensure(0, ONE_SLICE_1G)  # no record: found by its placement
    assert found == first
    instances = MigInstances(nvml)
    assert instances.destroy(0, first.gpu_instance_id, first.compute_instance_id) is True
    assert instances.destroy(0, first.gpu_instance_id, first.compute_instance_id) is False
