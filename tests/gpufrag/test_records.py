"""gpufrag.records: what the extender signs is exactly what the device plugin accepts, and
nothing else (another pod, node or GPU list, another key, a malformed record, a bad key)."""

from __future__ import annotations

import pytest

from gpufrag.errors import BadInput
from gpufrag.records import RecordSigner, RecordVerifier, gpu_indices_text

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
