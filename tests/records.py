"""The GPU-record key of the tests: pods the tests place "as the extender binds them" carry a
record signed with it, and the device plugins under test trust it (gpufrag.records)."""

from __future__ import annotations

from typing import Any, Final

import kubernetes

from devkit.controlplane import ensure_namespace
from gpufrag.conventions import ANNOTATION_GPU_INDICES, ANNOTATION_GPU_RECORD, DEFAULT_NAMES
from gpufrag.records import PUBLIC_KEY_SUFFIX, RecordSigner

SIGNER: Final = RecordSigner.generate()


def signed_record(uid: str, node: str, gpus_text: str) -> dict[str, str]:
    """The annotations the extender's bind writes: the GPU indices and their signature."""
    return {ANNOTATION_GPU_INDICES: gpus_text,
            ANNOTATION_GPU_RECORD: SIGNER.sign(uid=uid, node=node, gpus_text=gpus_text)}


def publish_test_key(core: Any) -> None:
    """Put the test key in the ConfigMap the device plugins read (kubernetes CoreV1Api)."""
    namespace, name = DEFAULT_NAMES.hints_namespace, DEFAULT_NAMES.record_keys_configmap
    data = {f"{SIGNER.key_id}{PUBLIC_KEY_SUFFIX}": SIGNER.public_pem().decode()}
    ensure_namespace(core, namespace)  # one another module's clean-up deletes is made again
    try:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name},
                                                      "data": data})
    except Exception as e:
        if getattr(e, "status", None) != 409:
            raise
        core.patch_namespaced_config_map(name, namespace, {"data": data})


# A scheduler name no scheduler serves: pods placed by place_as_the_extender wait for its
# Binding, as gpufrag-scheduler's pods wait for the extender's.
UNSERVED_SCHEDULER: Final = "gpufrag-e2e-binder"


def place_as_the_extender(core: Any, namespace: str, body: dict[str, Any], node: str,
                          gpus_text: str) -> Any:
    """Create the pod unbound and bind it to ``node`` with its GPU record, the way the
    extender's bind does (a Binding whose annotations the API server copies onto the pod, the
    record signed for the pod's UID); returns the created pod (kubernetes CoreV1Api)."""
    spec = {k: v for k, v in body["spec"].items() if k != "nodeName"}
    created = core.create_namespaced_pod(
        namespace, {**body, "spec": {**spec, "schedulerName": UNSERVED_SCHEDULER}})
    binding = kubernetes.client.V1Binding(
        metadata=kubernetes.client.V1ObjectMeta(
            name=created.metadata.name,
            annotations=signed_record(created.metadata.uid, node, gpus_text)),
        target=kubernetes.client.V1ObjectReference(api_version="v1", kind="Node", name=node))
    core.create_namespaced_pod_binding(created.metadata.name, namespace, binding,
                                       _preload_content=False)
    return created
