"""Cluster snapshots: a Kubernetes ``List`` of Nodes and Pods in one JSON or YAML file.

The extender runs from a snapshot (``--cluster-snapshot``) for offline debugging, demos and
benchmarks; ``gpufrag export-snapshot`` writes one from a live cluster. The format is what
``kubectl get nodes,pods -A -o yaml`` prints (a ``v1/List``), so either tool's output is accepted;
``NodeList``/``PodList`` documents, several YAML documents, and a ConfigMap (the defrag
controller's placement hints) are accepted too. Other kinds are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from gpufrag.errors import BadInput

Obj = Mapping[str, Any]
KINDS = ("Node", "Pod", "ConfigMap")
_LIST_ITEM_KIND = {"NodeList": "Node", "PodList": "Pod", "ConfigMapList": "ConfigMap"}
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: list[Obj] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)
    configmaps: list[Obj] = field(default_factory=list)

    def configmap(self, namespace: str, name: str) -> Obj | None:
        for cm in self.configmaps:
            meta = cm.get("metadata") or {}
            if meta.get("name") == name and (meta.get("namespace") or "") == namespace:
                return cm
        return None


def _is_yaml(path: Path) -> bool:
    return path.suffix.lower() in {".yaml", ".yml"}


def _documents(path: Path) -> list[Any]:
    source = str(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BadInput(f"cannot read: {e.strerror}", source=source) from None
    if not _is_yaml(path):
        try:
            return [orjson.loads(raw)]
        except orjson.JSONDecodeError as e:
            if path.suffix.lower() == ".json":
                raise BadInput(f"not valid JSON: {e}", source=source) from None
    try:
        return [d for d in yaml.load_all(raw, Loader=_YAML_LOADER) if d is not None]
    except yaml.YAMLError as e:
        raise BadInput(f"not valid JSON or YAML: {e}", source=source) from None


def parse_snapshot(documents: Iterable[Any], source: str = "snapshot") -> Snapshot:
    """Sort the objects of parsed documents into nodes, pods and config maps."""
    snapshot = Snapshot()
    buckets = {"Node": snapshot.nodes, "Pod": snapshot.pods, "ConfigMap": snapshot.configmaps}
    for d, doc in enumerate(documents):
        if not isinstance(doc, Mapping):
            raise BadInput(f"document {d} is {type(doc).__name__}, not an object", source=source)
        kind = doc.get("kind")
        if kind in KINDS:
            buckets[str(kind)].append(doc)
            continue
        items = doc.get("items")
        if not isinstance(items, list):
            raise BadInput(f"document {d} (kind {kind!r}) is neither a List nor a Node or Pod",
                           source=source, field="items")
        implied = _LIST_ITEM_KIND.get(str(kind))
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise BadInput("not an object", source=source, field=f"items[{i}]")
            item_kind = item.get("kind") or implied
            if item_kind in buckets:
                buckets[str(item_kind)].append(item)
            elif item_kind is None:
                raise BadInput("item without kind in a List", source=source,
                               field=f"items[{i}].kind")
    return snapshot


def read_snapshot(path: str | Path) -> Snapshot:
    """Read a snapshot file; JSON or YAML by extension (``.json``, ``.yaml``/``.yml``)."""
    p = Path(path)
    return parse_snapshot(_documents(p), str(p))


def snapshot_document(nodes: Iterable[Obj], pods: Iterable[Obj],
                      configmaps: Iterable[Obj] = ()) -> dict[str, Any]:
    """A ``v1/List`` holding the given objects, each with its ``kind`` and ``apiVersion`` set
    (list responses from the API server leave them out of the items)."""
    items: list[Obj] = []
    for kind, objs in (("Node", nodes), ("Pod", pods), ("ConfigMap", configmaps)):
        items += [{"apiVersion": "v1", "kind": kind, **obj} for obj in objs]
    return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}


def write_snapshot(path: str | Path, nodes: Iterable[Obj], pods: Iterable[Obj],
                   configmaps: Iterable[Obj] = ()) -> int:
    """Write a snapshot (YAML for ``.yaml``/``.yml``, JSON otherwise); returns the item count."""
    p = Path(path)
    doc = snapshot_document(nodes, pods, configmaps)
    if _is_yaml(p):
        p.write_text(yaml.dump(doc, Dumper=_YAML_DUMPER, sort_keys=False))
    else:
        p.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return len(doc["items"])
