"""Read the cluster for one cycle: Nodes, Pods and PodDisruptionBudgets as JSON dicts.

Reads only (every write is in :mod:`defrag.controller.executor`). Lists are paged so a
50,000-pod cluster is read in bounded chunks, and parsed with orjson straight from the
response body rather than through the client's model classes (several times faster, and what
the converters expect).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import orjson
from kubernetes import client

from defrag.controller.errors import ApiRefusal, call_api, call_api_or_refusal
from scheduler.kube import reservations as rsv

Obj = Mapping[str, Any]
PAGE = 2000


def _list_all(what: str, fn: Callable[..., Any]) -> list[Obj]:
    items: list[Obj] = []
    token: str | None = None
    while True:
        answer = call_api(f"listing {what}", partial(fn, limit=PAGE, _continue=token,
                                                     _preload_content=False))
        page = orjson.loads(answer.data)
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue") or None
        if not token:
            return items


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
