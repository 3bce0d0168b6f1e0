"""Fixtures for the end-to-end tests: one real control plane per test session.

Every test under tests/e2e is marked ``e2e``. The control plane is built from the upstream Go
modules by ``devkit/cluster/build`` (cached outside the repository; the first build takes tens
of minutes) and started once per session, because starting it costs seconds and the tests
clean up what they create. A failed build FAILS the tests with the build's output: an e2e suite
that skips when its cluster cannot be built would pass while testing nothing.

Fixtures:
- ``control_plane_binary`` (session): path of the multi-call binary.
- ``control_plane`` (session): a started :class:`devkit.controlplane.ControlPlane`.
- ``api_client`` (session): its shared ``kubernetes.client.ApiClient``.
- ``namespace`` (function): a fresh namespace (with its default service account), deleted after.
- ``helm`` (session): the helm binary built from its Go module (``devkit/tools/helm``).
- ``prometheus_operator_crds``, ``cert_manager_crds`` (session): the upstream CRD files of the
  kinds gpufrag's manifests use, fetched from the pinned Go modules
  (:func:`devkit.toolbuild.fetch_crds`; cached outside the repository). A failed fetch FAILS
  the tests that need them, saying why.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import kubernetes
import pytest

from devkit.build import BuildError, build_control_plane
from devkit.controlplane import ControlPlane
from devkit.procs import ControlPlaneError
from devkit.toolbuild import CERT_MANAGER_CRDS, PROMETHEUS_OPERATOR_CRDS, build_tool, fetch_crds
from tests.built import built_or_fail

E2E_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test in this folder ``e2e``, so ``-m e2e`` / ``-m 'not e2e'`` select them."""
    for item in items:
        if E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


def _say(config: pytest.Config, message: str) -> None:
    """Write past pytest's output capture: a cold build is silent for a long time otherwise."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    suspended = capture.global_and_fixture_disabled() if capture is not None else nullcontext()
    with suspended:
        print(message, file=sys.stderr, flush=True)


class _ReporterStream:
    """A text stream that forwards the build's progress lines to the terminal reporter."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    def write(self, text: str) -> int:
        for line in text.splitlines():
            _say(self._config, line)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.fixture(scope="session")
def helm() -> Path:
    return built_or_fail("helm build", lambda: build_tool("helm"))


@pytest.fixture(scope="session")
def prometheus_operator_crds() -> list[Path]:
    return built_or_fail("fetching the upstream CRDs",
                         lambda: fetch_crds(PROMETHEUS_OPERATOR_CRDS))


@pytest.fixture(scope="session")
def cert_manager_crds() -> list[Path]:
    return built_or_fail("fetching the upstream CRDs", lambda: fetch_crds(CERT_MANAGER_CRDS))


@pytest.fixture(scope="session")
def control_plane_binary(pytestconfig: pytest.Config) -> Path:
    _say(pytestconfig, "e2e: building the control plane (cached; a cold build takes ~30 min)")
    try:
        return build_control_plane(progress=_ReporterStream(pytestconfig))
    except BuildError as e:
        failure = str(e)
    pytest.fail(f"control-plane build failed:\n{failure}", pytrace=False)


@pytest.fixture(scope="session")
def control_plane(control_plane_binary: Path, pytestconfig: pytest.Config
                  ) -> Iterator[ControlPlane]:
    plane = ControlPlane(control_plane_binary)
    try:
        plane.start()
    except ControlPlaneError as e:
        failure = str(e)
    else:
        failure = ""
    if failure:
        pytest.fail(f"control plane did not start:\n{failure}", pytrace=False)
    _say(pytestconfig, f"e2e: control plane up at {plane.server} in {plane.startup_s:.1f}s "
                       f"(kubeconfig {plane.kubeconfig_path})")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> kubernetes.client.ApiClient:
    return control_plane.api_client()


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = control_plane.create_namespace(f"e2e-{uuid.uuid4().hex[:8]}")
    yield name
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    core.delete_namespace(name)
