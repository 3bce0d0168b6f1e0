"""The extender's GPU-record key on the real API server (scheduler/kube/recordkeys.py): made
once and shared by replicas starting together, an operator's own key used, a bad one named, and
a start before the namespace exists does not fail the extender: the key comes once it can."""

from __future__ import annotations

import base64
import dataclasses
import threading
import uuid

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from gpufrag.conventions import DEFAULT_NAMES, KubeNames
from gpufrag.records import PRIVATE_KEY_FIELD, RecordSigner, RecordVerifier
from scheduler.kube.recordkeys import RecordKeyError, SignerBootstrap, ensure_signer

pytestmark = pytest.mark.e2e


def names() -> KubeNames:
    return dataclasses.replace(DEFAULT_NAMES, hints_namespace=f"keys-{uuid.uuid4().hex[:8]}")


def test_replicas_starting_together_agree_on_one_published_key(
        control_plane: ControlPlane) -> None:
    ours = names()
    control_plane.create_namespace(ours.hints_namespace)
    found: list[str] = []

    def start() -> None:
        found.append(ensure_signer(control_plane.new_api_client(), ours).key_id)

    replicas = [threading.Thread(target=start) for _ in range(3)]
    for replica in replicas:
        replica.start()
    for replica in replicas:
        replica.join(60)
    assert len(found) == 3 and len(set(found)) == 1
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    published = core.read_namespaced_config_map(ours.record_keys_configmap,
                                                ours.hints_namespace).data
    assert set(RecordVerifier.from_pems(published, source="cm").keys) == {found[0]}


def test_an_operator_s_key_is_used_and_a_bad_one_is_named(control_plane: ControlPlane) -> None:
    ours = names()
    control_plane.create_namespace(ours.hints_namespace)
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    own = RecordSigner.generate()
    core.create_namespaced_secret(ours.hints_namespace, {
        "metadata": {"name": ours.record_key_secret},
        "data": {PRIVATE_KEY_FIELD: base64.b64encode(own.private_pem()).decode()}})
    assert ensure_signer(control_plane.new_api_client(), ours).key_id == own.key_id
    core.patch_namespaced_secret(ours.record_key_secret, ours.hints_namespace, {
        "data": {PRIVATE_KEY_FIELD: base64.b64encode(b"not a key").decode()}})
    with pytest.raises(RecordKeyError, match=f"Secret {ours.hints_namespace}/"
                                             f"{ours.record_key_secret} key ed25519.pem: "
                                             "not a PEM private key"):
        ensure_signer(control_plane.new_api_client(), ours)


def test_a_start_before_the_namespace_exists_gets_the_key_once_it_does(
        control_plane: ControlPlane) -> None:
    ours = names()
    got: list[RecordSigner] = []
    bootstrap = SignerBootstrap(control_plane.new_api_client, ours, got.append)
    assert not bootstrap.try_once() and got == []
    assert f'namespaces "{ours.hints_namespace}" not found' in bootstrap.last_error
    control_plane.create_namespace(ours.hints_namespace)
    assert bootstrap.try_once() and len(got) == 1 and bootstrap.last_error == ""
