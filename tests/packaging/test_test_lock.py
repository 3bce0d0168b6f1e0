"""requirements/test.lock: the test environment, locked like the image.

``scripts/test`` installs ``requirements/test-tools.lock`` (pip, setuptools, wheel) and then
``requirements/test.lock`` with ``--require-hashes``, and gpufrag itself with ``--no-deps``: a
fresh machine gets exactly what the last green run got, never the newest release of an
unpinned test tool. Both locks come from ``scripts/lock``. Here: every runtime and ``dev``
dependency is pinned at a version pyproject.toml allows, the runtime pins are the image's, the
tools lock agrees with the test lock, and the test command installs them as described.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Final

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devkit.clientvenv import CLIENTS, INSTALLER, venv_key
from tests.packaging.test_lock import PINS as IMAGE_PINS
from tests.packaging.test_lock import read_lock, requirement_lines

REPO: Final = Path(__file__).resolve().parents[2]
REQUIREMENTS: Final = REPO / "requirements"
PYPROJECT: Final = tomllib.loads((REPO / "pyproject.toml").read_text())
TEST_PINS: Final = read_lock((REQUIREMENTS / "test.lock").read_text(), "test.lock")
TOOL_PINS: Final = read_lock((REQUIREMENTS / "test-tools.lock").read_text(), "test-tools.lock")
TOOLS: Final = ("pip", "setuptools", "wheel")


def test_every_pin_of_both_locks_is_exact_and_hashed() -> None:
    assert TEST_PINS and TOOL_PINS
    unhashed = [name for pins in (TEST_PINS, TOOL_PINS) for name, pin in pins.items()
                if not pin.hashes]
    assert unhashed == []


# A pip install's dependencies: the three files pyproject.toml reads (plot.in included).
@pytest.mark.parametrize("spec", [*(line for name in PYPROJECT["tool"]["setuptools"]["dynamic"]
                                    ["dependencies"]["file"]
                                    for line in requirement_lines(Path(name).name)),
                                  *PYPROJECT["project"]["optional-dependencies"]["dev"],
                                  *PYPROJECT["build-system"]["requires"]])
def test_every_runtime_and_dev_dependency_is_locked_at_a_version_it_allows(spec: str) -> None:
    req = Requirement(spec)
    if req.marker is not None and not req.marker.evaluate({"sys_platform": "linux"}):
        return
    name = canonicalize_name(req.name)
    assert name in TEST_PINS, f"{req.name} (pyproject.toml) is not in test.lock: run scripts/lock"
    assert req.specifier.contains(TEST_PINS[name].version, prereleases=True), (
        f"test.lock pins {req.name}=={TEST_PINS[name].version}, outside {req.specifier}")


def test_the_tests_run_on_the_image_s_versions() -> None:
    differ = {name: (pin.version, TEST_PINS[name].version) for name, pin in IMAGE_PINS.items()
              if name in TEST_PINS and TEST_PINS[name].version != pin.version}
    missing = sorted(set(IMAGE_PINS) - set(TEST_PINS))
    assert (differ, missing) == ({}, []), "image.lock vs test.lock: run scripts/lock"


def test_the_tools_lock_is_the_test_lock_s_tools() -> None:
    assert {name: pin.version for name, pin in TOOL_PINS.items() if name in TOOLS} == {
        name: TEST_PINS[name].version for name in TOOLS}
    for name, pin in TOOL_PINS.items():
        assert name in TEST_PINS and TEST_PINS[name].version == pin.version, name


def _pip_installs(script: str) -> list[list[str]]:
    joined = re.sub(r"\\\n\s*", " ", script)
    return [shlex.split(line)[3:] for line in joined.splitlines()
            if re.match(r"\s*\S+ -m pip install ", line)]


def test_the_test_command_installs_the_locks_with_hashes_then_gpufrag_without_deps() -> None:
    installs = _pip_installs((REPO / "scripts" / "test").read_text())
    assert len(installs) == 3, installs
    tools, locked, package = installs
    for args, lock in ((tools, "requirements/test-tools.lock"),
                       (locked, "requirements/test.lock")):
        assert "--require-hashes" in args and args[args.index("-r") + 1] == lock, args
    assert "--no-build-isolation" in locked
    assert {"--no-deps", "--no-build-isolation"} <= set(package) and package[-2:] == ["-e", "."]


def test_the_lock_script_regenerates_every_lock() -> None:
    script = (REPO / "scripts" / "lock").read_text()
    for lock in ("image.lock", "image-gpu.lock", "test.lock", "test-tools.lock",
                 "kserve-client.lock"):
        assert f"--output-file=requirements/{lock}" in script, lock


def test_the_kserve_client_venv_is_built_from_its_hashed_lock() -> None:
    pins = read_lock((REQUIREMENTS / "kserve-client.lock").read_text(), "kserve-client.lock")
    assert pins["kserve"].version == "0.21.0" and all(pin.hashes for pin in pins.values())
    args = CLIENTS["kserve"]
    assert "--require-hashes" in args
    assert Path(args[args.index("-r") + 1]) == REQUIREMENTS / "kserve-client.lock"
    # A changed lock is a new venv: the cache key covers the lock's content.
    assert venv_key("kserve", args) != venv_key("kserve", ("--require-hashes",
                                                            "-r", str(REQUIREMENTS / "test.lock")))


def test_client_venvs_replace_the_bundled_pip_with_the_locked_one_first() -> None:
    # The pip a new venv bundles (23.x with Python 3.11) refuses a hashed lock once a dependency
    # names an extra (kserve: uvicorn[standard]) and a newer release of it exists.
    assert INSTALLER[:2] == ("--require-hashes", "-r")
    tools = read_lock(Path(INSTALLER[2]).read_text(), "test-tools.lock")
    assert {"pip", "setuptools", "wheel"} <= set(tools)
    assert all(pin.hashes for pin in tools.values())
