"""Publishing the slice: created once, left alone while unchanged, replaced with a newer pool
generation when the devices change, and stale slices of this driver on this node deleted."""

from __future__ import annotations

import copy

import structlog

from node.dra.config import DRIVER_NAME
from node.dra.publish import ANNOTATION_DIGEST, SlicePublisher
from tests.node.dra.builders import NODE, build_gpus
from tests.node.dra.fakes import FakeSlices

NAME = f"{NODE}-{DRIVER_NAME}"


def publisher(api: FakeSlices, gpus: int = 2) -> SlicePublisher:
    return SlicePublisher(api, driver=DRIVER_NAME, node_name=NODE, gpus=build_gpus(gpus),
                          mig_enabled={}, log=structlog.get_logger("test"))


def test_the_slice_is_created_once_and_left_alone_while_unchanged() -> None:
    api = FakeSlices()
    assert publisher(api).sync() == "created"
    assert publisher(api).sync() == "unchanged"  # a restarted driver, canonical quantities
    assert api.calls == ["list", f"create {NAME}", "list"]
    assert api.stored[NAME]["spec"]["pool"]["generation"] == 1


def test_changed_devices_replace_the_slice_with_a_newer_generation() -> None:
    api = FakeSlices()
    publisher(api, gpus=2).sync()
    assert publisher(api, gpus=3).sync() == "replaced"
    stored = api.stored[NAME]
    assert stored["spec"]["pool"]["generation"] == 2
    assert len(stored["spec"]["devices"]) == 3
    assert stored["metadata"]["annotations"][ANNOTATION_DIGEST]


def test_an_edited_slice_is_put_back() -> None:
    api = FakeSlices()
    publisher(api).sync()
    api.stored[NAME]["metadata"]["annotations"] = {}
    api.stored[NAME]["spec"]["devices"].pop()
    assert publisher(api).sync() == "replaced"
    assert len(api.stored[NAME]["spec"]["devices"]) == 2


def test_stale_slices_of_this_driver_on_this_node_are_deleted() -> None:
    api = FakeSlices()
    publisher(api).sync()
    stale = copy.deepcopy(api.stored[NAME])
    stale["metadata"]["name"] = "old-layout"
    stale["spec"]["pool"]["generation"] = 5
    api.stored["old-layout"] = stale
    other = copy.deepcopy(api.stored[NAME])
    other["metadata"]["name"] = "other-node"
    other["spec"]["nodeName"] = "gpu-node-2"
    api.stored["other-node"] = other
    assert publisher(api).sync() == "replaced"
    assert sorted(api.stored) == sorted([NAME, "other-node"])
    assert api.stored[NAME]["spec"]["pool"]["generation"] == 6  # newer than any it replaced


def test_a_mig_nodes_pool_is_published_as_all_its_slices_at_one_generation() -> None:
    api = FakeSlices()
    mig = SlicePublisher(api, driver=DRIVER_NAME, node_name=NODE, gpus=build_gpus(2),
                         mig_enabled={1: True}, log=structlog.get_logger("test"))
    assert mig.sync() == "created"
    assert sorted(api.stored) == [NAME, f"{NAME}-counters-0", f"{NAME}-mig-0"]
    assert mig.sync() == "unchanged"
    # GPU 1 leaves MIG mode: its counters and partitions go, the GPU slice grows.
    assert publisher(api).sync() == "replaced"
    assert sorted(api.stored) == [NAME]
    assert api.stored[NAME]["spec"]["pool"] == {"name": NODE, "generation": 2,
                                                "resourceSliceCount": 1}
    assert mig.sync() == "replaced"
    assert {s["spec"]["pool"]["generation"] for s in api.stored.values()} == {3}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in api.stored.values()} == {3}
