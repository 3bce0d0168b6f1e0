"""The right-sizing webhook registered with a real API server, for the e2e tests.

The webhook runs in the test's process on 127.0.0.1 with a serving certificate signed by a CA
made with openssl (tests/defrag/admission/certs.py); a MutatingWebhookConfiguration
(failurePolicy Ignore, pod CREATE, scoped to one namespace) points the API server at it with
that CA bundle. :func:`registered_webhook` yields once the API server has called it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes

from defrag.admission.server import AdmissionServer
from defrag.admission.templates import TemplateStore
from defrag.rightsizing.recommender import PodSample, RightsizingConfig, update
from defrag.rightsizing.workloads import WorkloadClient
from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from gpufrag.conventions import DEFAULT_NAMES
from tests.defrag.admission.certs import make_serving_cert


def recommendation(peak_mib: int, gpu_memory_mib: int, *, hours: int, now: float) -> str:
    """The annotation the controller would publish after ``hours`` hourly peaks of
    ``peak_mib`` (no headroom, so the share is the peak: easy to check)."""
    samples = [PodSample(namespace="x", name="x", uid="x", memory_used_mib=peak_mib,
                         gpu_memory_mib=gpu_memory_mib, timestamp=now - 3600.0 * h)
               for h in range(hours)]
    text, _ = update(None, {"*": samples}, now,
                     RightsizingConfig(headroom_fraction=0.0, headroom_mib=0, min_mib=0))
    return text


@contextmanager
def registered_webhook(plane: ControlPlane, namespace: str, pki: Path, *,
                       templates: TemplateStore | None = None,
                       selector: Mapping[str, Any] | None = None) -> Iterator[AdmissionServer]:
    """The right-sizing webhook (``/mutate``, failurePolicy Ignore) for ``namespace``; with
    ``templates``, the DRA conversion (``/mutate-dra``) as the dra-claims component registers
    it (failurePolicy Fail, sideEffects NoneOnDryRun), for the namespaces ``selector`` names
    (``namespace`` must be among them)."""
    ca, cert, key = make_serving_cert(pki)
    client = WorkloadClient(plane.new_api_client(), timeout_s=2.0)
    server = AdmissionServer(("127.0.0.1", 0), resolve=client.resolve, names=DEFAULT_NAMES,
                             cert_file=str(cert), key_file=str(key),
                             templates=templates).start()
    api = kubernetes.client.AdmissionregistrationV1Api(plane.api_client())
    name = f"gpufrag-{'dra-claims' if templates else 'rightsizing'}-{namespace}"
    rule: dict[str, Any] = {"failurePolicy": "Ignore", "sideEffects": "None"}
    if templates is not None:
        rule = {"failurePolicy": "Fail", "sideEffects": "NoneOnDryRun"}
    api.create_mutating_webhook_configuration({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "claims.gpufrag.io" if templates else "rightsizing.gpufrag.io",
            "clientConfig": {"url": f"https://127.0.0.1:{server.port}/"
                                    f"{'mutate-dra' if templates else 'mutate'}",
                             "caBundle": base64.b64encode(ca.read_bytes()).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": selector or {
                "matchLabels": {"kubernetes.io/metadata.name": namespace}},
            **rule, "timeoutSeconds": 5,
            "reinvocationPolicy": "Never", "admissionReviewVersions": ["v1"]}]})
    try:
        _wait_until_called(plane, namespace, server)
        yield server
    finally:
        api.delete_mutating_webhook_configuration(name)
        server.stop()


def _wait_until_called(plane: ControlPlane, namespace: str, server: AdmissionServer) -> None:
    """The API server picks up a new webhook configuration within about a second: dry-run a
    bare pod until the webhook has seen one."""
    core = kubernetes.client.CoreV1Api(plane.api_client())
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
             "spec": {"containers": [{"name": "c", "image": "pause"}]}}

    def called() -> bool:
        core.create_namespaced_pod(namespace, probe, dry_run="All")
        return bool(server.metrics.registry.get_sample_value(
            "gpufrag_admission_skips_total", {"reason": "bare_pod"}))

    wait_until(called, timeout_s=30, what="the API server to call the webhook")
