"""Fixtures for the device-plugin tests that run real components.

- ``dpharness`` (session): the Go harness running kubelet's device manager, built by the dev
  kit (``devkit/tools/dpharness``, cached). A failed build fails the test, never skips it.
- ``plane`` (module): a real control plane without the pod completer (the dev kit's kubelet
  stand-in would run the test's pods to completion; here they must stay Pending, as they do on
  a node whose kubelet has not admitted them yet).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.build import BuildError, build_control_plane
from devkit.controlplane import ControlPlane
from devkit.toolbuild import build_tool
from tests.built import built_or_fail


@pytest.fixture(scope="session")
def dpharness() -> Path:
    return built_or_fail("building devkit/tools/dpharness", lambda: build_tool("dpharness"))


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    try:
        binary = build_control_plane()
    except BuildError as e:
        pytest.fail(f"control-plane build failed:\n{e}", pytrace=False)
    with ControlPlane(binary, complete_pods=False) as control_plane:
        yield control_plane
