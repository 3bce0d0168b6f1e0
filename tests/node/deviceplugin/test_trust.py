"""A container gets the GPUs a record names only when the extender signed that record for that
pod on that node: the three ways a tenant could take another tenant's GPU are refused, with an
Event and a count, and the extender's own records and the kubelet's choice still work."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpufrag.conventions import ANNOTATION_GPU_INDICES, ANNOTATION_GPU_RECORD
from gpufrag.records import RecordSigner, RecordVerifier
from node.deviceplugin.allocator import AllocationRefused
from node.deviceplugin.config import Kind
from node.deviceplugin.matching import PodAsk
from node.deviceplugin.trust import REFRESH_MAX_S, KubeRecordKeys
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


def judged(keys: KubeRecordKeys, pod: PodAsk) -> str:
    """What the allocator does: refresh outside its lock, then judge from memory."""
    keys.refresh(pod)
    return keys.problem(pod)


def test_a_key_published_after_start_is_picked_up_without_a_restart() -> None:
    now = [0.0]
    later = RecordSigner.generate()
    reads = Reads(public(SIGNER), {**public(SIGNER), **public(later)})
    keys = KubeRecordKeys(reads, where="ConfigMap x/y", clock=lambda: now[0])
    assert judged(keys, ask(build_pod("old", whole=1, gpus="2"))) == ""
    assert reads.calls == 1
    # The new key is published a moment after that read: a pod it signed is not refused
    # (the kubelet would fail it for good), the keys are read again first.
    now[0] += 0.01
    pod = ask(with_annotations(build_pod("p", whole=1, gpus="2"), {
        ANNOTATION_GPU_RECORD: later.sign(uid="uid-p", node=NODE, gpus_text="2")}))
    assert judged(keys, pod) == "" and reads.calls == 2
    # Known keys are not read again until the copy is old.
    now[0] += 1
    assert judged(keys, pod) == "" and reads.calls == 2
    now[0] += REFRESH_MAX_S
    assert judged(keys, pod) == "" and reads.calls == 3


def test_an_unknown_key_is_refused_after_one_fresh_read() -> None:
    now = [0.0]
    stranger = RecordSigner.generate()
    reads = Reads(public(SIGNER))
    keys = KubeRecordKeys(reads, where="ConfigMap x/y", clock=lambda: now[0])
    pod = ask(with_annotations(build_pod("p", whole=1, gpus="2"), {
        ANNOTATION_GPU_RECORD: stranger.sign(uid="uid-p", node=NODE, gpus_text="2")}))
    assert "not one of the keys trusted here" in judged(keys, pod)
    assert reads.calls == 1


def test_judging_never_waits_for_a_read_in_flight() -> None:
    """An API server that accepts and never answers holds up only the call that reads (to
    the client's deadline): judging another pod reads memory, under no lock a read holds."""
    entered, release = threading.Event(), threading.Event()
    answers = iter([public(SIGNER)])

    def slow_read() -> dict[str, str] | None:
        entered.set()
        release.wait(10)
        return next(answers, public(SIGNER))

    now = [0.0]
    keys = KubeRecordKeys(slow_read, where="ConfigMap x/y", clock=lambda: now[0])
    pod = ask(build_pod("p", whole=1, gpus="2"))
    reading = threading.Thread(target=keys.refresh, args=(pod,), daemon=True)
    reading.start()
    assert entered.wait(5)
    judge = threading.Thread(target=keys.problem, args=(pod,), daemon=True)
    judge.start()
    judge.join(5)
    try:
        assert not judge.is_alive(), "problem() waited for the read in flight"
    finally:
        release.set()
        reading.join(5)
    assert keys.problem(pod) == ""


def test_a_failed_read_keeps_the_keys_read_before_and_says_so() -> None:
    now = [0.0]
    reads = Reads(public(SIGNER), ApiError("reading ConfigMap x/y", 503, "unavailable"))
    keys = KubeRecordKeys(reads, where="ConfigMap x/y", clock=lambda: now[0])
    pod = ask(build_pod("p", whole=1, gpus="2"))
    assert judged(keys, pod) == ""
    now[0] += REFRESH_MAX_S
    assert judged(keys, pod) == "" and reads.calls == 2 and "503" in keys.last_error


def test_no_configmap_yet_refuses_with_the_reason() -> None:
    keys = KubeRecordKeys(Reads(None), where="ConfigMap gpufrag-system/gpufrag-record-keys")
    problem = judged(keys, ask(build_pod("p", whole=1, gpus="2")))
    assert "ConfigMap gpufrag-system/gpufrag-record-keys does not exist" in problem


def test_a_verifier_trusts_only_its_keys() -> None:
    assert RecordVerifier({}).unknown_key(SIGNER.sign(uid="u", node="n", gpus_text="0"))
