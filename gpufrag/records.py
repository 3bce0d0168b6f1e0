"""GPU records on a pod: the one home of what the extender signs and the device plugin checks,
of the device plugin's own mark of what it gave, and of the check that the two agree.

The extender records the GPUs it chose for a pod in the ``gpu-indices`` annotation at bind,
and the device plugin hands a container exactly those GPUs. An annotation is no proof of who
wrote it: any tenant with ``patch pods`` (or ``create pods`` with ``spec.nodeName``) can write
one naming another tenant's GPU. So the extender also writes ``gpu-record``: an Ed25519
signature over the pod's UID, its node and the GPU indices, made with a private key only the
extender can read (a Secret in the extender's namespace). The device plugin checks it with the
public keys (a ConfigMap there) and refuses a record that is missing, altered, copied from
another pod or another node, or signed by a key it does not know. Why a signature, and not a
shared secret (HMAC): the device plugin runs on every GPU node, and a node's credentials must
not let anyone forge records for the rest of the cluster; a public key forges nothing.

The record: ``v1.<key id>.<signature, base64url without padding>``, where the key id is the
first 16 hex digits of the SHA-256 of the raw public key. The signed message binds the
annotation's meaning (:data:`DOMAIN`), the pod's UID, its node and the indices as the binder
writes them (``"0,3"``), each separated by a NUL byte, which none of them can contain.

Keys rotate without a gap: the public ConfigMap holds any number of keys (``<key id>.pem``,
SubjectPublicKeyInfo PEM); the extender signs with the one private key of its Secret. See
docs/security.md for the procedure.

**What the device plugin gave** (``gpufrag.io/gpu-allocated``, written at Allocate): a JSON
object of container name -> the UUIDs of the GPUs that container got, keys sorted
(:func:`allocated_text`, read back by :func:`parse_allocated`). It can differ from the record:
two identical pods admitted in the other order swap GPUs (node.deviceplugin.matching), and a
node whose NVML indices moved (a GPU lost or replaced, a driver reload) maps the recorded
indices to other devices. :func:`allocation_mismatch` says whether, and why, for the node
agent (a metric and an Event on the pod) and ``gpufrag inspect`` (a line).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gpufrag.errors import BadInput

DOMAIN: Final = b"gpufrag.io/gpu-record/v1"
VERSION: Final = "v1"
# The Secret key / ConfigMap keys the extender writes and the device plugin reads.
PRIVATE_KEY_FIELD: Final = "ed25519.pem"
PUBLIC_KEY_SUFFIX: Final = ".pem"
MAX_RECORD_CHARS: Final = 200  # v1.<16>.<86>: anything longer is not a record
_KEY_ID = re.compile(r"[0-9a-f]{16}")


def gpu_indices_text(gpus: Sequence[int]) -> str:
    """The ``gpu-indices`` annotation's text for these GPUs (``"0,3"``): what the binder
    writes and what the record signs."""
    return ",".join(str(g) for g in gpus)


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _message(uid: str, node: str, gpus_text: str) -> bytes:
    return b"\x00".join((DOMAIN, uid.encode(), node.encode(), gpus_text.encode()))


@dataclass(frozen=True)
class RecordSigner:
    """The extender's side: signs the records it writes at bind."""

    private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> RecordSigner:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, pem: bytes, *, source: str) -> RecordSigner:
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as e:
            raise BadInput(f"not a PEM private key: {e}", source=source) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise BadInput(f"a {type(key).__name__}, not an Ed25519 private key (make one "
                           "with: openssl genpkey -algorithm ed25519)", source=source)
        return cls(key)

    def private_pem(self) -> bytes:
        return self.private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())

    @property
    def key_id(self) -> str:
        return key_id(self.private.public_key())

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def verifier(self) -> RecordVerifier:
        """A verifier that trusts this signer's key only."""
        return RecordVerifier({self.key_id: self.private.public_key()})

    def sign(self, *, uid: str, node: str, gpus_text: str) -> str:
        signature = self.private.sign(_message(uid, node, gpus_text))
        encoded = base64.urlsafe_b64encode(signature).rstrip(b"=").decode("ascii")
        return f"{VERSION}.{self.key_id}.{encoded}"


@dataclass(frozen=True)
class RecordVerifier:
    """The device plugin's side: the public keys it accepts, by key id."""

    keys: Mapping[str, Ed25519PublicKey]

    @classmethod
    def from_pems(cls, pems: Mapping[str, str], *, source: str) -> RecordVerifier:
        """Keys from ConfigMap data (``<key id>.pem`` -> PEM); a bad entry is
        :class:`BadInput` naming it (a key that does not load must not be ignored quietly:
        records signed with it would be refused without a reason anyone could find)."""
        keys: dict[str, Ed25519PublicKey] = {}
        for name, pem in pems.items():
            if not name.endswith(PUBLIC_KEY_SUFFIX):
                continue
            try:
                key = serialization.load_pem_public_key(pem.encode())
            except (ValueError, TypeError, UnicodeEncodeError) as e:
                raise BadInput(f"not a PEM public key: {e}", source=source, field=name) from None
            if not isinstance(key, Ed25519PublicKey):
                raise BadInput(f"a {type(key).__name__}, not an Ed25519 public key",
                               source=source, field=name)
            keys[key_id(key)] = key
        return cls(keys)

    def unknown_key(self, record: str | None) -> bool:
        """``record`` is well formed but signed by a key not held here (one published since
        these keys were read, or a forger's own)."""
        parts = _parts(record)
        return parts is not None and parts[1] not in self.keys

    def problem(self, record: str | None, *, uid: str, node: str, gpus_text: str) -> str:
        """'' when ``record`` is a valid signature of this pod's GPUs on this node, else why
        not, in words for the pod's Event."""
        if record is None:
            return "it carries no gpu-record signature"
        parts = _parts(record)
        if parts is None:
            return f"its gpu-record {record[:80]!r} is not a {VERSION} record"
        key = self.keys.get(parts[1])
        if key is None:
            known = ", ".join(sorted(self.keys)) or "none"
            return f"its gpu-record is signed by key {parts[1]}, not one of the keys trusted " \
                   f"here ({known})"
        try:
            signature = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
            key.verify(signature, _message(uid, node, gpus_text))
        except (InvalidSignature, binascii.Error, ValueError):
            return ("its gpu-record does not match the pod's UID, node and GPU indices: the "
                    "record was altered, or copied from another pod")
        return ""


def _parts(record: str | None) -> list[str] | None:
    """The version, key id and signature of a well-formed record, else None."""
    if record is None or len(record) > MAX_RECORD_CHARS:
        return None
    parts = record.split(".")
    if len(parts) != 3 or parts[0] != VERSION or not _KEY_ID.fullmatch(parts[1]):
        return None
    return parts


# --- what the device plugin gave --------------------------------------------------------------

Given = Mapping[str, tuple[str, ...]]  # container name -> GPU UUIDs

# Why the device plugin's allocation differs from the extender's record, in words for people.
ALLOCATION_MISMATCH_REASONS: Final[Mapping[str, str]] = {
    "other_gpus": "the device plugin gave GPUs the extender's record does not name",
    "unknown_gpu": "the device plugin gave a GPU this node's agent does not read",
}


def allocated_text(given: Given) -> str:
    """The ``gpu-allocated`` annotation's value: ``{"<container>": ["GPU-...", ...]}``, keys
    sorted, so equal allocations give equal text."""
    return orjson.dumps({name: list(uuids) for name, uuids in sorted(given.items())}).decode()


def parse_allocated(text: str) -> dict[str, tuple[str, ...]]:
    """Read a ``gpu-allocated`` value; :class:`BadInput` when it is not an object of container
    name -> list of UUID strings."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = None
    if not (isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(u, str) for u in v)
            for k, v in value.items())):
        raise BadInput(f"{text[:200]!r} is not a JSON object of container name -> GPU UUIDs")
    return {k: tuple(v) for k, v in value.items()}


@dataclass(frozen=True, slots=True)
class AllocationMismatch:
    """A pod whose containers got GPUs other than the ones recorded for it: ``reason`` is a
    key of :data:`ALLOCATION_MISMATCH_REASONS`; ``given`` the GPUs it got, by index where this
    node has the UUID, else the UUID."""

    reason: str
    recorded: tuple[int, ...]
    given: tuple[int | str, ...]

    def message(self) -> str:
        """The one sentence for people (the agent's Event on the pod, ``gpufrag inspect``)."""
        given = ", ".join(str(g) for g in self.given)
        return (f"its containers got GPU(s) {given} but gpu-indices records "
                f"{gpu_indices_text(self.recorded) or 'none'}: "
                f"{ALLOCATION_MISMATCH_REASONS[self.reason]}, so the extender counts its share "
                f"on GPUs it does not use (recreate the pod to realign them)")


def allocation_mismatch(recorded: Sequence[int], given: Given,
                        uuid_by_index: Mapping[int, str]) -> AllocationMismatch | None:
    """Whether the GPUs the device plugin gave (``given``, from :func:`parse_allocated`) are
    the recorded ones, this node's NVML index -> UUID (``uuid_by_index``) telling which is
    which; None when they are (or when nothing was given yet).

    Only "given but not recorded" counts: the kubelet allocates a pod's containers one at a
    time, so a recorded GPU not given yet is a pod still starting, not a mismatch."""
    index_by_uuid = {uuid: index for index, uuid in uuid_by_index.items()}
    uuids = sorted({uuid for uuids in given.values() for uuid in uuids})
    if not uuids:
        return None
    unknown = tuple(uuid for uuid in uuids if uuid not in index_by_uuid)
    indices = tuple(sorted(index_by_uuid[uuid] for uuid in uuids if uuid in index_by_uuid))
    ordered = tuple(sorted(set(recorded)))
    if unknown:
        return AllocationMismatch("unknown_gpu", ordered, indices + unknown)
    if not set(indices) <= set(ordered):
        return AllocationMismatch("other_gpus", ordered, indices)
    return None


__all__ = ["ALLOCATION_MISMATCH_REASONS", "DOMAIN", "PRIVATE_KEY_FIELD", "PUBLIC_KEY_SUFFIX",
           "AllocationMismatch", "Given", "RecordSigner", "RecordVerifier", "allocated_text",
           "allocation_mismatch", "gpu_indices_text", "key_id", "parse_allocated"]
