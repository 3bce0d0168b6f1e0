"""A container gets the GPUs a record names only when the extender signed that record for that
pod on that node: the three ways a tenant could take another tenant's GPU are refused, with an
Event and a count, and the extender's own records and the kubelet's choice still work."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrag.conventions import ANNOTATION_GPU_INDICES, ANNOTATION_GPU_RECORD
from gpufrag.records import RecordSigner, RecordVerifier
from node.deviceplugin.allocator import AllocationRefused
from node.deviceplugin.config import Kind
from node.deviceplugin.trust import REFRESH_MAX_S, REFRESH_MIN_S, KubeRecordKeys
from scheduler.kube.errors import ApiError
from tests.node.deviceplugin.builders import NODE, UUIDS, ask, build_pod
from tests.node.deviceplugin.fakes import Setup, build_allocator
from tests.records import SIGNER, signed_record


def refused_records(setup: Setup) -> float:
    value = setup.metrics.registry.get_sample_value("gpufrag_deviceplugin_refused_records_total")
    return value or 0.0


def with_annotations(pod: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    meta = {**pod["metadata"], "annotations": {**pod["metadata"]["annotations"], **annotations}}
    return {**pod, "metadata": meta}


def refused(setup: Setup, match: str) -> None:
    with pytest.raises(AllocationRefused, match=match):
        setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])
    assert setup.writer.marks == []  # nothing given
    assert [key for key, _ in setup.writer.warnings] == ["default/thief"]  # an Event says why
    assert refused_records(setup) == 1


def test_the_extender_s_signed_record_is_honoured() -> None:
    setup = build_allocator([build_pod("p", whole=1, gpus="2")])
    response = setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[2]}
    assert refused_records(setup) == 0


def test_a_forged_record_is_refused() -> None:
    # Attack 1: a pod created with spec.nodeName and a gpu-indices naming the victim's GPU.
    setup = build_allocator([build_pod("thief", whole=1, gpus="2", signed=False)])
    refused(setup, r"gpu-indices='2' is not honoured: it carries no gpu-record signature")


def test_a_record_rewritten_after_the_bind_is_refused() -> None:
    # Attack 2: bound to a free GPU by the extender, then patched to name the victim's.
    genuine = build_pod("thief", whole=1, gpus="1")
    setup = build_allocator([with_annotations(genuine, {ANNOTATION_GPU_INDICES: "2"})])
    refused(setup, "does not match the pod's UID, node and GPU indices")


def test_a_record_copied_from_another_pod_is_refused() -> None:
    victim = signed_record("uid-victim", NODE, "2")
    setup = build_allocator([with_annotations(build_pod("thief", whole=1, gpus="3"), victim)])
    refused(setup, "does not match the pod's UID, node and GPU indices")


def test_a_record_signed_with_a_key_the_node_does_not_trust_is_refused() -> None:
    forger = RecordSigner.generate()
    own = {ANNOTATION_GPU_RECORD: forger.sign(uid="uid-thief", node=NODE, gpus_text="2")}
    setup = build_allocator([with_annotations(build_pod("thief", whole=1, gpus="2"), own)])
    refused(setup, f"signed by key {forger.key_id}, not one of the keys trusted here "
                   f"\\({SIGNER.key_id}\\)")


@pytest.mark.parametrize("record", ["", "v1", "v2.0123456789abcdef.AAAA", "x" * 5000,
                                    "v1.0123456789abcdef.!!!"])
def test_a_malformed_record_is_refused_in_words(record: str) -> None:
    pod = with_annotations(build_pod("thief", whole=1, gpus="2"),
                           {ANNOTATION_GPU_RECORD: record})
    setup = build_allocator([pod])
    with pytest.raises(AllocationRefused, match="is not honoured"):
        setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])


def test_a_whole_gpu_pod_of_another_scheduler_still_takes_the_kubelet_choice() -> None:
    setup = build_allocator([build_pod("theirs", whole=1, gpus=None)])
    response = setup.allocator.allocate(Kind.WHOLE, [UUIDS[3]])
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[3]}


class Reads:
    def __init__(self, *answers: dict[str, str] | Exception | None) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self) -> dict[str, str] | None:
        self.calls += 1
        answer = self.answers[min(self.calls, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def public(signer: RecordSigner) -> dict[str, str]:
    return {f"{signer.key_id}.pem": signer.public_pem().decode()}


def test_a_key_published_after_start_is_picked_up_without_a_restart() -> None:
    now = [0.0]
    later = RecordSigner.generate()
    reads = Reads(public(SIGNER), {**public(SIGNER), **public(later)})
    keys = KubeRecordKeys(reads, where="ConfigMap x/y", clock=lambda: now[0])
    pod = ask(with_annotations(build_pod("p", whole=1, gpus="2"), {
        ANNOTATION_GPU_RECORD: later.sign(uid="uid-p", node=NODE, gpus_text="2")}))
    assert "not one of the keys trusted here" in keys.problem(pod)
    assert reads.calls == 1  # the unknown key does not make every call read the API
    now[0] += REFRESH_MIN_S
    assert keys.problem(pod) == "" and reads.calls == 2


def test_a_failed_read_keeps_the_keys_read_before_and_says_so() -> None:
    now = [0.0]
    reads = Reads(public(SIGNER), ApiError("reading ConfigMap x/y", 503, "unavailable"))
    keys = KubeRecordKeys(reads, where="ConfigMap x/y", clock=lambda: now[0])
    pod = ask(build_pod("p", whole=1, gpus="2"))
    assert keys.problem(pod) == ""
    now[0] += REFRESH_MAX_S
    assert keys.problem(pod) == "" and reads.calls == 2 and "503" in keys.last_error


def test_no_configmap_yet_refuses_with_the_reason() -> None:
    keys = KubeRecordKeys(Reads(None), where="ConfigMap gpufrag-system/gpufrag-record-keys")
    problem = keys.problem(ask(build_pod("p", whole=1, gpus="2")))
    assert "ConfigMap gpufrag-system/gpufrag-record-keys does not exist" in problem


def test_a_verifier_trusts_only_its_keys() -> None:
    assert RecordVerifier({}).unknown_key(SIGNER.sign(uid="u", node="n", gpus_text="0"))
