"""manifests/, rendered from charts/gpufrag by ``helm template``: the chart is the one source.

The kustomize base (``manifests/base``) and the resources of its optional components
(``manifests/components/<name>``) are what ``helm template`` gives for fixed values, split back
into the files the kustomizations name: each chart template is one manifest file, so
``templates/<file>`` renders ``manifests/base/<file>``, ``templates/<component>/<file>``
renders ``manifests/components/<component>/<file>`` and ``crds/<file>`` the base's CRD. The
kustomizations themselves, the overlays and the patch-only component (``mig-monitor``) stay
hand-written kustomize: they patch what is rendered here. The templates' YAML comments come
through, so the rendered files keep the reasons their objects say; what Helm alone adds (its
standard labels, the Namespace's keep policy) is taken off, since kubectl, not Helm, applies
them.

A component of :data:`OVERRIDE_PARTS` holds base files as the chart renders them under other
values, which its kustomization patches over the base's.

The values (:data:`BASE_LAYOUT`): the release named ``gpufrag``, the base's namespace (created)
and the example; the two images the kustomization's ``images:`` list retargets by their short
names (:data:`SHORT_IMAGES`), so ``kustomize edit set image gpufrag=...`` keeps working. The
components' files come from one more render with every optional part on.

    python -m devkit.manifests            # rewrite manifests/ from charts/gpufrag
    python -m devkit.manifests --check    # exit 1 naming each file that is out of date

``tests/e2e/test_helm.py`` checks that the committed files are a fresh render and that the base,
the production overlay and each component are what the chart gives with the matching values.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import yaml

from devkit.build import REPO_ROOT, BuildError
from devkit.toolbuild import build_tool

CHART_DIR: Final = REPO_ROOT / "charts" / "gpufrag"
MANIFESTS_DIR: Final = REPO_ROOT / "manifests"
BASE_DIR: Final = MANIFESTS_DIR / "base"
COMPONENTS_DIR: Final = MANIFESTS_DIR / "components"
RELEASE: Final = "gpufrag"
# The namespace the base installs into.
BASE_NAMESPACE: Final = "gpufrag-system"
# The values (as `helm --set` takes them) under which the chart renders the base's layout: its
# namespace, which the chart then creates, and the example model service. The chart's defaults
# differ (the release's namespace, no Namespace object, no example), for `helm install`.
BASE_LAYOUT: Final[tuple[tuple[str, str], ...]] = (
    ("namespace.name", BASE_NAMESPACE), ("namespace.create", "true"),
    ("servingExample.enabled", "true"))
# The images the base's kustomization maps by short name (its images: list).
SHORT_IMAGES: Final[tuple[tuple[str, str], ...]] = (
    ("images.gpufrag.repository", "gpufrag"), ("images.gpufrag.tag", ""),
    ("images.kubeScheduler.repository", "kube-scheduler"), ("images.kubeScheduler.tag", ""))
# Each optional part: the kustomize component its templates render, and the values that turn
# it on in the chart. The scheduler's PDB wants two leader-elected replicas (the schema).
PARTS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "prometheus-operator": (("monitoring.enabled", "true"),),
    "grafana-dashboards": (("dashboards.enabled", "true"),),
    "rightsizing": (("rightsizing.enabled", "true"),),
    "rightsizing-monitoring": (("monitoring.enabled", "true"), ("rightsizing.enabled", "true")),
    "scheduler-pdb": (("scheduler.disruptionBudget", "true"), ("scheduler.replicas", "2"),
                      ("scheduler.leaderElect", "true")),
    # Its kustomization also patches the base's device plugin (hand-written, as the chart's
    # affinity beside it): the device plugin leaves the nodes the DRA driver runs on.
    "dra": (("dra.enabled", "true"),),
    # The webhook's conversion of GPU asks into claims: the rightsizing part's webhook serves
    # it, so it renders only where both are on.
    "dra-claims": (("dra.enabled", "true"), ("rightsizing.enabled", "true")),
}
# A patch-only component: hand-written kustomize patches, the chart's value beside them.
PATCH_PARTS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "mig-monitor": (("agent.migMonitor", "true"),),
}
# Components that replace whole base files with what the chart renders for them under other
# values, for a value that changes text kustomize cannot reach into (a ConfigMap's embedded
# config file): the component's kustomization patches the base with these rendered objects.
# ``extender.dra`` leaves kube-scheduler's managedResources out and turns the extender's DRA
# reader on (docs/dra.md, "Scheduling DRA pods").
OVERRIDE_PARTS: Final[dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]]] = {
    "dra-scheduling": ((("extender.dra", "true"),),
                       ("scheduler-config.yaml", "extender-config.yaml")),
}
NAME_LABEL: Final = "app.kubernetes.io/name"
# The labels the chart puts on every object and the rendered manifests leave out.
STANDARD_LABELS: Final = ("helm.sh/chart", "app.kubernetes.io/instance",
                          "app.kubernetes.io/managed-by", "app.kubernetes.io/version")
# Helm leaves an object with this annotation in place on uninstall (the chart's Namespace).
KEEP_ANNOTATION: Final = "helm.sh/resource-policy"
HOOK_ANNOTATION: Final = "helm.sh/hook"
REGENERATE: Final = "python -m devkit.manifests"

_SOURCE_RE: Final = re.compile(r"^# Source: [^/]+/(\S+)$")
_STANDARD_RE: Final = re.compile(
    rf"^\s+(?:{'|'.join(re.escape(label) for label in STANDARD_LABELS)}): .*\n", re.M)
_KEEP_RE: Final = re.compile(
    rf"^(\s*)annotations:\n\1  {re.escape(KEEP_ANNOTATION)}: keep\n(?!\1  )", re.M)


class RenderError(Exception):
    """helm failed, or the chart holds a template this module cannot place in manifests/; the
    message says which."""


def set_flags(values: Sequence[tuple[str, str]]) -> list[str]:
    """``values`` as helm's ``--set`` flags."""
    return [arg for key, value in values for arg in ("--set", f"{key}={value}")]


def helm_template(helm: Path, values: Sequence[tuple[str, str]]) -> str:
    """``helm template gpufrag charts/gpufrag`` with the CRDs, without the test hooks."""
    result = subprocess.run(
        [str(helm), "template", RELEASE, str(CHART_DIR), "--include-crds", "--skip-tests",
         *set_flags(values)], capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise RenderError(f"helm template exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def manifest_path(source: str) -> Path | None:
    """The file under manifests/ that the chart file ``source`` (``templates/x.yaml``) renders;
    None for the chart's hooks (``templates/tests``, ``templates/crd-upgrade``)."""
    parts = Path(source).parts
    if parts[0] == "crds" and len(parts) == 2:
        return BASE_DIR / parts[1]
    if parts[0] == "templates" and len(parts) == 2:
        return BASE_DIR / parts[1]
    if parts[0] == "templates" and len(parts) == 3 and parts[1] in PARTS:
        return COMPONENTS_DIR / parts[1] / parts[2]
    if parts[0] == "templates" and parts[1] in ("tests", "crd-upgrade"):
        return None
    raise RenderError(f"chart file {source}: not under templates/, templates/<component>/ "
                      f"(one of {', '.join(PARTS)}) or crds/, so no manifest file renders it")


def without_helm_metadata(text: str) -> str:
    """A rendered object's text without Helm's standard labels and keep policy."""
    stripped = _KEEP_RE.sub("", _STANDARD_RE.sub("", text))
    doc = yaml.safe_load(stripped)
    meta = doc.get("metadata", {}) if isinstance(doc, dict) else {}
    left = set(meta.get("labels") or {}) & set(STANDARD_LABELS) | (
        set(meta.get("annotations") or {}) & {KEEP_ANNOTATION})
    if left:
        raise RenderError(f"{doc.get('kind')}/{meta.get('name')}: {', '.join(sorted(left))} "
                          f"not taken off (not one per line?)")
    return stripped


def split(rendered: str, keep: Path) -> dict[Path, list[str]]:
    """helm's output as each manifest file's objects (texts, in the chart's order), for the
    files under ``keep`` only."""
    files: dict[Path, list[str]] = {}
    for chunk in re.split(r"(?m)^---\n", rendered):
        lines = chunk.split("\n", 1)
        source = _SOURCE_RE.match(lines[0])
        if source is None or len(lines) < 2 or not yaml.safe_load(lines[1]):
            continue
        path = manifest_path(source.group(1))
        if path is not None and path.is_relative_to(keep):
            files.setdefault(path, []).append(without_helm_metadata(lines[1]))
    return files


def _header(path: Path) -> str:
    override = path.parent.name if path.parent.parent == COMPONENTS_DIR else ""
    if override in OVERRIDE_PARTS:
        values = ", ".join(f"{k}={v}" for k, v in OVERRIDE_PARTS[override][0])
        source = f"templates/{path.name} with {values}"
    elif path.is_relative_to(COMPONENTS_DIR):
        source = "templates/" + str(path.relative_to(COMPONENTS_DIR))
    else:
        source = f"{'crds' if path.name.startswith('crd-') else 'templates'}/{path.name}"
    return (f"# Rendered by `{REGENERATE}` from charts/gpufrag/{source};\n"
            f"# do not edit: change the chart, then run it.\n")


def render(helm: Path) -> dict[Path, str]:
    """Every rendered manifest file and its text."""
    base = split(helm_template(helm, [*BASE_LAYOUT, *SHORT_IMAGES]), BASE_DIR)
    every_part = [value for values in PARTS.values() for value in values]
    components = split(helm_template(helm, [*BASE_LAYOUT, *SHORT_IMAGES, *every_part]),
                       COMPONENTS_DIR)
    overrides: dict[Path, list[str]] = {}
    for name, (values, files) in OVERRIDE_PARTS.items():
        rendered = split(helm_template(helm, [*BASE_LAYOUT, *SHORT_IMAGES, *values]), BASE_DIR)
        overrides |= {COMPONENTS_DIR / name / file: rendered[BASE_DIR / file] for file in files}
    return {path: _header(path) + "---\n".join(docs)
            for path, docs in sorted((base | components | overrides).items())}


def rendered_paths() -> set[Path]:
    """The files under manifests/ a render writes: every YAML file of the base and of each
    part's component but their kustomizations."""
    folders = [BASE_DIR, *(COMPONENTS_DIR / name for name in (*PARTS, *OVERRIDE_PARTS))]
    return {p for folder in folders for p in folder.glob("*.yaml")
            if p.name != "kustomization.yaml"}


def stale_files(files: dict[Path, str]) -> list[Path]:
    """The manifest files that differ from ``files``, are missing, or should not be there."""
    differ = [p for p, text in files.items() if not p.is_file() or p.read_text() != text]
    return sorted(differ + sorted(rendered_paths() - set(files)))


def project_version() -> str:
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert isinstance(version, str)
    return version


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each out-of-date file")
    parser.add_argument("--helm", type=Path, default=None,
                        help="helm binary (default: the one devkit builds)")
    args = parser.parse_args(argv)
    try:
        files = render(args.helm or build_tool("helm"))
    except (RenderError, BuildError) as e:
        print(f"devkit.manifests: {e}", file=sys.stderr)
        return 2
    stale = stale_files(files)
    if args.check:
        for path in stale:
            print(f"devkit.manifests: {path.relative_to(REPO_ROOT)} is out of date; run "
                  f"`{REGENERATE}`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        if path in files:
            path.write_text(files[path])
        else:
            path.unlink()
    print(f"manifests: {len(stale)} file(s) written, {len(files)} rendered")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
