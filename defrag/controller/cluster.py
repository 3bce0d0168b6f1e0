"""Read the cluster for one cycle: Nodes, Pods, PodDisruptionBudgets and, with DRA,
ResourceClaims and the driver's ResourceSlices, as JSON dicts.

Reads only (every write is in :mod:`defrag.controller.executor`). Lists are paged so a
50,000-pod cluster is read in bounded chunks, and parsed with orjson straight from the
response body rather than through the client's model classes (several times faster, and what
the converters expect).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from defrag.controller.errors import ApiRefusal, call_api, call_api_or_refusal
from scheduler.kube import reservations as rsv
from scheduler.kube.claims import DRIVER_NAME
from scheduler.kube.watch import list_objects

Obj = Mapping[str, Any]
PAGE = 2000


def _list_all(what: str, fn: Callable[..., Any]) -> list[Obj]:
    """Every object, in pages, without managedFields (the cycle holds them all at once; with
    50,000 running pods and 5,000 nodes, dropping them took the snapshot's read from 1,308
    to 906 MiB, measured in-process)."""
    return call_api(f"listing {what}",
                    lambda: list_objects(fn, PAGE, what=what, slim=True)[0])


def read_nodes_and_pods(api_client: Any) -> tuple[list[Obj], list[Obj]]:
    """(nodes, pods) of the whole cluster."""
    core = client.CoreV1Api(api_client)
    return (_list_all("nodes", core.list_node),
            _list_all("pods", core.list_pod_for_all_namespaces))


def read_cluster(api_client: Any) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """(nodes, pods, pdbs) of the whole cluster."""
    policy = client.PolicyV1Api(api_client)
    nodes, pods = read_nodes_and_pods(api_client)
    pdbs = _list_all("PodDisruptionBudgets",
                     policy.list_pod_disruption_budget_for_all_namespaces)
    return nodes, pods, pdbs


@dataclass(frozen=True, slots=True)
class DraObjects:
    """What DRA adds to a cycle's read: every ResourceClaim (what a pod that asks its GPUs
    through claims holds is its claims' allocation) and the driver's ResourceSlices (the GPUs
    of a node whose Node advertises none), and a note when they could not be read."""

    claims: list[Obj] = field(default_factory=list)
    slices: list[Obj] = field(default_factory=list)
    note: str = ""


def _listed(call: Callable[..., Any], what: str) -> list[Obj]:
    return list_objects(call, PAGE, what=what, slim=True)[0]


def read_dra(api_client: Any, driver: str = DRIVER_NAME) -> DraObjects:
    """ResourceClaims and ``driver``'s ResourceSlices (docs/dra.md). Where the cluster serves
    no ``resource.k8s.io/v1`` (404) there are none and nothing to say; where the caller may
    not list them (403) the note says so: DRA pods and nodes then hold no GPU in the picture."""
    resource = client.ResourceV1Api(api_client)
    found: dict[str, list[Obj]] = {}
    for what, call in (
            ("ResourceClaims", resource.list_resource_claim_for_all_namespaces),
            ("ResourceSlices", functools.partial(resource.list_resource_slice,
                                                 field_selector=f"spec.driver={driver}"))):
        answer = call_api_or_refusal(
            f"listing {what}",
            functools.partial(_listed, call, what), ok=(403, 404))
        if isinstance(answer, ApiRefusal):
            if answer.status == 404:
                return DraObjects()
            return DraObjects(note=(
                f"{what} not readable (HTTP {answer.status}: {answer.message}): pods and "
                "nodes that get their GPUs through DRA hold none in this picture"))
        found[what] = answer
    return DraObjects(found["ResourceClaims"], found["ResourceSlices"])


def read_reservations(api_client: Any, namespace: str) -> list[Obj] | None:
    """The GPUReservations in ``namespace`` (None when the CRD is not installed)."""
    custom = client.CustomObjectsApi(api_client)

    def listing() -> Any:
        return custom.list_namespaced_custom_object(rsv.GROUP, rsv.VERSION, namespace,
                                                    rsv.PLURAL)

    answer = call_api_or_refusal(f"listing GPUReservations in {namespace}", listing, ok=(404,))
    if isinstance(answer, ApiRefusal):
        return None
    items: list[Obj] = answer.get("items") or []
    return items
