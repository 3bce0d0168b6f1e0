"""Placement hints from the defrag controller, read from its ConfigMap.

The controller evicts a pod to make room and knows where its replacement should land; it writes
``data[<owner uid>] = '[{"node": "gpu-7", "expires": 1767225600}]'`` into one ConfigMap
(``gpufrag.conventions.HINTS_CONFIGMAP`` in ``HINTS_NAMESPACE`` by default). The extender scores
the hinted node(s) highest for pods of that owner until the hint expires. A malformed entry is
skipped and reported, never fatal: hints are advice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PlacementHints:
    """Owner UID -> ((node, expires unix seconds), ...)."""

    by_owner: Mapping[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)

    def nodes_for(self, owner: str, now: float) -> frozenset[str]:
        """The nodes hinted for pods of ``owner`` that have not expired at ``now``."""
        if not owner:
            return frozenset()
        return frozenset(node for node, expires in self.by_owner.get(owner, ()) if expires > now)

    def __len__(self) -> int:
        return len(self.by_owner)


NO_HINTS = PlacementHints()


def _entries(text: str) -> list[tuple[str, float]]:
    value = orjson.loads(text)
    if isinstance(value, dict):  # one hint, as the per-workload annotation carries it
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"expected a JSON list of {{node, expires}}, got {type(value).__name__}")
    entries = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"item {i} is not an object")
        node, expires = item.get("node"), item.get("expires")
        if not isinstance(node, str) or not node:
            raise ValueError(f"item {i}: 'node' must be a non-empty string, got {node!r}")
        if isinstance(expires, bool) or not isinstance(expires, int | float):
            raise ValueError(f"item {i}: 'expires' must be unix seconds, got {expires!r}")
        entries.append((node, float(expires)))
    return entries


def hints_from_configmap(obj: Obj | None) -> tuple[PlacementHints, list[str]]:
    """The hints in a ConfigMap (None = no ConfigMap = no hints) and a problem per bad entry."""
    if obj is None:
        return NO_HINTS, []
    data = obj.get("data") or {}
    if not isinstance(data, Mapping):
        return NO_HINTS, [f"data is {type(data).__name__}, not a mapping"]
    hints: dict[str, tuple[tuple[str, float], ...]] = {}
    problems: list[str] = []
    for owner, text in data.items():
        try:
            if not isinstance(text, str):
                raise ValueError(f"value is {type(text).__name__}, not a string")
            hints[str(owner)] = tuple(_entries(text))
        except (ValueError, orjson.JSONDecodeError) as e:
            problems.append(f"hint for owner {owner}: {e}")
    return PlacementHints(hints), problems
