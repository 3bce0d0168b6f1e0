"""Go tools of the dev kit (promtool, helm, test harnesses), built from their modules on demand,
and the upstream CustomResourceDefinitions the end-to-end tests install, fetched from theirs.

Each tool lives in ``devkit/tools/<name>/`` (a ``go.mod`` pinning the upstream module and a main
package) and is built once into a cache outside the repository by ``devkit/tools/build``.
Tests ask for a tool through :func:`build_tool`; a failed build raises :class:`BuildError`
with the build's output, so a test that needs the tool fails rather than silently skipping.

The Prometheus Operator's and cert-manager's CRDs are plain YAML inside their Go modules'
zips: :func:`fetch_crds` downloads the pinned module version (``go mod download``, checked
against the pinned go.sum hash), copies the named files into the same cache, keyed by module,
version and hash, and serves them from there afterwards (no Go needed once warm). They are
never committed: the tests install exactly what upstream ships.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from devkit.build import BuildError
from devkit.cachelock import exclusive
from devkit.image import gpufrag_cache_dir

TOOLS_DIR: Final = Path(__file__).resolve().parent / "tools"
BUILD_TIMEOUT_S: Final = 3600.0


def build_tool(name: str) -> Path:
    """The path of the built tool ``name`` (cached after the first build)."""
    result = subprocess.run([str(TOOLS_DIR / "build"), name], capture_output=True, text=True,
                            timeout=BUILD_TIMEOUT_S, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise BuildError(f"building {name} failed (exit {result.returncode}):\n"
                         f"{result.stderr[-4000:]}")
    return Path(lines[-1])


FETCH_TIMEOUT_S: Final = 600.0


@dataclass(frozen=True)
class UpstreamCrds:
    """CRD files shipped as plain YAML in a Go module: the version and its go.sum hash pinned."""

    module: str
    version: str
    zip_sum: str  # go.sum's h1: hash of the module's zip; a different download is refused
    folder: str  # inside the module
    files: tuple[str, ...]  # the CRDs gpufrag's manifests use, in that folder

    @property
    def cache_key(self) -> str:
        text = "\n".join((self.module, self.version, self.zip_sum, self.folder, *self.files))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# The Prometheus Operator's monitors and rules (the folder its bundle is made from).
PROMETHEUS_OPERATOR_CRDS: Final = UpstreamCrds(
    module="github.com/prometheus-operator/prometheus-operator", version="v0.85.0",
    zip_sum="h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=",
    folder="example/prometheus-operator-crd",
    files=("monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_servicemonitors.yaml",
           "monitoring.coreos.com_prometheusrules.yaml"))
# cert-manager's Issuer and Certificate: deploy/crds is what its Helm chart's CRD templates are
# generated from (the same spec; the chart adds only labels and its keep policy).
CERT_MANAGER_CRDS: Final = UpstreamCrds(
    module="github.com/cert-manager/cert-manager", version="v1.21.2",
    zip_sum="h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=",
    folder="deploy/crds",
    files=("cert-manager.io_issuers.yaml", "cert-manager.io_certificates.yaml"))


def fetch_crds(crds: UpstreamCrds) -> list[Path]:
    """The paths of ``crds``' files, fetched from their Go module once and cached.

    Raises :class:`BuildError` naming the module and what to do where the download fails (no
    ``go``, the module proxy unreachable) or gives a module whose hash is not the pinned one.
    """
    out_dir = gpufrag_cache_dir() / "crds" / crds.module.rsplit("/", 1)[-1] / crds.cache_key
    paths = [out_dir / name for name in crds.files]
    done = out_dir / ".complete"
    if done.is_file():
        return paths
    with exclusive(out_dir / ".lock"):
        if not done.is_file():
            source = _download(crds, out_dir)
            for name, path in zip(crds.files, paths, strict=True):
                found = source / crds.folder / name
                if not found.is_file():
                    raise BuildError(f"{crds.module}@{crds.version} has no {crds.folder}/{name}; "
                                     f"fix UpstreamCrds.files for this version")
                shutil.copyfile(found, path)
            done.touch()
    return paths


def _download(crds: UpstreamCrds, workdir: Path) -> Path:
    """The module's extracted folder in Go's module cache, after ``go mod download``."""
    where = f"{crds.module}@{crds.version}"
    if shutil.which("go") is None:
        raise BuildError(f"fetching the upstream CRDs of {where} needs 'go' on PATH (the dev kit "
                         f"fetches them from their Go module)")
    # Run outside any module, so no go.mod of the checkout takes part.
    result = subprocess.run(["go", "mod", "download", "-json", where], capture_output=True,
                            text=True, timeout=FETCH_TIMEOUT_S, check=False, cwd=workdir)
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = {}
    if result.returncode != 0 or "Error" in info or "Dir" not in info:
        reason = info.get("Error") or result.stderr.strip()[-2000:] or f"exit {result.returncode}"
        raise BuildError(f"fetching the upstream CRDs of {where} failed: {reason}\n"
                         f"The e2e tests install the CRDs this Go module ships: make the Go "
                         f"module proxy (GOPROXY) reachable from this machine, or run once where "
                         f"it is and copy {gpufrag_cache_dir() / 'crds'} here.")
    if info.get("Sum") != crds.zip_sum:
        raise BuildError(f"{where} downloaded with hash {info.get('Sum')!r}, pinned "
                         f"{crds.zip_sum!r}: refusing it (a new version needs its go.sum hash "
                         f"pinned in devkit/toolbuild.py)")
    return Path(info["Dir"])
