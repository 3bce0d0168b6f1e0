"""The kubelet's calls over the driver's real unix sockets: registration answers, prepare and
unprepare (idempotent, one CDI spec per claim), and every bad input answered, never a crash."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pynvml
import pytest
import structlog

from gpufrag.mig_instances import MigInstances
from gpufrag.nvml_recorded import RecordedNvml, RecordedProcess
from node.dra.api import DraPluginClient, RegistrationClient, drapb, regpb
from node.dra.cdi import SpecDir
from node.dra.config import CDI_KIND, DraConfig
from node.dra.metrics import DriverMetrics
from node.dra.partitions import RECORD_KIND, Partitions
from node.dra.server import DriverServer
from node.dra.service import DraPluginServicer, RegistrationServicer
from node.gpus import DeviceNodes
from tests.node.dra.builders import NODE, UUIDS, build_claim, build_config, build_gpus, result
from tests.node.dra.fakes import FakeClaims, mig_nvml


@dataclass
class Driver:
    config: DraConfig
    claims: FakeClaims
    plugin: DraPluginClient
    registration: RegistrationClient
    servicer: RegistrationServicer
    cdi_dir: Path
    nvml: RecordedNvml


@contextmanager
def serving(root: Path, nvml: RecordedNvml, claims: FakeClaims) -> Iterator[Driver]:
    """The driver's two sockets under ``root``, its GPUs in MIG mode on ``nvml`` (4 GPUs;
    claims of whole GPUs and shares use them as they are)."""
    cdi_dir = root / "cdi"
    cdi_dir.mkdir(exist_ok=True)
    config = build_config(registry_dir=str(root / "reg"), plugins_dir=str(root / "plugins"),
                          cdi_dir=str(cdi_dir))
    log = structlog.get_logger("test")
    registration = RegistrationServicer(config, log=log)
    partitions = Partitions(MigInstances(nvml), SpecDir(config.partitions_dir, RECORD_KIND),
                            log=log)
    servicer = DraPluginServicer(
        config, build_gpus(), claims, SpecDir(config.cdi_dir, CDI_KIND),
        DeviceNodes({0: "/dev/nvidia0"}, (), ()), DriverMetrics(recorded=False),
        partitions=partitions, log=log)
    server = DriverServer(config, servicer, registration)
    server.start()
    plugin = DraPluginClient(config.plugin_socket_path)
    reg = RegistrationClient(config.registration_socket_path)
    try:
        yield Driver(config, claims, plugin, reg, registration, cdi_dir, nvml)
    finally:
        plugin.close()
        reg.close()
        server.stop()


@pytest.fixture
def driver() -> Iterator[Driver]:
    # A short directory of its own: unix socket paths must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    try:
        with serving(root, mig_nvml(build_gpus()), FakeClaims()) as running:
            yield running
    finally:
        shutil.rmtree(root)


def ref(name: str = "claim-1", uid: str = "uid-1") -> drapb.Claim:
    return drapb.Claim(namespace="default", name=name, uid=uid)


def prepare(driver: Driver, *claims: drapb.Claim) -> drapb.NodePrepareResourcesResponse:
    reply: drapb.NodePrepareResourcesResponse = driver.plugin.node_prepare_resources(
        drapb.NodePrepareResourcesRequest(claims=list(claims)), timeout=10)
    return reply


def unprepare(driver: Driver, *claims: drapb.Claim) -> drapb.NodeUnprepareResourcesResponse:
    reply: drapb.NodeUnprepareResourcesResponse = driver.plugin.node_unprepare_resources(
        drapb.NodeUnprepareResourcesRequest(claims=list(claims)), timeout=10)
    return reply


def test_registration_names_the_driver_its_socket_and_the_v1_service(driver: Driver) -> None:
    info = driver.registration.get_info(regpb.InfoRequest(), timeout=10)
    assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
        "DRAPlugin", "gpu.gpufrag.io", driver.config.plugin_socket_path, ["v1.DRAPlugin"])
    assert not driver.servicer.registered
    driver.registration.notify_registration_status(
        regpb.RegistrationStatus(plugin_registered=True), timeout=10)
    assert driver.servicer.wait_registered(10)


def test_a_refused_registration_is_kept_with_the_kubelets_reason(driver: Driver) -> None:
    driver.registration.notify_registration_status(
        regpb.RegistrationStatus(plugin_registered=False, error="no such version"), timeout=10)
    assert not driver.servicer.registered
    assert driver.servicer.last_error == "no such version"


def test_a_share_is_prepared_as_one_cdi_device_with_the_device_plugins_env(
        driver: Driver) -> None:
    driver.claims.claims[("default", "claim-1")] = build_claim(
        [result("gpu-0", consumed={"milli": "250", "memory": "0"}, share_id="s1")])
    reply = prepare(driver, ref())
    answer = reply.claims["uid-1"]
    assert answer.error == ""
    (device,) = answer.devices
    assert (list(device.request_names), device.pool_name, device.device_name,
            list(device.cdi_device_ids), device.share_id) == (
        ["gpu"], NODE, "gpu-0", ["gpufrag.io/gpu=uid-1-gpu"], "s1")
    spec = json.loads((driver.cdi_dir / "gpufrag.io-gpu_uid-1.json").read_text())
    assert spec == {"cdiVersion": "0.5.0", "kind": "gpufrag.io/gpu", "devices": [{
        "name": "uid-1-gpu", "containerEdits": {
            "env": ["GPUFRAG_GPU_MEMORY_LIMIT_MIB=20480", "GPUFRAG_GPU_MILLI=250",
                    f"NVIDIA_VISIBLE_DEVICES={UUIDS[0]}"],
            "deviceNodes": [{"path": "/dev/nvidia0", "permissions": "rw"}]}}]}


def test_prepare_and_unprepare_are_idempotent(driver: Driver) -> None:
    driver.claims.claims[("default", "claim-1")] = build_claim([result("gpu-1")])
    first, again = prepare(driver, ref()), prepare(driver, ref())
    assert first == again and first.claims["uid-1"].error == ""
    assert os.listdir(driver.cdi_dir) == ["gpufrag.io-gpu_uid-1.json"]
    assert unprepare(driver, ref()).claims["uid-1"].error == ""
    assert os.listdir(driver.cdi_dir) == []
    assert unprepare(driver, ref()).claims["uid-1"].error == ""


def test_a_request_of_two_gpus_names_its_cdi_device_once(driver: Driver) -> None:
    driver.claims.claims[("default", "claim-1")] = build_claim(
        [result("gpu-0"), result("gpu-1")])
    devices = prepare(driver, ref()).claims["uid-1"].devices
    assert [list(d.cdi_device_ids) for d in devices] == [["gpufrag.io/gpu=uid-1-gpu"], []]
    assert [d.HasField("share_id") for d in devices] == [False, False]


def test_a_bad_claim_gets_its_own_error_and_the_others_are_prepared(driver: Driver) -> None:
    driver.claims.claims[("default", "good")] = build_claim(uid="u-good", name="good")
    driver.claims.claims[("default", "elsewhere")] = build_claim(
        [result(pool="gpu-node-2")], uid="u-else", name="elsewhere")
    reply = prepare(driver, ref("good", "u-good"), ref("elsewhere", "u-else"),
                    ref("gone", "u-gone"))
    assert reply.claims["u-good"].error == ""
    assert "pool is 'gpu-node-2', but this node's pool is 'gpu-node-1'" in \
        reply.claims["u-else"].error
    assert reply.claims["u-gone"].error == (
        "claim default/gone (uid u-gone): reading ResourceClaim default/gone: HTTP 404 "
        "Not Found: not found")
    assert os.listdir(driver.cdi_dir) == ["gpufrag.io-gpu_u-good.json"]


def test_a_bug_costs_one_claim_and_the_driver_keeps_answering(driver: Driver) -> None:
    driver.claims.claims[("default", "claim-1")] = RuntimeError("boom")
    answer = prepare(driver, ref()).claims["uid-1"]
    assert answer.error == "claim default/claim-1 (uid uid-1): internal error: " \
                           "RuntimeError('boom')"
    driver.claims.claims[("default", "claim-1")] = build_claim()
    assert prepare(driver, ref()).claims["uid-1"].error == ""


@pytest.mark.parametrize("call", ["prepare", "unprepare"])
def test_a_claim_without_uid_fails_the_call_as_invalid(driver: Driver, call: str) -> None:
    send = prepare if call == "prepare" else unprepare
    with pytest.raises(grpc.RpcError) as caught:
        send(driver, ref(uid=""))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "claims[0]: namespace, name and uid are required" in str(caught.value.details())


# --- MIG partitions: instances made at the allocated placement, found again, destroyed ----------


def mig_claim(device: str, uid: str = "uid-1", name: str = "claim-1") -> dict[str, Any]:
    return build_claim([result(device, request="mig")], uid=uid, name=name)


def instances(driver: Driver, gpu: int = 1) -> list[tuple[int, int]]:
    """(start, size) of every GPU instance on ``gpu``, as NVML has them."""
    return sorted((gi.start, gi.size) for gi in driver.nvml.gpu_instances[gpu].values())


def test_a_partition_is_made_at_its_placement_and_given_as_its_mig_device(
        driver: Driver) -> None:
    driver.claims.claims[("default", "claim-1")] = mig_claim("gpu-1-mig-3g-40gb-4")
    answer = prepare(driver, ref()).claims["uid-1"]
    assert answer.error == ""
    (device,) = answer.devices
    assert (device.device_name, list(device.cdi_device_ids)) == (
        "gpu-1-mig-3g-40gb-4", ["gpufrag.io/gpu=uid-1-mig"])
    assert instances(driver) == [(4, 4)]  # NVML's 3g.40gb (id 9) at slice 4, 4 slices
    (mig,) = driver.nvml.devices[1].mig or []
    assert (mig.profile_id, mig.gpu_instance_slice_count) == (9, 3)
    spec = json.loads((driver.cdi_dir / "gpufrag.io-gpu_uid-1.json").read_text())
    assert spec["devices"][0]["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={mig.uuid}"]


def test_a_repeated_prepare_and_a_restarted_driver_find_the_instance_again(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    root = Path(tempfile.mkdtemp(prefix="dra-"))  # short: unix socket paths
    nvml, claims = mig_nvml(build_gpus()), FakeClaims()
    claims.claims[("default", "claim-1")] = mig_claim("gpu-1-mig-1g-10gb-6")
    try:
        with serving(root, nvml, claims) as driver:
            first = prepare(driver, ref())
            assert prepare(driver, ref()) == first and first.claims["uid-1"].error == ""
        # The driver restarts: a new process, the same host directories, the same GPUs.
        with serving(root, nvml, claims) as restarted:
            assert prepare(restarted, ref()) == first
            assert instances(restarted) == [(6, 1)]  # one instance, made once
            assert len(nvml.devices[1].mig or []) == 1
            assert unprepare(restarted, ref()).claims["uid-1"].error == ""
            assert instances(restarted) == []
    finally:
        shutil.rmtree(root)


def test_an_instance_made_before_a_failed_try_is_used_by_the_next(driver: Driver) -> None:
    # The compute instance fails once: the GPU instance exists, recorded, with no MIG device.
    driver.nvml.devices[1].errors["nvmlGpuInstanceCreateComputeInstance"] = [
        "NVMLError_Unknown", None]
    driver.claims.claims[("default", "claim-1")] = mig_claim("gpu-1-mig-2g-20gb-2")
    failed = prepare(driver, ref()).claims["uid-1"].error
    assert "device 'gpu-1-mig-2g-20gb-2': GPU 1: MIG instance of 2 compute slices at memory " \
           "slice 2:" in failed
    assert instances(driver) == [(2, 2)]
    assert prepare(driver, ref()).claims["uid-1"].error == ""
    assert instances(driver) == [(2, 2)] and len(driver.nvml.devices[1].mig or []) == 1


def test_overlapping_placements_are_refused_by_nvmls_rules(driver: Driver) -> None:
    driver.claims.claims[("default", "a")] = mig_claim("gpu-1-mig-4g-40gb-0", "u-a", "a")
    driver.claims.claims[("default", "b")] = mig_claim("gpu-1-mig-3g-40gb-4", "u-b", "b")
    driver.claims.claims[("default", "c")] = mig_claim("gpu-1-mig-1g-10gb-3", "u-c", "c")
    reply = prepare(driver, ref("a", "u-a"), ref("b", "u-b"), ref("c", "u-c"))
    assert [reply.claims[u].error for u in ("u-a", "u-b")] == ["", ""]
    assert "device 'gpu-1-mig-1g-10gb-3'" in reply.claims["u-c"].error
    assert str(pynvml.NVMLError_InsufficientResources()) in reply.claims["u-c"].error
    assert instances(driver) == [(0, 4), (4, 4)]


def test_unprepare_destroys_the_instances_once_no_process_runs_there(driver: Driver) -> None:
    driver.claims.claims[("default", "claim-1")] = mig_claim("gpu-1-mig-7g-80gb-0")
    assert prepare(driver, ref()).claims["uid-1"].error == ""
    (mig,) = driver.nvml.devices[1].mig or []
    mig.processes.append(RecordedProcess(4242, 1 << 30))  # the container has not exited yet
    busy = unprepare(driver, ref()).claims["uid-1"].error
    assert "GPU 1: GPU instance" in busy and "destroying it failed" in busy
    assert instances(driver) == [(0, 8)]
    mig.processes.clear()
    del driver.claims.claims[("default", "claim-1")]  # the claim is gone from the API too
    assert unprepare(driver, ref()).claims["uid-1"].error == ""
    assert instances(driver) == [] and driver.nvml.devices[1].mig == []
    assert os.listdir(driver.cdi_dir) == []
    assert unprepare(driver, ref()).claims["uid-1"].error == ""  # nothing left: still fine


def test_an_unreadable_mig_record_is_the_claims_error_naming_the_file(driver: Driver) -> None:
    records = Path(driver.config.partitions_dir)
    records.mkdir(parents=True)
    (records / "gpufrag.io-partitions_uid-1.json").write_text("{not json")
    error = unprepare(driver, ref()).claims["uid-1"].error
    assert "gpufrag.io-partitions_uid-1.json" in error and "unreadable" in error
    driver.claims.claims[("default", "claim-1")] = mig_claim("gpu-1-mig-1g-10gb-6")
    assert "unreadable" in prepare(driver, ref()).claims["uid-1"].error
    assert instances(driver) == []  # nothing made past a record it cannot read
