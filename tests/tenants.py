"""An ordinary namespace user for the end-to-end tests: a ServiceAccount bound to the built-in
``edit`` ClusterRole in its own namespace only (create, patch and delete pods, Deployments,
ConfigMaps there; nothing cluster-wide), with a real token from the TokenRequest API."""

from __future__ import annotations

from pathlib import Path

import kubernetes

from devkit.controlplane import ControlPlane
from devkit.pki import kubeconfig_yaml
from devkit.procs import wait_until


def tenant_client(plane: ControlPlane, namespace: str, folder: Path,
                  name: str = "tenant") -> kubernetes.client.ApiClient:
    """A client authenticated as ``namespace``'s user ``name`` (made here)."""
    core = kubernetes.client.CoreV1Api(plane.api_client())
    rbac = kubernetes.client.RbacAuthorizationV1Api(plane.api_client())
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": f"{name}-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    token = wait_until(lambda: core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}).status.token,
        timeout_s=30, what=f"a token for {namespace}/{name}")
    ca = Path(plane.api_client().configuration.ssl_ca_cert).read_bytes()
    path = folder / f"{namespace}-{name}.kubeconfig"
    path.write_text(kubeconfig_yaml(plane.server, ca, token))
    client = kubernetes.config.new_client_from_config(config_file=str(path))
    # The user can do what edit allows in its namespace, and no more.
    auth = kubernetes.client.AuthorizationV1Api(client)
    review = auth.create_self_subject_access_review({"spec": {"resourceAttributes": {
        "namespace": namespace, "verb": "patch", "resource": "pods"}}})
    assert review.status.allowed, review.status
    return client
