"""Helpers for the extender (and kube) tests: a fake clock, a recording binder, an extender
served from in-memory Kubernetes objects (the snapshot path), driven through Flask's test
client, and certificates for the TLS tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from flask.testing import FlaskClient

from gpufrag.conventions import SCHEDULER_NAME
from scheduler.core import NodeSpec, PodRequest
from scheduler.extender.config import ExtenderConfig, config_from_mapping
from scheduler.extender.runtime import Runtime, snapshot_runtime
from scheduler.kube.binder import BindCall
from scheduler.kube.convert import key_of, node_to_k8s, pod_to_k8s
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
    nodes: dict[str, Obj] = field(default_factory=dict)
    fail_with: Exception | None = None

    def read_pod(self, namespace: str, name: str) -> Obj | None:
        self.reads.append(f"{namespace}/{name}")
        return self.pods.get(f"{namespace}/{name}")

    def read_node(self, name: str) -> Obj | None:
        return self.nodes.get(name)

    def bind(self, namespace: str, name: str, uid: str, node: str,
             gpus: tuple[int, ...] | None, extra: Mapping[str, str] | None = None) -> None:
        if self.fail_with is not None:
            error, self.fail_with = self.fail_with, None
            raise error
        self.calls.append(BindCall(namespace, name, uid, node, gpus, dict(extra or {})))


def make_config(**sections: Any) -> ExtenderConfig:
    return config_from_mapping(sections)


def serve(nodes: Iterable[NodeSpec | Obj], pods: Iterable[Obj] = (), *,
          config: ExtenderConfig | None = None, clock: FakeClock | None = None,
          binder: RecordingBinder | None = None, configmaps: Iterable[Obj] = ()) -> Runtime:
    """An extender over these nodes and pods (NodeSpecs are converted to Node objects)."""
    node_objs = [node_to_k8s(n) if isinstance(n, NodeSpec) else n for n in nodes]
    snapshot = Snapshot(nodes=node_objs, pods=list(pods), configmaps=list(configmaps))
    binder = binder if binder is not None else RecordingBinder()
    for obj in snapshot.pods:  # the API server knows the pods the watch showed
        binder.pods.setdefault(key_of(obj), obj)
    for obj in snapshot.nodes:
        binder.nodes.setdefault(key_of(obj), obj)
    return snapshot_runtime(snapshot, config or ExtenderConfig(), clock=clock or FakeClock(),
                            binder=binder)


def k8s_pod(pod: PodRequest, **kwargs: Any) -> dict[str, Any]:
    """A Pod object for ``pod``, of gpufrag's scheduler unless ``scheduler_name`` says else."""
    return pod_to_k8s(pod, **{"scheduler_name": SCHEDULER_NAME, **kwargs})


def post(client: FlaskClient, path: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    response = client.post(path, data=data, content_type="application/json")
    return response.status_code, orjson.loads(response.data)


def filtered(runtime: Runtime, pod_obj: Obj, names: list[str]) -> dict[str, Any]:
    """The /filter reply for ``pod_obj`` over ``names`` (asserting a 200)."""
    status, reply = post(runtime.app.test_client(), "/filter",
                         {"Pod": pod_obj, "NodeNames": names})
    assert status == 200, reply
    result: dict[str, Any] = reply
    return result


def scores(runtime: Runtime, pod_obj: Obj, names: list[str]) -> dict[str, int]:
    """The /prioritize scores for ``pod_obj`` by node name (asserting a 200)."""
    status, reply = post(runtime.app.test_client(), "/prioritize",
                         {"Pod": pod_obj, "NodeNames": names})
    assert status == 200, reply
    return {h["Host"]: h["Score"] for h in reply}


def bound(runtime: Runtime, name: str, node_name: str) -> dict[str, Any]:
    """The /bind reply for pod ``default/<name>`` (UID ``uid-<name>``) onto ``node_name``."""
    status, reply = post(runtime.app.test_client(), "/bind", {
        "PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}",
        "Node": node_name})
    assert status == 200
    result: dict[str, Any] = reply
    return result


@dataclass(frozen=True)
class Pki:
    """A CA; a serving certificate for 127.0.0.1 and a client certificate, both signed by it;
    and a client certificate signed by another CA (one the extender must not accept)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path
    rogue_key: Path


def _openssl(directory: Path, *args: str) -> None:
    result = subprocess.run(["openssl", *args], cwd=directory, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, f"openssl {' '.join(args)}: {result.stderr}"


def _ca(directory: Path, name: str) -> None:
    _openssl(directory, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
             f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")


def _signed(directory: Path, name: str, ca: str, extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(directory, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={name}")
    _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey",
             f"{ca}.key", "-CAcreateserial", "-days", "2", "-out", f"{name}.crt",
             "-extfile", f"{name}.ext")


def make_pki(directory: Path) -> Pki:
    """Certificates made with the openssl command line, as devkit/pki.py makes the control
    plane's (RSA 2048: well under a second each)."""
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "other-ca")
    _signed(directory, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                       "keyUsage=critical,digitalSignature,keyEncipherment\n"
                                       "extendedKeyUsage=serverAuth\n")
    client_ext = "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    _signed(directory, "kube-scheduler", "ca", client_ext)
    _signed(directory, "rogue", "other-ca", client_ext)
    return Pki(ca=directory / "ca.crt", server_cert=directory / "server.crt",
               server_key=directory / "server.key",
               client_cert=directory / "kube-scheduler.crt",
               client_key=directory / "kube-scheduler.key",
               rogue_cert=directory / "rogue.crt", rogue_key=directory / "rogue.key")


def json_paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and list indices) into a JSON-shaped value, the root ``()`` first:
    where a fuzz test may put an odd value."""
    found = [here]
    if isinstance(value, dict):
        for key, item in value.items():
            found += json_paths(item, (*here, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += json_paths(item, (*here, i))
    return found
