"""The kubelet's calls over the driver's real unix sockets: registration answers, prepare and
unprepare (idempotent, one CDI spec per claim), and every bad input answered, never a crash."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import structlog

from node.dra.api import DraPluginClient, RegistrationClient, drapb, regpb
from node.dra.cdi import SpecDir
from node.dra.config import CDI_KIND, DraConfig
from node.dra.metrics import DriverMetrics
from node.dra.server import DriverServer
from node.dra.service import DraPluginServicer, RegistrationServicer
from node.gpus import DeviceNodes
from tests.node.dra.builders import NODE, UUIDS, build_claim, build_config, build_gpus, result
from tests.node.dra.fakes import FakeClaims


@dataclass
class Driver:
    config: DraConfig
    claims: FakeClaims
    plugin: DraPluginClient
    registration: RegistrationClient
    servicer: RegistrationServicer
    cdi_dir: Path


@pytest.fixture
def driver() -> Iterator[Driver]:
    # A short directory of its own: unix socket paths must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    cdi_dir = root / "cdi"
    cdi_dir.mkdir()
    config = build_config(registry_dir=str(root / "reg"), plugins_dir=str(root / "plugins"),
                          cdi_dir=str(cdi_dir))
    claims = FakeClaims()
    log = structlog.get_logger("test")
    registration = RegistrationServicer(config, log=log)
    servicer = DraPluginServicer(
        config, build_gpus(), claims, SpecDir(config.cdi_dir, CDI_KIND),
        DeviceNodes({0: "/dev/nvidia0"}, (), ()), DriverMetrics(recorded=False), log=log)
    server = DriverServer(config, servicer, registration)
    server.start()
    plugin = DraPluginClient(config.plugin_socket_path)
    reg = RegistrationClient(config.registration_socket_path)
    try:
        yield Driver(config, claims, plugin, reg, registration, cdi_dir)
    finally:
        plugin.close()
        reg.close()
        server.stop()
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
