"""KubeBinder's one write: a Binding that carries the GPU annotation and the UID precondition,
and the API server's refusals turned into messages that say what happened."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest

from gpufrag.conventions import KubeNames
from scheduler.kube.binder import BindError, KubeBinder


class _Response:
    data = b'{"kind":"Status","status":"Success"}'

    def release_conn(self) -> None:
        pass


class _Core:
    """Records ``create_namespaced_pod_binding`` calls; raises ``error`` when given."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.error = error

    def create_namespaced_pod_binding(self, name: str, namespace: str, body: dict[str, Any],
                                      **_: Any) -> _Response:
        self.calls.append((name, namespace, body))
        if self.error is not None:
            raise self.error
        return _Response()

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected API call {name}: a bind is one Binding, nothing else")


def _binder(core: _Core) -> KubeBinder:
    binder = KubeBinder(kubernetes.client.ApiClient(), KubeNames())
    binder.core = core
    return binder


def _conflict(message: str) -> kubernetes.client.ApiException:
    e = kubernetes.client.ApiException(status=409, reason="Conflict")
    e.body = ('{"kind":"Status","status":"Failure","reason":"Conflict","code":409,'
              f'"message":"{message}"}}')
    return e


def test_a_gpu_bind_is_one_binding_with_the_annotation_and_the_uid() -> None:
    core = _Core()
    _binder(core).bind("ns", "p", "uid-1", "n0", (0, 3))
    assert core.calls == [("p", "ns", {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1",
                     "annotations": {KubeNames().annotation_gpu_indices: "0,3"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n0"}})]


def test_a_cpu_pod_is_bound_without_an_annotation() -> None:
    core = _Core()
    _binder(core).bind("ns", "p", "", "n0", None)
    assert core.calls[0][2]["metadata"] == {"name": "p", "namespace": "ns"}


def test_a_failed_uid_precondition_says_the_pod_was_recreated() -> None:
    core = _Core(_conflict('Operation cannot be fulfilled on pods \\"p\\": Precondition failed: '
                           'UID in precondition: uid-1, UID in object meta: uid-2'))
    with pytest.raises(BindError) as caught:
        _binder(core).bind("ns", "p", "uid-1", "n0", (0,))
    assert str(caught.value) == ("pod ns/p is not the pod to bind: its UID is no longer uid-1 "
                                 "(re-created under the same name)")
    assert not caught.value.retryable


def test_other_refusals_keep_the_api_servers_message() -> None:
    core = _Core(_conflict('Operation cannot be fulfilled on pods/binding \\"p\\": pod p is '
                           'already assigned to node \\"n1\\"'))
    with pytest.raises(BindError) as caught:
        _binder(core).bind("ns", "p", "uid-1", "n0", (0,))
    assert "binding pod ns/p to n0: HTTP 409 Conflict" in str(caught.value)
    assert 'already assigned to node "n1"' in str(caught.value)
    assert not caught.value.retryable


def test_a_connection_error_is_retryable() -> None:
    core = _Core(ConnectionResetError("reset by peer"))
    with pytest.raises(BindError) as caught:
        _binder(core).bind("ns", "p", "uid-1", "n0", (0,))
    assert caught.value.retryable
