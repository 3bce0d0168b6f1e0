"""The ResourceClaimTemplates the webhook's conversions name (the webhook's only writes).

A converted pod names a template by a name derived from its spec
(:func:`defrag.admission.toclaims.template_for`); before the pod is admitted the template must
exist in its namespace, or the resourceclaim controller cannot make the pod's claim. So the
webhook reads it (``get``) and, when absent, creates it (``create``): the two calls its RBAC
grants. AlreadyExists on create (another review made it meanwhile) is read again and judged
like a found one.

A template found under that name with another spec was not made by this webhook, or was
changed since: a tenant (namespace ``edit`` may create templates) could otherwise pre-create
one that steers every later pod's ask of that shape (a selector pinning one device, a config,
a larger count). Such a template refuses the pod (:class:`TemplateConflict`), naming it.

On a dry-run review nothing is created: the API server calls the webhook for dry runs only
because it declares ``sideEffects: NoneOnDryRun``.
"""

from __future__ import annotations

from typing import Any, Protocol

import kubernetes
import orjson

from defrag.admission.toclaims import ClaimTemplate, same_spec
from gpufrag.errors import BadInput
from scheduler.kube.errors import ApiRefusal, call_api


class TemplateConflict(BadInput):
    """A template under the webhook's name holds another spec."""


class TemplateStore(Protocol):
    def ensure(self, namespace: str, template: ClaimTemplate, *, dry_run: bool) -> bool:
        """Make sure ``template`` exists in ``namespace``: True when this call created it.
        Raises :class:`TemplateConflict`, or ``scheduler.kube.errors.ApiError``."""
        ...


def conflict(namespace: str, template: ClaimTemplate) -> TemplateConflict:
    return TemplateConflict(
        f"ResourceClaimTemplate {namespace}/{template.name} exists with a spec other than the "
        f"one gpufrag's webhook gives that name ({template.shape}); pods asking that shape "
        f"are refused until it is deleted (kubectl delete resourceclaimtemplate -n "
        f"{namespace} {template.name}): the webhook recreates it")


class TemplateClient:
    """:class:`TemplateStore` on the API server, each call bounded by ``timeout_s``."""

    def __init__(self, api_client: Any, *, timeout_s: float = 2.0) -> None:
        # Any: the bodies are plain dicts and the answers raw (_preload_content=False), where
        # the client's annotations name its model classes.
        self._api: Any = kubernetes.client.ResourceV1Api(api_client)
        self._timeout_s = timeout_s

    def _read(self, namespace: str, name: str) -> Any | None:
        """The template's ``spec`` (as JSON), or None when there is none."""
        found = call_api(
            f"reading ResourceClaimTemplate {namespace}/{name}",
            lambda: self._api.read_namespaced_resource_claim_template(
                name, namespace, _request_timeout=self._timeout_s, _preload_content=False),
            ok=(404,))
        if isinstance(found, ApiRefusal):
            return None
        return orjson.loads(found.data).get("spec")

    def _check(self, namespace: str, template: ClaimTemplate, spec: Any) -> None:
        if not same_spec(spec, template.spec):
            raise conflict(namespace, template)

    def ensure(self, namespace: str, template: ClaimTemplate, *, dry_run: bool) -> bool:
        spec = self._read(namespace, template.name)
        if spec is not None:
            self._check(namespace, template, spec)
            return False
        if dry_run:
            return False
        made = call_api(
            f"creating ResourceClaimTemplate {namespace}/{template.name}",
            lambda: self._api.create_namespaced_resource_claim_template(
                namespace, template.body(namespace), _request_timeout=self._timeout_s,
                _preload_content=False),
            ok=(409,))
        if isinstance(made, ApiRefusal):  # made meanwhile: judge it as found
            self._check(namespace, template, self._read(namespace, template.name))
            return False
        return True
