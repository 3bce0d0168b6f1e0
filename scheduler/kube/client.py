"""One way to get a Kubernetes API client: a kubeconfig when given, in-cluster when running in a
pod, else the default kubeconfig (``~/.kube/config`` or ``$KUBECONFIG``).

Every request it makes has a deadline. The Kubernetes client waits for ever by default, and an
API server (or a proxy before it) that accepts a connection and never answers would then hold
the calling thread for good: a device plugin's Allocate, a defrag cycle, an agent's write. Calls
that need longer or shorter pass their own ``_request_timeout`` (a watch: its server-side
timeout plus a margin; a list: :data:`scheduler.kube.watch.LIST_READ_TIMEOUT_S`); every other
call gets :data:`REQUEST_TIMEOUT_S`.
"""

from __future__ import annotations

import os
from typing import Any, Final

import kubernetes

from gpufrag.errors import BadInput

# (connect, read) seconds for a call that names no deadline of its own.
REQUEST_TIMEOUT_S: Final = (5.0, 30.0)


class DeadlineApiClient(kubernetes.client.ApiClient):
    """A ``kubernetes.client.ApiClient`` that gives every request without a deadline of its
    own ``request_timeout_s`` ((connect, read) seconds, or a total)."""

    def __init__(self, configuration: Any = None, *,
                 request_timeout_s: tuple[float, float] | float = REQUEST_TIMEOUT_S) -> None:
        super().__init__(configuration)
        self.request_timeout_s = request_timeout_s

    def call_api(self, method: Any, url: Any, header_params: Any = None, body: Any = None,
                 post_params: Any = None, _request_timeout: Any = None) -> Any:
        if _request_timeout is None:
            _request_timeout = self.request_timeout_s
        return super().call_api(method, url, header_params, body, post_params,
                                _request_timeout=_request_timeout)


def api_client(kubeconfig: str | None = None, context: str | None = None, *,
               request_timeout_s: tuple[float, float] | float = REQUEST_TIMEOUT_S) -> Any:
    """A :class:`DeadlineApiClient`; raises :class:`BadInput` when no configuration works."""
    config: Any = kubernetes.config  # the config loaders carry no type hints
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            return DeadlineApiClient(request_timeout_s=request_timeout_s)
        configuration = kubernetes.client.Configuration()
        config.load_kube_config(config_file=kubeconfig, context=context,
                                client_configuration=configuration)
        return DeadlineApiClient(configuration, request_timeout_s=request_timeout_s)
    except (config.ConfigException, OSError, ValueError) as e:
        where = kubeconfig or "the default kubeconfig"
        raise BadInput(f"no usable Kubernetes configuration ({where}): {e}; pass --kubeconfig, "
                       "or run in a pod with a service account", source=kubeconfig) from None
