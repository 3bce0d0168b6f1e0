"""gpufrag.records: what the extender signs is exactly what the device plugin accepts, and
nothing else (another pod, node or GPU list, another key, a malformed record, a bad key)."""

from __future__ import annotations

import pytest

from gpufrag.errors import BadInput
from gpufrag.records import (
    AllocationMismatch,
    RecordSigner,
    RecordVerifier,
    allocated_text,
    allocation_mismatch,
    gpu_indices_text,
    parse_allocated,
)

SIGNER = RecordSigner.generate()
GOOD = {"uid": "u-1", "node": "gpu-1", "gpus_text": "0,3"}


def test_a_record_verifies_for_exactly_what_was_signed() -> None:
    record = SIGNER.sign(**GOOD)
    verifier = SIGNER.verifier()
    assert verifier.problem(record, **GOOD) == ""
    for field, other in (("uid", "u-2"), ("node", "gpu-2"), ("gpus_text", "0,2"),
                         ("gpus_text", "0,3,")):
        assert "does not match" in verifier.problem(record, **{**GOOD, field: other})


def test_fields_cannot_be_shifted_into_each_other() -> None:
    record = SIGNER.sign(uid="a", node="b.c", gpus_text="0")
    assert SIGNER.verifier().problem(record, uid="a.b", node="c", gpus_text="0") != ""


def test_the_record_format_is_stable_and_bounded() -> None:
    version, key_id, signature = SIGNER.sign(**GOOD).split(".")
    assert (version, key_id, len(signature)) == ("v1", SIGNER.key_id, 86)


def test_keys_round_trip_through_pem_and_a_bad_one_is_named() -> None:
    again = RecordSigner.from_pem(SIGNER.private_pem(), source="Secret s")
    assert again.key_id == SIGNER.key_id
    verifier = RecordVerifier.from_pems({f"{SIGNER.key_id}.pem": SIGNER.public_pem().decode(),
                                         "README": "ignored: not a .pem entry"}, source="cm")
    assert set(verifier.keys) == {SIGNER.key_id}
    with pytest.raises(BadInput, match="cm, field 'bad.pem': not a PEM public key"):
        RecordVerifier.from_pems({"bad.pem": "nope"}, source="cm")
    with pytest.raises(BadInput, match="Secret s: not a PEM private key"):
        RecordSigner.from_pem(b"nope", source="Secret s")


def test_the_indices_text_is_the_binder_s() -> None:
    assert gpu_indices_text((0, 3)) == "0,3" and gpu_indices_text(()) == ""


# --- what the device plugin gave ------------------------------------------------------------------

NODE_GPUS = {0: "GPU-a", 1: "GPU-b", 2: "GPU-c"}


def test_the_allocation_mark_is_compact_sorted_and_reads_back() -> None:
    given = {"worker": ("GPU-b",), "init": ("GPU-a", "GPU-b")}
    text = allocated_text(given)
    assert text == '{"init":["GPU-a","GPU-b"],"worker":["GPU-b"]}'
    assert parse_allocated(text) == given


@pytest.mark.parametrize("text", ["{not json", "[]", '{"c": "GPU-a"}', '{"c": [0]}', "null"])
def test_a_mark_that_is_not_container_to_uuids_is_bad_input(text: str) -> None:
    with pytest.raises(BadInput, match="container name -> GPU UUIDs"):
        parse_allocated(text)


@pytest.mark.parametrize(("recorded", "given", "expected"), [
    ((0, 1), {"a": ("GPU-a",), "b": ("GPU-b",)}, None),  # as recorded
    ((0, 1), {"a": ("GPU-a",)}, None),  # still starting: b not allocated yet
    ((0,), {}, None),  # nothing given yet
    ((0,), {"a": ("GPU-b",)}, AllocationMismatch("other_gpus", (0,), (1,))),  # a swap
    ((1, 0), {"a": ("GPU-c", "GPU-a")}, AllocationMismatch("other_gpus", (0, 1), (0, 2))),
    ((0,), {"a": ("GPU-z", "GPU-a")}, AllocationMismatch("unknown_gpu", (0,), (0, "GPU-z"))),
])
def test_an_allocation_differs_from_the_record_only_by_a_gpu_not_recorded(
        recorded: tuple[int, ...], given: dict[str, tuple[str, ...]],
        expected: AllocationMismatch | None) -> None:
    assert allocation_mismatch(recorded, given, NODE_GPUS) == expected


def test_the_mismatch_says_what_was_given_and_recorded() -> None:
    message = AllocationMismatch("unknown_gpu", (0, 3), (1, "GPU-z")).message()
    assert message.startswith("its containers got GPU(s) 1, GPU-z but gpu-indices records 0,3: "
                              "the device plugin gave a GPU this node's agent does not read")
