"""The kube-scheduler extender v1 wire types, as JSON.

The Go types (``k8s.io/kube-scheduler/extender/v1``) carry no JSON tags, so every key is the Go
field name in PascalCase:

- ExtenderArgs: ``{"Pod": v1.Pod, "Nodes": v1.NodeList | null, "NodeNames": [string] | null}``
  — ``NodeNames`` when the extender is configured ``nodeCacheCapable: true``, ``Nodes``
  otherwise.
- ExtenderFilterResult: ``{"Nodes", "NodeNames", "FailedNodes": {node: reason},
  "FailedAndUnresolvableNodes": {node: reason}, "Error": ""}``, answered in the form asked.
- HostPriorityList: ``[{"Host": name, "Score": 0..10}]``.
- ExtenderBindingArgs: ``{"PodName", "PodNamespace", "PodUID", "Node"}`` ->
  ExtenderBindingResult ``{"Error": ""}``.

Parsing checks types and says what is wrong (``WireError`` -> HTTP 400); it never interprets
the Pod — that is ``scheduler.kube.convert``'s job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import compress
from typing import Any

import orjson

from scheduler.extender.scoring import FilterVerdicts

Obj = Mapping[str, Any]


class WireError(ValueError):
    """A request body that is not what the protocol says; the message names the field."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: Obj
    names: list[str]
    nodes: list[Obj] | None  # the NodeList items in Nodes mode; None in NodeNames mode

    @property
    def node_names_mode(self) -> bool:
        return self.nodes is None


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def _object(body: bytes) -> dict[str, Any]:
    if not body:
        raise WireError("empty request body; expected a JSON object")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise WireError(f"request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise WireError(f"request body must be a JSON object, got {type(value).__name__}")
    return value


def _node_items(nodes: Any) -> tuple[list[Obj], list[str]]:
    if not isinstance(nodes, dict):
        raise WireError(f"Nodes must be a v1.NodeList object, got {type(nodes).__name__}")
    items = nodes.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise WireError(f"Nodes.items must be a list, got {type(items).__name__}")
    names = []
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise WireError(f"Nodes.items[{i}].metadata.name must be a non-empty string")
        names.append(name)
    return items, names


def parse_extender_args(body: bytes) -> ExtenderArgs:
    """ExtenderArgs for filter and prioritize."""
    args = _object(body)
    pod = args.get("Pod")
    if pod is None:
        raise WireError("Pod is missing or null")
    if not isinstance(pod, dict):
        raise WireError(f"Pod must be a v1.Pod object, got {type(pod).__name__}")
    names = args.get("NodeNames")
    if names is not None:
        if not isinstance(names, list):
            raise WireError(f"NodeNames must be a list of strings, got {type(names).__name__}")
        # The entries are checked where they are looked up (Extender._rows): a per-name check
        # here would cost as much as the lookup itself on every request.
        return ExtenderArgs(pod, names, None)
    nodes = args.get("Nodes")
    if nodes is None:
        raise WireError("one of NodeNames (nodeCacheCapable: true) or Nodes must be given")
    items, names = _node_items(nodes)
    return ExtenderArgs(pod, names, items)


def _string(args: Obj, key: str, *, required: bool) -> str:
    value = args.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise WireError(f"{key} must be a non-empty string, got {value!r}")
    return value


def parse_binding_args(body: bytes) -> BindingArgs:
    """ExtenderBindingArgs for bind."""
    args = _object(body)
    return BindingArgs(pod_name=_string(args, "PodName", required=True),
                       pod_namespace=_string(args, "PodNamespace", required=True),
                       pod_uid=_string(args, "PodUID", required=False),
                       node=_string(args, "Node", required=True))


def filter_result(args: ExtenderArgs, outcome: FilterVerdicts) -> dict[str, Any]:
    """ExtenderFilterResult in the form the request used (NodeNames or Nodes)."""
    names = args.names
    failed_names = [names[i] for i in outcome.failed.tolist()]
    hard = outcome.unresolvable.tolist()
    soft = (~outcome.unresolvable).tolist()
    failed = dict(zip(compress(failed_names, soft), compress(outcome.reasons, soft),
                      strict=True))
    unresolvable = dict(zip(compress(failed_names, hard), compress(outcome.reasons, hard),
                            strict=True))
    mask = outcome.passed.tolist()
    if args.nodes is None:
        passed = names if not failed_names else list(compress(names, mask))
        return {"Nodes": None, "NodeNames": passed, "FailedNodes": failed,
                "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
    return {"Nodes": {"metadata": {}, "items": list(compress(args.nodes, mask))},
            "NodeNames": None, "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable, "Error": ""}


def filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": message}


def priorities(names: list[str], scores: list[int]) -> list[dict[str, Any]]:
    return [{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)]


__all__ = ["BindingArgs", "ExtenderArgs", "WireError", "filter_error",
           "filter_result", "parse_binding_args", "parse_extender_args", "priorities"]
