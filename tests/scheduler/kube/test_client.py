"""Every API request has a deadline: an API server that accepts and never answers cannot hold
a caller for good."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import kubernetes
import pytest
import yaml

from gpufrag.errors import BadInput
from scheduler.kube.client import REQUEST_TIMEOUT_S, DeadlineApiClient, api_client


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return path


def test_a_server_that_never_answers_fails_the_call_at_its_deadline(tmp_path: Path) -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    try:
        port = silent.getsockname()[1]
        client = api_client(str(_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")),
                            request_timeout_s=(0.5, 0.2))
        assert isinstance(client, DeadlineApiClient)
        outcome: list[BaseException] = []

        def call() -> None:
            try:
                kubernetes.client.CoreV1Api(client).read_namespace("x")
            except Exception as e:  # urllib3's timeout, after its retries
                outcome.append(e)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(20)
        assert not thread.is_alive(), "the call is still waiting: it has no deadline"
        assert outcome and "timed out" in str(outcome[0]).lower(), outcome
    finally:
        silent.close()


def test_the_default_deadline_and_an_explicit_one() -> None:
    client = DeadlineApiClient(kubernetes.client.Configuration())
    assert client.request_timeout_s == REQUEST_TIMEOUT_S
    seen: list[object] = []
    # What the library's RESTClientObject receives: the default, or the caller's own.
    client.rest_client.request = lambda *a, **kw: seen.append(kw["_request_timeout"])
    client.call_api("GET", "http://127.0.0.1:1/api")
    client.call_api("GET", "http://127.0.0.1:1/api", _request_timeout=(1.0, 300.0))
    assert seen == [REQUEST_TIMEOUT_S, (1.0, 300.0)]


def test_no_configuration_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no usable Kubernetes configuration"):
        api_client(str(tmp_path / "missing"))
