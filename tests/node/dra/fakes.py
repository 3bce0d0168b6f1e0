"""Test doubles for the DRA driver: the API server's claims and slices."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from node.dra.slices import Obj
from scheduler.kube.errors import ApiError


@dataclass
class FakeClaims:
    """Claims by (namespace, name); a value that is an exception is raised."""

    claims: dict[tuple[str, str], Any] = field(default_factory=dict)

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        found = self.claims.get((namespace, name))
        if found is None:
            raise ApiError(f"reading ResourceClaim {namespace}/{name}", 404, "not found",
                           reason="Not Found")
        if isinstance(found, Exception):
            raise found
        return dict(found)


@dataclass
class FakeSlices:
    """The API server's slices by name; quantities come back canonical, as the server's do."""

    stored: dict[str, Obj] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    version: int = 0

    def _store(self, body: Obj) -> None:
        body = copy.deepcopy(body)
        for device in body["spec"]["devices"]:
            memory = device["capacity"]["memory"]
            memory["value"] = memory["value"].replace("81920Mi", "80Gi")
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.stored[body["metadata"]["name"]] = body

    def list(self, *, driver: str, node_name: str) -> list[Obj]:
        self.calls.append("list")
        return [copy.deepcopy(s) for s in self.stored.values()
                if s["spec"]["driver"] == driver and s["spec"]["nodeName"] == node_name]

    def create(self, body: Obj) -> None:
        self.calls.append(f"create {body['metadata']['name']}")
        self._store(body)

    def replace(self, name: str, body: Obj) -> None:
        assert body["metadata"]["resourceVersion"] == self.stored[name]["metadata"][
            "resourceVersion"]
        self.calls.append(f"replace {name}")
        self._store(body)

    def delete(self, name: str) -> None:
        self.calls.append(f"delete {name}")
        del self.stored[name]
