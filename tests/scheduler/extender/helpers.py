"""Helpers for the extender (and kube) tests: a fake clock, a recording binder, and an
extender served from in-memory Kubernetes objects (the snapshot path), driven through Flask's
test client."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from flask.testing import FlaskClient

from scheduler.core import NodeSpec, PodRequest
from scheduler.extender.config import ExtenderConfig, config_from_mapping
from scheduler.extender.runtime import Runtime, snapshot_runtime
from scheduler.kube.binder import BindCall
from scheduler.kube.convert import node_to_k8s, pod_to_k8s
from scheduler.kube.snapshot import Snapshot

Obj = Mapping[str, Any]


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class RecordingBinder:
    """Records binds; ``fail_with`` makes the next bind fail; ``pods`` answers read_pod."""

    pods: dict[str, Obj] = field(default_factory=dict)
    calls: list[BindCall] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    fail_with: Exception | None = None

    def read_pod(self, namespace: str, name: str) -> Obj | None:
        self.reads.append(f"{namespace}/{name}")
        return self.pods.get(f"{namespace}/{name}")

    def bind(self, namespace: str, name: str, uid: str, node: str,
             gpus: tuple[int, ...] | None) -> None:
        if self.fail_with is not None:
            error, self.fail_with = self.fail_with, None
            raise error
        self.calls.append(BindCall(namespace, name, uid, node, gpus))


def make_config(**sections: Any) -> ExtenderConfig:
    return config_from_mapping(sections)


def serve(nodes: Iterable[NodeSpec | Obj], pods: Iterable[Obj] = (), *,
          config: ExtenderConfig | None = None, clock: FakeClock | None = None,
          binder: RecordingBinder | None = None, configmaps: Iterable[Obj] = ()) -> Runtime:
    """An extender over these nodes and pods (NodeSpecs are converted to Node objects)."""
    node_objs = [node_to_k8s(n) if isinstance(n, NodeSpec) else n for n in nodes]
    snapshot = Snapshot(nodes=node_objs, pods=list(pods), configmaps=list(configmaps))
    return snapshot_runtime(snapshot, config or ExtenderConfig(), clock=clock or FakeClock(),
                            binder=binder if binder is not None else RecordingBinder())


def k8s_pod(pod: PodRequest, **kwargs: Any) -> dict[str, Any]:
    return pod_to_k8s(pod, **kwargs)


def post(client: FlaskClient, path: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    response = client.post(path, data=data, content_type="application/json")
    return response.status_code, orjson.loads(response.data)
