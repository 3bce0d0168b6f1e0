"""The record keys in the cluster: the extender's signing key and the public keys the device
plugins trust (:mod:`gpufrag.records`; who may read and write them: docs/security.md).

Both live in ``names.hints_namespace``: the private key in the Secret ``names.record_key_secret``
(key ``ed25519.pem``), readable by the extender's ServiceAccount only; the public keys in the
ConfigMap ``names.record_keys_configmap`` (``<key id>.pem`` each), which the device plugins read.

:func:`ensure_signer` runs once as the extender starts: it uses the Secret's key when there is
one (an operator may create it, e.g. with ``openssl genpkey -algorithm ed25519``), and
otherwise makes one and creates the Secret; then it adds its public key to the ConfigMap if it
is not there. Two replicas starting at once create the same objects: the API server lets one
create win (409 for the other, which then reads the winner's key), so both sign with one key.
Public keys are only ever added, so records signed with an older key stay valid until an
operator removes that key (rotation).
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable
from typing import Any

import kubernetes
import structlog

from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from gpufrag.records import PRIVATE_KEY_FIELD, PUBLIC_KEY_SUFFIX, RecordSigner
from scheduler.kube.errors import ApiError, api_errors

log = structlog.get_logger("gpufrag.recordkeys")

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


class RecordKeyError(RuntimeError):
    """The signing key cannot be had (the API refused or is unreachable, or the Secret holds
    something else); the message says what to fix."""


def _read_signer(core: Any, names: KubeNames) -> RecordSigner | None:
    where = f"Secret {names.hints_namespace}/{names.record_key_secret}"
    try:
        with api_errors(f"reading {where}"):
            secret = core.read_namespaced_secret(names.record_key_secret, names.hints_namespace)
    except ApiError as e:
        if e.status == HTTP_NOT_FOUND:
            return None
        raise
    data = secret.data or {}
    if PRIVATE_KEY_FIELD not in data:
        raise RecordKeyError(f"{where} has no {PRIVATE_KEY_FIELD!r} key (it holds "
                             f"{sorted(data) or 'nothing'}); put an Ed25519 private key in PEM "
                             "there, or delete the Secret to have the extender make one")
    try:
        return RecordSigner.from_pem(base64.b64decode(data[PRIVATE_KEY_FIELD]),
                                     source=f"{where} key {PRIVATE_KEY_FIELD}")
    except (BadInput, ValueError) as e:
        raise RecordKeyError(str(e)) from None


def _create_signer(core: Any, names: KubeNames) -> RecordSigner | None:
    """A new key in a new Secret; None when another replica created the Secret first."""
    signer = RecordSigner.generate()
    body = kubernetes.client.V1Secret(
        metadata=kubernetes.client.V1ObjectMeta(
            name=names.record_key_secret, namespace=names.hints_namespace,
            labels={"app.kubernetes.io/part-of": "gpufrag"}),
        type="Opaque",
        data={PRIVATE_KEY_FIELD: base64.b64encode(signer.private_pem()).decode()})
    try:
        with api_errors(f"creating Secret {names.hints_namespace}/{names.record_key_secret}"):
            core.create_namespaced_secret(names.hints_namespace, body)
    except ApiError as e:
        if e.status == HTTP_CONFLICT:
            return None
        raise
    log.info("record key created", secret=f"{names.hints_namespace}/{names.record_key_secret}",
             key_id=signer.key_id)
    return signer


def _publish(core: Any, names: KubeNames, signer: RecordSigner) -> None:
    """Add the signer's public key to the ConfigMap (made if missing); keys there stay."""
    where = f"ConfigMap {names.hints_namespace}/{names.record_keys_configmap}"
    entry = {f"{signer.key_id}{PUBLIC_KEY_SUFFIX}": signer.public_pem().decode()}
    for _ in range(3):  # a create or patch racing another replica's: read again
        try:
            with api_errors(f"reading {where}"):
                current = core.read_namespaced_config_map(names.record_keys_configmap,
                                                          names.hints_namespace)
        except ApiError as e:
            if e.status != HTTP_NOT_FOUND:
                raise
            current = None
        try:
            if current is None:
                with api_errors(f"creating {where}"):
                    core.create_namespaced_config_map(names.hints_namespace, {
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": names.record_keys_configmap,
                                     "namespace": names.hints_namespace,
                                     "labels": {"app.kubernetes.io/part-of": "gpufrag"}},
                        "data": entry})
            elif (current.data or {}).get(next(iter(entry))) != next(iter(entry.values())):
                with api_errors(f"adding key {signer.key_id} to {where}"):
                    core.patch_namespaced_config_map(names.record_keys_configmap,
                                                     names.hints_namespace, {"data": entry})
            return
        except ApiError as e:
            if e.status != HTTP_CONFLICT:
                raise
    raise RecordKeyError(f"{where}: the public key {signer.key_id} could not be added (it kept "
                         "changing)")


def ensure_signer(api_client: Any, names: KubeNames) -> RecordSigner:
    """The extender's signing key, made and published if need be (module docstring); raises
    :class:`RecordKeyError` with what to fix when it cannot be had."""
    core = kubernetes.client.CoreV1Api(api_client)
    try:
        signer = _read_signer(core, names)
        if signer is None:
            signer = _create_signer(core, names) or _read_signer(core, names)
        if signer is None:
            raise RecordKeyError(f"Secret {names.hints_namespace}/{names.record_key_secret} "
                                 "was created and deleted again while the extender started")
        _publish(core, names, signer)
    except ApiError as e:
        hint = (" (the extender's ServiceAccount needs get/create on that Secret and "
                "get/create/patch on the ConfigMap: manifests/base/rbac-scheduler.yaml)"
                if e.status == 403 else "")
        raise RecordKeyError(f"the GPU record key: {e}{hint}") from None
    return signer




# The first try is at once; then every RETRY_S, until a key is had (a missing namespace, RBAC
# not applied yet, an API server not reachable yet).
RETRY_S = 10.0


class SignerBootstrap:
    """Gets the signing key in a thread of its own and hands it to ``on_signer``: the extender
    starts (and serves filters) whatever the API says, and binds are signed from the moment the
    key is had. Until then binds carry no signature, which gpufrag's device plugin refuses (the
    pod's Event says so); each failed try is logged with what to fix (module docstring)."""

    def __init__(self, new_api_client: Callable[[], Any], names: KubeNames,
                 on_signer: Callable[[RecordSigner], None], *, retry_s: float = RETRY_S
                 ) -> None:
        self._new_api_client = new_api_client
        self._names = names
        self._on_signer = on_signer
        self._retry_s = retry_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error = ""

    def try_once(self) -> bool:
        """One attempt; True once the key is had (and handed over)."""
        client = self._new_api_client()
        try:
            signer = ensure_signer(client, self._names)
        except RecordKeyError as e:
            self.last_error = str(e)
            log.error("record key unavailable", error=str(e), retry_in_s=self._retry_s,
                      effect="binds carry no GPU-record signature until it is had: gpufrag's "
                             "device plugin refuses their GPU records")
            return False
        finally:
            client.close()
        self.last_error = ""
        self._on_signer(signer)
        log.info("record key ready", key_id=signer.key_id)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.try_once():
                    return
            except Exception:  # a client that cannot even be made: try again later
                log.exception("record key bootstrap failed")
            self._stop.wait(self._retry_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="record-key", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


__all__ = ["RETRY_S", "RecordKeyError", "SignerBootstrap", "ensure_signer"]
