"""One way to get a Kubernetes API client: a kubeconfig when given, in-cluster when running in a
pod, else the default kubeconfig (``~/.kube/config`` or ``$KUBECONFIG``)."""

from __future__ import annotations

import os
from typing import Any

import kubernetes

from gpufrag.errors import BadInput


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A ``kubernetes.client.ApiClient``; raises :class:`BadInput` when no configuration works."""
    config: Any = kubernetes.config  # the config loaders carry no type hints
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            return kubernetes.client.ApiClient()
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError, ValueError) as e:
        where = kubeconfig or "the default kubeconfig"
        raise BadInput(f"no usable Kubernetes configuration ({where}): {e}; pass --kubeconfig, "
                       "or run in a pod with a service account", source=kubeconfig) from None
