"""Every image gpufrag ships or runs is fully qualified (registry host first).

Files only; the rendered manifests and chart are checked in tests/e2e/test_helm.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest
import yaml

from devkit.imageref import has_registry_host, split_image

REPO: Final = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("ref", "expected"), [
    ("registry.k8s.io/kube-scheduler:v1.36.3", True),
    ("ghcr.io/gpufrag/gpufrag:0.1.0", True),
    ("localhost:5000/gpufrag", True),
    ("localhost/gpufrag:1", True),
    ("kube-scheduler:v1.36.3", False),
    ("library/python:3.11", False),
    ("gpufrag", False),
])
def test_registry_host_rule(ref: str, expected: bool) -> None:
    assert has_registry_host(ref) is expected


@pytest.mark.parametrize(("ref", "parts"), [
    ("registry.k8s.io/kube-scheduler:v1.36.3", ("registry.k8s.io/kube-scheduler", "v1.36.3", "")),
    ("localhost:5000/gpufrag", ("localhost:5000/gpufrag", "", "")),
    ("ghcr.io/g/g:1@sha256:" + "0" * 64, ("ghcr.io/g/g", "1", "sha256:" + "0" * 64)),
])
def test_split_image(ref: str, parts: tuple[str, str, str]) -> None:
    assert split_image(ref) == parts


def test_kustomize_base_names_every_image_with_its_registry() -> None:
    kustomization = yaml.safe_load((REPO / "manifests/base/kustomization.yaml").read_text())
    entries = kustomization["images"]
    assert {e["name"] for e in entries} >= {"gpufrag", "kube-scheduler"}
    assert [e["name"] for e in entries if not has_registry_host(e.get("newName", ""))] == []
    scheduler = next(e for e in entries if e["name"] == "kube-scheduler")
    assert (scheduler["newName"], scheduler["newTag"]) == ("registry.k8s.io/kube-scheduler",
                                                           "v1.36.3")


def test_chart_defaults_are_fully_qualified() -> None:
    values = yaml.safe_load((REPO / "charts/gpufrag/values.yaml").read_text())
    repositories = {key: image["repository"] for key, image in values["images"].items()}
    assert {k: r for k, r in repositories.items() if not has_registry_host(r)} == {}


def test_dockerfile_base_images_are_fully_qualified() -> None:
    stages: set[str] = set()
    args: dict[str, str] = {}
    for line in (REPO / "Dockerfile").read_text().splitlines():
        arg = re.match(r"ARG\s+(\w+)=(\S+)", line)
        if arg is not None:  # a build argument's default, as FROM ${NAME} reads it
            args[arg.group(1)] = arg.group(2)
        m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
        if m is None:
            continue
        base = re.sub(r"\$\{(\w+)\}", lambda v: args.get(v.group(1), v.group(0)), m.group(1))
        if base not in stages:
            assert has_registry_host(base), line
        if m.group(2):
            stages.add(m.group(2))
