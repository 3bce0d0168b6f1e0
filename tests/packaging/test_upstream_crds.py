"""``devkit.toolbuild.fetch_crds``: the upstream CRDs the e2e tests install come from their pinned
Go modules, once, into the dev kit's cache; a machine that cannot download the module gets an
error that names it and says what to do, and a download whose hash is not the pinned one is
refused. Go's own module cache and proxy are pointed at this test's folders (``GOPROXY=off``: no
download can happen), so nothing here reaches a network.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from devkit.build import BuildError
from devkit.toolbuild import CERT_MANAGER_CRDS, PROMETHEUS_OPERATOR_CRDS, UpstreamCrds, fetch_crds
from tests import skips

pytestmark = skips.skip_if(shutil.which("go") is None, skips.NO_GO)


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty dev-kit cache and an empty Go module cache, with downloads off."""
    monkeypatch.setenv("GPUFRAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GOMODCACHE", str(tmp_path / "gomod"))
    monkeypatch.setenv("GOPROXY", "off")
    monkeypatch.setenv("GOFLAGS", "-modcacherw")
    return tmp_path


@pytest.mark.parametrize("crds", [PROMETHEUS_OPERATOR_CRDS, CERT_MANAGER_CRDS],
                         ids=lambda crds: crds.module.rsplit("/", 1)[-1])
def test_an_unreachable_module_fails_naming_it_and_the_fix(offline: Path,
                                                           crds: UpstreamCrds) -> None:
    with pytest.raises(BuildError) as failed:
        fetch_crds(crds)
    message = str(failed.value)
    assert f"{crds.module}@{crds.version}" in message
    assert "GOPROXY" in message and "reachable" in message


def test_a_warm_cache_serves_the_files_without_go(offline: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    crds = PROMETHEUS_OPERATOR_CRDS
    out_dir = offline / "cache" / "crds" / "prometheus-operator" / crds.cache_key
    out_dir.mkdir(parents=True)
    for name in crds.files:
        (out_dir / name).write_text(f"# {name}\n")
    (out_dir / ".complete").touch()
    monkeypatch.setenv("PATH", str(offline / "no-go-here"))
    assert fetch_crds(crds) == [out_dir / name for name in crds.files]


def test_a_new_version_is_a_new_cache_entry() -> None:
    newer = replace(PROMETHEUS_OPERATOR_CRDS, version="v9.9.9", zip_sum="h1:other=")
    assert newer.cache_key != PROMETHEUS_OPERATOR_CRDS.cache_key
