"""charts/gpufrag, generated from the kustomize base: one template per object, the knobs as values.

The base (``manifests/base``) stays the one source of truth. This module renders it with
kubectl's kustomize and writes each object as a Helm template in which a fixed list of fields
(:data:`KNOBS`, each component's pod scheduling fields (:data:`COMPONENTS`), the namespace, every
container image and its pull settings) reads ``.Values``; the defaults in ``values.yaml`` are the
values the base has, and a field the base leaves out is written only when its value is set. Two
defaults depart from the base, for what a Helm user does first (``helm install R charts/gpufrag
-n NS --create-namespace``): the objects go to the release's namespace and the chart creates no
Namespace (helm has made it: a second one fails the install), and the example model service is
off. With :data:`BASE_LAYOUT` (the base's namespace, created, and the example) and the release
named ``gpufrag``, ``helm template`` gives back exactly the objects ``kubectl kustomize
manifests/base`` gives, plus the chart's standard labels (:data:`STANDARD_LABELS`) and the
Namespace's keep policy (``tests/e2e/test_helm.py`` checks both that and that the committed chart
is what this module writes today). Names that are one per
cluster (ClusterRoles, admission policies, their bindings, the RoleBinding in kube-system) start
with the release's full name, which is ``gpufrag`` for that release, so another release
installs beside it. The ``helm test`` hooks (:func:`test_hooks`) are built here too, from what
the base says about the extender. The optional pieces of the layout (:data:`PARTS`: kustomize
Components under ``manifests/components``) are rendered by kustomize too and written behind a
value that is false by default; so is what a Component that adds fields to base objects adds
(:data:`PATCH_PARTS`: the agent's MIG monitor); and :data:`LINES` adds the lines an overlay's
embedded file has beyond the base's (``bindVerb``), so the production overlay is a set of
values.

    python -m devkit.chart            # rewrite charts/gpufrag from manifests/base
    python -m devkit.chart --check    # exit 1 naming each file that is out of date

How a field becomes a template: the object tree is dumped with a placeholder token where a knob
sits, then each token is replaced by its template action -- ``{{ .Values.x | quote }}`` for a
whole string, ``{{ .Values.x }}`` for a number or a boolean, ``{{- toYaml .Values.x | nindent N }}``
for a map or a list, and for a knob inside a longer string (``--threshold=0.25``, a line of an
embedded config file) the whole string is rebuilt from its literal parts and the values, with
``print`` on one line or as a literal block over several. A literal ``{{`` in the base (a
Prometheus template, a Grafana legend) is emitted so that Helm prints it unchanged.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeAlias

import yaml

from devkit.build import REPO_ROOT, BuildError, build_control_plane
from devkit.imageref import split_image
from scheduler.policies import POLICY_NAMES

BASE_DIR: Final = REPO_ROOT / "manifests" / "base"
CHART_DIR: Final = REPO_ROOT / "charts" / "gpufrag"
# The namespace the base installs into; every occurrence becomes the chart's namespace
# (`namespace.name`, else the release's).
BASE_NAMESPACE: Final = "gpufrag-system"
# The values (as `helm --set` takes them) under which the chart renders the base's layout: its
# namespace, which the chart then creates, and the example model service. The defaults differ
# (the release's namespace, no Namespace object, no example): see the module's docstring.
BASE_LAYOUT: Final[tuple[tuple[str, str], ...]] = (
    ("namespace.name", BASE_NAMESPACE), ("namespace.create", "true"),
    ("servingExample.enabled", "true"))
# What every base name starts with; in a release-scoped name it stands for the release's full
# name (`gpufrag.fullname`), which is "gpufrag" for the release named gpufrag.
NAME_PREFIX: Final = "gpufrag"
NAME_LABEL: Final = "app.kubernetes.io/name"
# The labels the chart puts on every object beside the base's (and NAME_LABEL where the base
# has none); tests/e2e/test_helm.py takes exactly these off to compare with the base.
STANDARD_LABELS: Final = ("helm.sh/chart", "app.kubernetes.io/instance",
                          "app.kubernetes.io/managed-by", "app.kubernetes.io/version")
REGENERATE: Final = "python -m devkit.chart"

Doc: TypeAlias = dict[str, object]


class ChartError(Exception):
    """The base no longer has what a knob points at, or holds what a template cannot carry;
    the message names the knob or the object and the field."""


# --------------------------------------------------------------------------------------------
# What is configurable


@dataclass(frozen=True)
class Knob:
    """One field of one base object that the chart reads from ``.Values.<value>``.

    ``path`` walks the object: keys separated by ``/`` (a key may hold dots:
    ``data/config.yaml``), ``key[name=x]`` picks the list item whose ``name`` is ``x``, and
    ``key[0]`` the item at that index (where items have no name: a NetworkPolicy's rules).
    With ``pattern`` (a regex with one group), only the group's text inside the string at
    ``path`` -- or inside the one item of a list of strings that matches -- is the knob; the
    default is that text, as a YAML scalar (``15`` an integer, ``true`` a boolean). A map
    knob merges with its default the way Helm merges values: a key set to null removes it.
    """

    value: str
    kind: str
    name: str
    path: str
    help: str
    pattern: str | None = None
    enum: tuple[str, ...] = ()
    # Another field that reads a value an earlier knob declared (one name in several places);
    # the base must have the same default there.
    again: bool = False


@dataclass(frozen=True)
class Toggle:
    """``.Values.<value>`` renders the objects whose name starts with ``name_prefix``; false
    leaves them out. ``default``: true for a part of gpufrag, false for what a user asks for
    (the example)."""

    value: str
    name_prefix: str
    help: str
    default: bool = True


_SCHED = ("Deployment", "gpufrag-scheduler")
_SCHED_CFG = ("ConfigMap", "gpufrag-scheduler-config")
_EXT_CFG = ("ConfigMap", "gpufrag-extender-config")
_DEFRAG = ("CronJob", "gpufrag-defrag")
_DEFRAG_C = "spec/jobTemplate/spec/template/spec/containers[name=defrag]"
_AGENT = ("DaemonSet", "gpufrag-agent")
_AGENT_C = "spec/template/spec/containers[name=agent]"
_PLUGIN = ("DaemonSet", "gpufrag-device-plugin")

KNOBS: Final[tuple[Knob, ...]] = (
    Knob("scheduler.name", *_SCHED_CFG, "data/config.yaml",
         "The scheduler's name (its profile's schedulerName), which pods name in "
         "spec.schedulerName; give a second release a name of its own.",
         pattern=r"schedulerName: (\S+)"),
    Knob("scheduler.name", "ConfigMap", "gpufrag-names", "data/GPUFRAG_NAMES__SCHEDULER_NAME",
         "", again=True),
    Knob("scheduler.name", "Deployment", "resnet-serving", "spec/template/spec/schedulerName",
         "", again=True),
    Knob("scheduler.replicas", *_SCHED, "spec/replicas",
         "gpufrag-scheduler replicas; more than one needs scheduler.leaderElect: true."),
    Knob("scheduler.leaderElect", *_SCHED_CFG, "data/config.yaml",
         "Leader election among the scheduler's replicas (leaderElection.leaderElect of the "
         "KubeSchedulerConfiguration).", pattern=r"leaderElect: (true|false)"),
    Knob("scheduler.resources", *_SCHED, "spec/template/spec/containers[name=kube-scheduler]"
         "/resources", "Resources of the kube-scheduler container."),
    Knob("extender.policy", *_EXT_CFG, "data/config.yaml",
         "Placement policy of the extender (docs/extender.md).", pattern=r"(?m)^policy: (\S+)$",
         enum=POLICY_NAMES),
    Knob("extender.weight", *_SCHED_CFG, "data/config.yaml",
         "kube-scheduler's weight for the extender's scores (why 200: "
         "manifests/base/scheduler-config.yaml).", pattern=r"weight: (\d+)"),
    Knob("extender.ignorable", *_SCHED_CFG, "data/config.yaml",
         "true: schedule with the default plugins while the extender is unreachable; false: "
         "pods wait for it.", pattern=r"ignorable: (true|false)"),
    Knob("extender.resources", *_SCHED, "spec/template/spec/containers[name=extender]/resources",
         "Resources of the extender container."),
    Knob("defrag.schedule", *_DEFRAG, "spec/schedule", "When a defrag cycle runs (cron)."),
    Knob("defrag.dryRun", *_DEFRAG, f"{_DEFRAG_C}/env[name=GPUFRAG_DEFRAG_DRY_RUN]/value",
         "Print the plan and evict nothing; set false once the plans look right."),
    Knob("defrag.threshold", *_DEFRAG, f"{_DEFRAG_C}/args",
         "Fragmentation ratio above which a cycle plans moves.", pattern=r"--threshold=(\S+)"),
    Knob("defrag.maxEvictionsPerNode", *_DEFRAG, f"{_DEFRAG_C}/args",
         "Eviction budget per node and cycle.", pattern=r"--max-evictions-per-node=(\d+)"),
    Knob("defrag.maxEvictionsPerNamespace", *_DEFRAG, f"{_DEFRAG_C}/args",
         "Eviction budget per namespace and cycle.",
         pattern=r"--max-evictions-per-namespace=(\d+)"),
    Knob("defrag.maxEvictionsTotal", *_DEFRAG, f"{_DEFRAG_C}/args",
         "Eviction budget per cycle.", pattern=r"--max-evictions-total=(\d+)"),
    Knob("defrag.resources", *_DEFRAG, f"{_DEFRAG_C}/resources",
         "Resources of the defrag container."),
    Knob("agent.intervalS", *_AGENT, f"{_AGENT_C}/args",
         "Seconds between two NVML readings published on the Node.",
         pattern=r"^--interval-s=(\d+)$"),
    Knob("agent.runtimeClassName", *_AGENT, "spec/template/spec/runtimeClassName",
         "RuntimeClass that exposes the GPUs to the agent (the NVIDIA container runtime)."),
    Knob("agent.resources", *_AGENT, f"{_AGENT_C}/resources", "Resources of the agent container."),
    Knob("devicePlugin.runtimeClassName", *_PLUGIN, "spec/template/spec/runtimeClassName",
         "RuntimeClass that exposes the GPUs to the device plugin (the NVIDIA container "
         "runtime)."),
    Knob("devicePlugin.resources", *_PLUGIN,
         "spec/template/spec/containers[name=device-plugin]/resources",
         "Resources of the device plugin container."),
    Knob("rightsizing.resources", "Deployment", "gpufrag-admission",
         "spec/template/spec/containers[name=admission]/resources",
         "Resources of the webhook container."),
    # Rule 0 of each NetworkPolicy admits Prometheus (manifests/base/network-policies.yaml).
    Knob("networkPolicy.prometheus", "NetworkPolicy", "gpufrag-scheduler", "spec/ingress[0]/from",
         "Who may scrape gpufrag's metrics ports (NetworkPolicy peers, for the extender's, the "
         "agent's, the device plugin's and the webhook's policy): your Prometheus's pods; [] "
         "admits any source."),
    Knob("networkPolicy.prometheus", "NetworkPolicy", "gpufrag-agent", "spec/ingress[0]/from",
         "", again=True),
    Knob("networkPolicy.prometheus", "NetworkPolicy", "gpufrag-device-plugin",
         "spec/ingress[0]/from", "", again=True),
    Knob("networkPolicy.prometheus", "NetworkPolicy", "gpufrag-admission",
         "spec/ingress[0]/from", "", again=True),
    Knob("networkPolicy.apiServer", "NetworkPolicy", "gpufrag-admission", "spec/ingress[1]/from",
         "Who may call the right-sizing webhook (NetworkPolicy peers): the API server, which a "
         "policy can name only by address (ipBlock peers of your control plane); [], the "
         "default, admits any source (manifests/components/rightsizing/network-policy.yaml)."),
)


@dataclass(frozen=True)
class Component:
    """A workload whose pods take the scheduling fields of :data:`POD_FIELDS` from
    ``.Values.<value>.<field>``: a field the base sets is a knob with the base's value as its
    default; one it leaves out is written only when the value is set."""

    value: str
    kind: str
    name: str
    pod_path: str


COMPONENTS: Final[tuple[Component, ...]] = (
    Component("scheduler", *_SCHED, "spec/template/spec"),
    Component("defrag", *_DEFRAG, "spec/jobTemplate/spec/template/spec"),
    Component("agent", *_AGENT, "spec/template/spec"),
    Component("devicePlugin", *_PLUGIN, "spec/template/spec"),
    Component("servingExample", "Deployment", "resnet-serving", "spec/template/spec"),
    Component("rightsizing", "Deployment", "gpufrag-admission", "spec/template/spec"),
)

# Pod fields every component takes, with the empty value that stands for "not set" and what
# the help says.
POD_FIELDS: Final[dict[str, tuple[object, str]]] = {
    "nodeSelector": ({}, "nodeSelector of the {c} pods; a map merges with its default, a key "
                         "set to null removes it."),
    "tolerations": ([], "Tolerations of the {c} pods."),
    "affinity": ({}, "Affinity of the {c} pods (node, pod and anti-affinity)."),
    "priorityClassName": ("", "PriorityClass of the {c} pods."),
}

TOGGLES: Final[tuple[Toggle, ...]] = (
    Toggle("defrag.enabled", "gpufrag-defrag", "The defrag CronJob and its RBAC."),
    Toggle("agent.enabled", "gpufrag-agent", "The node agent DaemonSet and its RBAC."),
    Toggle("devicePlugin.enabled", "gpufrag-device-plugin",
           "The gpufrag device plugin DaemonSet and its RBAC."),
    # A demo, not part of gpufrag: nobody wants a ResNet service from `helm install` unasked.
    Toggle("servingExample.enabled", "resnet-serving",
           "The example model service: a ResNet serving Deployment on gpufrag with its Service, "
           "PodDisruptionBudget and HorizontalPodAutoscaler, and the pre-warm CronJobs with "
           "their RBAC (docs/operations.md, \"Pre-warming\"). Off by default: a demo, not part "
           "of gpufrag.", default=False),
)

@dataclass(frozen=True)
class Part:
    """An optional piece of the kustomize layout: a kustomize Component under ``manifests/``
    (``path``), rendered by kustomize as the base is and installed only where
    ``.Values.<value>`` is true (default false). ``labels``: a map value whose labels join those
    of each of its objects (what a Prometheus selects monitors by). ``also``: further values
    that must be true as well, for a piece that joins two parts (the webhook's monitor needs
    the monitoring and the right-sizing parts); such a part declares no value of its own:
    ``value``, ``also`` and ``labels`` are each declared by another part."""

    value: str
    path: str
    help: str
    labels: str = ""
    also: tuple[str, ...] = ()


PARTS: Final[tuple[Part, ...]] = (
    Part("monitoring.enabled", "components/prometheus-operator",
         "The Prometheus Operator's PodMonitors and ServiceMonitor and the PrometheusRule: "
         "gpufrag's alerts and the recording rules the example HPA reads through "
         "prometheus-adapter; with rightsizing.enabled, the webhook's PodMonitor too. Needs "
         "the Prometheus Operator's CRDs.",
         labels="monitoring.labels"),
    Part("dashboards.enabled", "components/grafana-dashboards",
         "Grafana dashboards as a ConfigMap labelled grafana_dashboard=1, for the Grafana "
         "sidecar's discovery."),
    Part("rightsizing.enabled", "components/rightsizing",
         "The GPU right-sizing admission webhook (docs/rightsizing.md): its Deployment, Service, "
         "RBAC and MutatingWebhookConfiguration."),
    # The webhook's PodMonitor: it needs the PodMonitor kind and the webhook both.
    Part("monitoring.enabled", "components/rightsizing-monitoring",
         "The right-sizing webhook's PodMonitor (HTTPS, verified with the webhook's CA).",
         labels="monitoring.labels", also=("rightsizing.enabled",)),
    Part("scheduler.disruptionBudget", "components/scheduler-pdb",
         "A PodDisruptionBudget (minAvailable 1) for gpufrag-scheduler; with "
         "scheduler.replicas >= 2, so a drain never takes the last replica."),
)


@dataclass(frozen=True)
class PatchPart:
    """An optional kustomize Component that changes objects of the base rather than adding
    objects of its own (``path`` under ``manifests/``): kustomize renders the base with it, and
    what it adds to each object -- a map key the object lacks, a list item after the object's
    own -- is written only where ``.Values.<value>`` is true (default false). A component that
    changes or removes anything is refused (:func:`_apply_additions`)."""

    value: str
    path: str
    help: str


PATCH_PARTS: Final[tuple[PatchPart, ...]] = (
    PatchPart("agent.migMonitor", "components/mig-monitor",
              "On MIG nodes, let the agent read every MIG instance's placement, so it publishes "
              "each GPU's mig list: NVIDIA's container toolkit mounts the MIG monitor "
              "capability (NVIDIA_MIG_MONITOR_DEVICES=all), which it grants only to a container "
              "with SYS_ADMIN in its capabilities (docs/security.md, \"The MIG monitor\")."),
)


@dataclass(frozen=True)
class Line:
    """A line of an embedded file that is there only where ``.Values.<value>`` is true
    (default false): written after the line that ``after`` matches, indented as that line is
    (the production overlay's ``bindVerb: bind``)."""

    value: str
    kind: str
    name: str
    path: str
    after: str
    line: str
    help: str


LINES: Final[tuple[Line, ...]] = (
    Line("extender.bind", *_SCHED_CFG, "data/config.yaml", r"(?m)^( *)preemptVerb: \S+$",
         "bindVerb: bind",
         "The extender binds pods (bindVerb), recording the GPUs it chose on the pod: needed "
         "for GPU shares and exact GPUs (stage 3 of the roll-out, docs/operations.md)."),
)

# Objects of this API group are installed only where the value is true (default true).
GROUP_TOGGLES: Final[dict[str, tuple[str, str]]] = {
    "cert-manager.io": ("rightsizing.certManager",
                        "cert-manager makes the webhook's serving certificate (Issuer, "
                        "Certificate) and fills the webhook's caBundle. false: make the Secret "
                        "gpufrag-admission-tls yourself (docs/rightsizing.md) and set "
                        "rightsizing.caBundle."),
}
# The caBundle of every webhook configuration, where set (no cert-manager).
CA_BUNDLE: Final = ("rightsizing.caBundle",
                    "Base64 PEM CA of the webhook's serving certificate, where cert-manager does "
                    "not inject it (rightsizing.certManager: false).")
SELF_SIGNED: Final = ("rightsizing.selfSigned",
                      "With rightsizing.certManager: false, the chart makes the webhook's CA and "
                      "serving certificate itself (Sprig's genCA and genSignedCert, 10 years), "
                      "writes the Secret cert-manager would and puts the CA in the caBundle; an "
                      "upgrade keeps the Secret's (lookup) so the webhook is never left with a "
                      "CA it does not serve.")
# In the webhook configuration's template: the CA its caBundle carries.
CA_BUNDLE_VAR: Final = "$caBundle"


GROUP_HELP: Final = {
    "global": "Pull settings for every image.",
    "namespace": "Where the namespaced objects go: by default the release's namespace "
                 "(helm install -n NS --create-namespace), which the chart does not create.",
    "images": "Container images, fully qualified (registry host first). digest, when set, "
              "pins the image (repository:tag@digest).",
    "scheduler": "gpufrag-scheduler: the upstream kube-scheduler with the extender as a sidecar.",
    "extender": "The extender (docs/extender.md).",
    "defrag": "The defrag controller, one cycle per CronJob run (docs/defrag.md).",
    "agent": "The GPU node agent (docs/agent.md).",
    "devicePlugin": "The kubelet device plugin: whole GPUs and GPU shares on GPU nodes "
                    "(docs/deviceplugin.md).",
    "servingExample": "An example model service on gpufrag "
                      "(manifests/base/serving-example.yaml), off by default.",
    "monitoring": "Scraping, alerts and recording rules for the Prometheus Operator "
                  "(manifests/components/prometheus-operator).",
    "dashboards": "Grafana dashboards (manifests/components/grafana-dashboards).",
    "rightsizing": "The GPU right-sizing webhook (manifests/components/rightsizing).",
    "crds": "The CustomResourceDefinitions in crds/ (GPUReservation).",
    "networkPolicy": "Who may reach gpufrag's listeners: the peers of its NetworkPolicies "
                     "(docs/security.md, \"Who may reach what\"; the kubelet's probes need "
                     "none).",
}


# --------------------------------------------------------------------------------------------
# Template pieces standing in the object tree until it is dumped


@dataclass(frozen=True)
class Expr:
    """A template pipeline that yields a scalar (``.Values.agent.intervalS``)."""

    text: str

    def arg(self) -> str:
        """The pipeline as an operand of another call."""
        return f"({self.text})" if " " in self.text else self.text


NAMESPACE_EXPR: Final = Expr('include "gpufrag.namespace" .')
FULLNAME_EXPR: Final = Expr('include "gpufrag.fullname" .')


@dataclass
class Whole:
    """A whole field read from the values; ``value`` is the base's (the default)."""

    expr: Expr
    value: object


@dataclass
class Spliced:
    """A string built from literal parts and template expressions."""

    parts: list[str | Expr]


@dataclass(frozen=True)
class IfSet:
    """A field the base leaves out, written as ``key: <value>`` only where ``expr`` is set
    (not empty): it stands as a key of its map, so the base's own fields stay as they are.
    ``block``: a map or a list (``toYaml``), else a string."""

    key: str
    expr: Expr
    block: bool


@dataclass(frozen=True, eq=False)
class IfOn:
    """What a :class:`PatchPart` adds, written only where ``.Values.<value>`` is true: the key
    ``key`` with ``content`` (standing as a key of its map), or, where ``key`` is None, the list
    item ``content`` (standing as an item of its list). Hashed by identity: it is a map key."""

    value: str
    key: str | None
    content: object


@dataclass
class Labels:
    """An object's ``metadata.labels``: the chart's standard labels (``gpufrag.labels``), the
    base's own, which are written as they are, and those of the map value ``extra`` if any."""

    own: dict[str, str]
    extra: str = ""


@dataclass
class Template:
    """One generated file's content plus the values it reads (for values.yaml and the schema)."""

    text: str
    defaults: dict[str, object] = field(default_factory=dict)


def _go_literal(text: str) -> str:
    """``text`` as a Go interpreted string literal (what a template action accepts)."""
    return json.dumps(text, ensure_ascii=False)


def _typed(text: str) -> object:
    """A knob's text from the base as the default it stands for: the YAML scalar, where Go's
    template printing gives the same text back (``15``, ``0.25``, ``true``), else the string."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, bool):
        return value if text in ("true", "false") else text
    if isinstance(value, int):
        return value if str(value) == text else text
    if isinstance(value, float):
        return value if repr(value) == text and not value.is_integer() else text
    return text


def _resolve(doc: Doc, path: str, where: str) -> tuple[object, str | int]:
    """The container (dict or list) holding the field at ``path`` and its key there."""
    node: object = doc
    segments = path.split("/")
    for i, segment in enumerate(segments):
        m = re.fullmatch(r"([\w.-]+)(?:\[(\w+)=([^\]]+)\]|\[(\d+)\])?", segment)
        if m is None:
            raise ChartError(f"{where}: bad path segment {segment!r}")
        key, sel_key, sel_value, index = m.groups()
        if not isinstance(node, dict) or key not in node:
            raise ChartError(f"{where}: {'/'.join(segments[:i + 1])} not found in the base")
        if index is not None:
            items = node[key]
            if not isinstance(items, list) or int(index) >= len(items):
                raise ChartError(f"{where}: {key} has no item {index} in the base")
            if i == len(segments) - 1:
                return items, int(index)
            node = items[int(index)]
            continue
        if sel_key is None:
            if i == len(segments) - 1:
                return node, key
            node = node[key]
            continue
        items = node[key]
        matches = [j for j, item in enumerate(items if isinstance(items, list) else [])
                   if isinstance(item, dict) and item.get(sel_key) == sel_value]
        if len(matches) != 1:
            raise ChartError(f"{where}: {len(matches)} items of {key} have {sel_key}="
                             f"{sel_value} (expected one)")
        if i == len(segments) - 1:
            return items, matches[0]
        node = items[matches[0]]
    raise ChartError(f"{where}: empty path")


def _get(holder: object, key: str | int) -> object:
    return holder[key]  # type: ignore[index]


def _set(holder: object, key: str | int, value: object) -> None:
    holder[key] = value  # type: ignore[index]


def _splice(value: str | Spliced, pattern: re.Pattern[str], expr: Expr
            ) -> tuple[Spliced, list[str]] | None:
    """``value`` with the pattern's group replaced by ``expr``, and the texts it replaced;
    None when the pattern is not in it (literal parts are searched, never earlier splices)."""
    parts = value.parts if isinstance(value, Spliced) else [value]
    out: list[str | Expr] = []
    found: list[str] = []
    for part in parts:
        if isinstance(part, Expr):
            out.append(part)
            continue
        last = 0
        for m in pattern.finditer(part):
            out += [part[last:m.start(1)], expr]
            found.append(m.group(1))
            last = m.end(1)
        out.append(part[last:])
    return (Spliced(out), found) if found else None


def _apply_knob(doc: Doc, knob: Knob) -> object:
    """Put the knob's template into ``doc``; return its default."""
    where = f"knob {knob.value} ({knob.kind}/{knob.name} {knob.path})"
    holder, key = _resolve(doc, knob.path, where)
    current = _get(holder, key)
    expr = Expr(f".Values.{knob.value}")
    if knob.pattern is None:
        if isinstance(current, (Whole, Spliced)):
            raise ChartError(f"{where}: the field is already a knob")
        _set(holder, key, Whole(expr, current))
        return _typed(current) if isinstance(current, str) else current
    pattern = re.compile(knob.pattern)
    targets: list[tuple[object, str | int]] = (
        [(current, i) for i in range(len(current))] if isinstance(current, list)
        else [(holder, key)])
    hits: list[tuple[object, str | int, Spliced, list[str]]] = []
    for t_holder, t_key in targets:
        text = _get(t_holder, t_key)
        if isinstance(text, (str, Spliced)):
            result = _splice(text, pattern, expr)
            if result is not None:
                hits.append((t_holder, t_key, *result))
    found = [text for *_, texts in hits for text in texts]
    if len(found) != 1:
        raise ChartError(f"{where}: pattern {knob.pattern!r} matches {len(found)} times in the "
                         f"base (expected once)")
    t_holder, t_key, spliced, _ = hits[0]
    _set(t_holder, t_key, spliced)
    return _typed(found[0])


def _walk(node: object) -> Iterator[tuple[object, str | int, object]]:
    """Every (container, key, value) below ``node``; values only, never keys."""
    items: Iterator[tuple[str | int, object]]
    if isinstance(node, dict):
        items = iter(node.items())
    elif isinstance(node, list):
        items = iter(enumerate(node))
    else:
        return
    for key, value in list(items):
        yield node, key, value
        yield from _walk(value)


# The namespace as a word of its own, or as the namespace label of a Service's DNS name
# (`gpufrag-admission.gpufrag-system.svc`: a certificate's dnsNames, a scrape's serverName).
_NAMESPACE_RE: Final = re.compile(
    rf"(?:(?<![\w.-])|(?<=[\w-]\.)(?={re.escape(BASE_NAMESPACE)}\.svc\b))"
    rf"({re.escape(BASE_NAMESPACE)})(?![\w-])")


def _apply_namespace(doc: Doc) -> None:
    """Every value that is, or names, the base's namespace reads ``namespace.name``."""
    for holder, key, value in _walk(doc):
        if value == BASE_NAMESPACE:
            _set(holder, key, Whole(NAMESPACE_EXPR, value))
        elif isinstance(value, (str, Spliced)):
            spliced = _splice(value, _NAMESPACE_RE, NAMESPACE_EXPR)
            if spliced is not None:
                _set(holder, key, spliced[0])


_CONTAINER_LISTS: Final = ("containers", "initContainers", "ephemeralContainers")


def _image_key(repository: str) -> str:
    """``registry.k8s.io/kube-scheduler`` -> ``kubeScheduler`` (the values key)."""
    words = re.split(r"[^a-zA-Z0-9]+", repository.rsplit("/", 1)[-1])
    return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])


PULL_POLICY: Final = IfSet("imagePullPolicy", Expr(".Values.global.imagePullPolicy"), block=False)
PULL_SECRETS: Final = IfSet("imagePullSecrets", Expr(".Values.global.imagePullSecrets"), block=True)


def _apply_images(doc: Doc, images: dict[str, dict[str, str]], where: str) -> None:
    """Every container image reads ``images.<key>`` (key from the repository's last segment),
    with ``global.imageRegistry`` in place of its registry host where set; every container
    takes ``global.imagePullPolicy`` and every pod ``global.imagePullSecrets`` where set."""
    for holder, key, value in _walk(doc):
        if key not in _CONTAINER_LISTS or not isinstance(value, list):
            continue
        assert isinstance(holder, dict)
        if any(isinstance(c, dict) and "image" in c for c in value):
            holder[PULL_SECRETS] = None
        for container in value:
            ref = container.get("image") if isinstance(container, dict) else None
            if not isinstance(ref, str):
                continue
            repository, tag, digest = split_image(ref)
            image_key = _image_key(repository)
            spec = {"repository": repository, "tag": tag, "digest": digest}
            if images.setdefault(image_key, spec) != spec:
                raise ChartError(f"{where}: image {ref} and {images[image_key]} share the values "
                                 f"key images.{image_key}; give them one reference")
            fields = list(container.items())
            container.clear()
            for name, field_value in fields:
                container[name] = field_value
                if name == "image":
                    container[name] = Whole(Expr(
                        f'include "gpufrag.image" (dict "image" .Values.images.{image_key} '
                        f'"registry" .Values.global.imageRegistry)'), ref)
                    if "imagePullPolicy" not in container:
                        container[PULL_POLICY] = None


def _apply_pod_fields(doc: Doc, component: Component) -> dict[str, tuple[object, str]]:
    """The scheduling fields of ``component``'s pods read ``.Values``; return each value's
    default and help, by its dotted name."""
    where = f"component {component.value} ({component.kind}/{component.name})"
    holder, key = _resolve(doc, component.pod_path, where)
    pod = _get(holder, key)
    if not isinstance(pod, dict):
        raise ChartError(f"{where}: {component.pod_path} is not a pod spec")
    out: dict[str, tuple[object, str]] = {}
    for name, (empty, help_text) in POD_FIELDS.items():
        value = f"{component.value}.{name}"
        note = help_text.format(c=component.name)
        if name in pod:
            out[value] = (_apply_knob(doc, Knob(value, component.kind, component.name,
                                                f"{component.pod_path}/{name}", note)), note)
        else:
            pod[IfSet(name, Expr(f".Values.{value}"), block=not isinstance(empty, str))] = None
            out[value] = (copy.deepcopy(empty), note)
    return out


def _scoped(doc: Doc) -> bool:
    """Whether ``doc``'s name is one per cluster rather than per namespace: a cluster-scoped
    object (but the Namespace, whose name is a value, and the CRD, shared by every release) or
    one in a namespace of its own choosing (kube-system); these names are release-scoped."""
    kind = doc.get("kind")
    meta = doc.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    if kind in ("Namespace", "CustomResourceDefinition"):
        return False
    return namespace is None or namespace != BASE_NAMESPACE


# Admission policy bindings, by kind, and the kind of the policy each names in spec.policyName.
POLICY_BINDINGS: Final = {"ValidatingAdmissionPolicyBinding": "ValidatingAdmissionPolicy",
                          "MutatingAdmissionPolicyBinding": "MutatingAdmissionPolicy"}


def _release_scoped(name: str, where: str) -> Spliced:
    """``gpufrag-x`` as ``<fullname>-x``: the base's names with the release named gpufrag."""
    if not name.startswith(NAME_PREFIX):
        raise ChartError(f"{where}: its name is one per cluster, so it is release-scoped, and "
                         f"must start with {NAME_PREFIX!r}")
    return Spliced([FULLNAME_EXPR, name[len(NAME_PREFIX):]])


def _apply_release_names(doc: Doc, scoped_roles: set[str], where: str,
                         scoped_policies: frozenset[str] = frozenset()) -> None:
    """Release-scoped names for ``doc`` (where :func:`_scoped`) and for its references to the
    ClusterRoles it does not own (``roleRef``) and to the admission policies a binding names
    (``spec.policyName``), so a second release installs beside the first."""
    meta = doc["metadata"]
    assert isinstance(meta, dict)
    if _scoped(doc):
        meta["name"] = _release_scoped(str(meta["name"]), where)
    ref = doc.get("roleRef")
    if (isinstance(ref, dict) and ref.get("kind") == "ClusterRole"
            and ref.get("name") in scoped_roles):
        ref["name"] = _release_scoped(str(ref["name"]), where)
    spec = doc.get("spec")
    if (doc.get("kind") in POLICY_BINDINGS and isinstance(spec, dict)
            and spec.get("policyName") in scoped_policies):
        spec["policyName"] = _release_scoped(str(spec["policyName"]), where)


def _apply_labels(doc: Doc, extra: str = "") -> None:
    """The chart's standard labels beside the base's, ``app.kubernetes.io/name`` where the
    base has none, and those of the map value ``extra`` if any."""
    meta = doc["metadata"]
    assert isinstance(meta, dict)
    own = meta.get("labels") or {}
    assert isinstance(own, dict)
    meta["labels"] = Labels({NAME_LABEL: NAME_PREFIX} | own, extra)


def _apply_line(doc: Doc, line: Line) -> None:
    """Put ``line`` into the embedded file at ``line.path``, present where its value is true.

    The piece is an :class:`Expr` whose text opens an ``if`` and closes it around the line: in
    the literal block that a multi-line string becomes, every line after a newline is indented
    by the block's column, so the line sits under the one it follows whatever that column is.
    """
    where = f"line {line.value} ({line.kind}/{line.name} {line.path})"
    holder, key = _resolve(doc, line.path, where)
    current = _get(holder, key)
    parts = current.parts if isinstance(current, Spliced) else [current]
    hits = [(i, m) for i, part in enumerate(parts) if isinstance(part, str)
            for m in re.finditer(line.after, part)]
    if len(hits) != 1 or "\n" not in "".join(p for p in parts if isinstance(p, str)):
        raise ChartError(f"{where}: {line.after!r} matches {len(hits)} times in the base's "
                         f"multi-line string (expected once)")
    i, m = hits[0]
    text = parts[i]
    assert isinstance(text, str)
    piece = Expr(f"if .Values.{line.value} }}}}\n{m.group(1)}{line.line}{{{{ end")
    _set(holder, key, Spliced([*parts[:i], text[:m.end()], piece, text[m.end():],
                               *parts[i + 1:]]))


def _apply_additions(base: object, patched: object, part: PatchPart, where: str) -> None:
    """Put into ``base`` (an object of the base, or a field of one) what ``patched`` (the same
    rendered with ``part``'s component) adds to it, each piece an :class:`IfOn`: a map key
    ``base`` lacks, list items after ``base``'s own (a list's items are matched by position, as
    a JSON patch's ``/-`` appends). Anything else that differs is refused: a chart whose default
    render is not the base's would no longer be the base's."""
    if isinstance(base, dict) and isinstance(patched, dict):
        removed = [k for k in base if isinstance(k, str) and k not in patched]
        if removed:
            raise ChartError(f"{where}: {part.path} removes {', '.join(removed)}; a patch part "
                             f"may only add")
        for key, value in patched.items():
            if key in base:
                _apply_additions(base[key], value, part, f"{where}/{key}")
            else:
                base[IfOn(part.value, key, _added(value, part, f"{where}/{key}"))] = None
        return
    if isinstance(base, list) and isinstance(patched, list):
        own = [item for item in base if not isinstance(item, IfOn)]
        if len(patched) < len(own):
            raise ChartError(f"{where}: {part.path} removes list items; a patch part may only "
                             f"add")
        for i, (item, patched_item) in enumerate(zip(own, patched, strict=False)):
            _apply_additions(item, patched_item, part, f"{where}[{i}]")
        base.extend(IfOn(part.value, None, _added(item, part, f"{where}[-]"))
                    for item in patched[len(own):])
        return
    if base != patched:
        raise ChartError(f"{where}: {part.path} changes {base!r} to {patched!r}; a patch part "
                         f"may only add")


def _added(content: object, part: PatchPart, where: str) -> object:
    """``content`` as a patch part adds it: written as it is, so it may hold nothing a template
    would have to carry (the namespace, an image, a literal ``{{``)."""
    text = json.dumps(content)
    if BASE_NAMESPACE in text or "{{" in text or '"image"' in text:
        raise ChartError(f"{where}: {part.path} adds {text}, which names the namespace, an image "
                         f"or holds '{{{{'; a patch part adds only fixed fields")
    return content


def _identity(doc: Doc) -> tuple[str, str, str]:
    meta = doc.get("metadata")
    namespace = meta.get("namespace", "") if isinstance(meta, dict) else ""
    return str(doc.get("kind")), _name(doc), str(namespace)


def _apply_patch_part(docs: Sequence[Doc], patched: Sequence[Doc], part: PatchPart) -> None:
    """The additions of ``part`` (``patched``: the base rendered with its component) in the base
    objects ``docs``; an object the component adds is refused (that is a :class:`Part`)."""
    by_identity = {_identity(doc): doc for doc in docs}
    for doc in patched:
        key = _identity(doc)
        if key not in by_identity:
            raise ChartError(f"{part.path}: adds {key[0]}/{key[1]}, which the base lacks; a "
                             f"component of its own objects is a Part, not a PatchPart")
        _apply_additions(by_identity[key], doc, part, f"{key[0]}/{key[1]}")


def _apply_ca_bundle(doc: Doc) -> None:
    """Every webhook's ``clientConfig.caBundle`` reads :data:`CA_BUNDLE_VAR` where it is set
    (the template's prelude, :func:`self_signed_prelude`, sets it)."""
    webhooks = doc.get("webhooks")
    for webhook in webhooks if isinstance(webhooks, list) else []:
        client = webhook.get("clientConfig") if isinstance(webhook, dict) else None
        if isinstance(client, dict):
            client[IfSet("caBundle", Expr(CA_BUNDLE_VAR), block=False)] = None


def self_signed_prelude(docs: Sequence[Doc]) -> str:
    """The start of the webhook configuration's template: :data:`CA_BUNDLE_VAR` from the
    value, or, with ``rightsizing.selfSigned`` (and no cert-manager), from the Secret this
    writes: the one the base's Certificate names, for the DNS names it lists (a CA and a
    serving certificate made by the chart, or the Secret's own on an upgrade, by ``lookup``).
    One template, so the Secret and the caBundle carry the same CA."""
    certificates = [d for d in docs if d.get("kind") == "Certificate"]
    if len(certificates) != 1:
        raise ChartError(f"webhook certificate: {len(certificates)} Certificates in the "
                         f"components (expected the right-sizing webhook's one)")
    spec = certificates[0]["spec"]
    assert isinstance(spec, dict)
    secret, dns_names = str(spec["secretName"]), [str(n) for n in spec["dnsNames"]]

    def templated(name: str) -> str:
        parts = [_go_literal(p) for p in name.split(BASE_NAMESPACE)]
        return f"(print {' $ns '.join(parts)})"

    names = " ".join(templated(n) for n in dns_names)
    return f"""\
{{{{- {CA_BUNDLE_VAR} := .Values.{CA_BUNDLE[0]} }}}}
{{{{- if and .Values.{SELF_SIGNED[0]} (not .Values.{GROUP_TOGGLES["cert-manager.io"][0]}) }}}}
{{{{- $ns := include "gpufrag.namespace" . }}}}
{{{{- $tls := (lookup "v1" "Secret" $ns {_go_literal(secret)}).data | default dict }}}}
{{{{- $crt := index $tls "tls.crt" }}}}
{{{{- $key := index $tls "tls.key" }}}}
{{{{- $ca := index $tls "ca.crt" }}}}
{{{{- if not (and $crt $key $ca) }}}}
{{{{- $made := genCA "gpufrag-admission-ca" 3650 }}}}
{{{{- $cert := genSignedCert {templated(dns_names[0])} nil (list {names}) 3650 $made }}}}
{{{{- $crt = $cert.Cert | b64enc }}}}
{{{{- $key = $cert.Key | b64enc }}}}
{{{{- $ca = $made.Cert | b64enc }}}}
{{{{- end }}}}
{{{{- {CA_BUNDLE_VAR} = $ca }}}}
apiVersion: v1
kind: Secret
metadata:
  name: {_go_literal(secret)}
  namespace: {{{{ $ns | quote }}}}
  labels: {{{{- include "gpufrag.labels" . | nindent 4 }}}}
    {NAME_LABEL}: {secret}
    app.kubernetes.io/part-of: {NAME_PREFIX}
type: kubernetes.io/tls
data:
  tls.crt: {{{{ $crt }}}}
  tls.key: {{{{ $key }}}}
  ca.crt: {{{{ $ca }}}}
---
{{{{- end }}}}
"""


# --------------------------------------------------------------------------------------------
# Dumping


class _Token(str):
    """A placeholder that dumps as a plain scalar."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Token, lambda d, t: d.represent_scalar("tag:yaml.org,2002:str", str(t)))


def _key_column(prefix: str) -> int:
    """Where the content of a block under ``prefix`` (``    key: `` or ``  - ``) is indented."""
    if prefix.endswith(": "):
        lead = re.match(r"(?:\s*- )*\s*", prefix)
        assert lead is not None
        return len(lead.group(0)) + 2
    return len(prefix)


def _render_piece(piece: Whole | Spliced, prefix: str, where: str) -> str:
    """The template text that replaces the token of ``piece`` after ``prefix`` on its line."""
    if isinstance(piece, Whole):
        if isinstance(piece.value, str):
            return f"{{{{ {piece.expr.text} | quote }}}}"
        if isinstance(piece.value, (dict, list)):
            return f"{{{{- toYaml {piece.expr.text} | nindent {_key_column(prefix)} }}}}"
        return f"{{{{ {piece.expr.text} }}}}"
    text = "".join(p if isinstance(p, str) else "\0" for p in piece.parts)
    if "\n" not in text.rstrip("\n"):
        parts = list(piece.parts)
        while parts and parts[0] == "":  # an empty literal between two values stays: print
            parts.pop(0)                 # puts a blank between two operands that are not
        while parts and parts[-1] == "":  # strings
            parts.pop()
        args = [_go_literal(p) if isinstance(p, str) else p.arg() for p in parts]
        return f"{{{{ print {' '.join(args)} | quote }}}}"
    if text[:1] in (" ", "\t"):
        raise ChartError(f"{where}: a multi-line string that starts with a blank cannot be "
                         f"templated as a literal block")
    body = "".join(p.replace("{{", '{{ "{{" }}') if isinstance(p, str)
                   else f"{{{{ {p.text} }}}}" for p in piece.parts)
    stripped = body.rstrip("\n")
    trailing = len(body) - len(stripped)
    chomp = "-" if trailing == 0 else ("" if trailing == 1 else "+")
    indent = " " * _key_column(prefix)
    lines = [(indent + line) if line else "" for line in stripped.split("\n")]
    return f"|{chomp}\n" + "\n".join(lines) + "\n" * (trailing - 1 if trailing > 1 else 0)


def _render_if_set(piece: IfSet, indent: str) -> str:
    """The lines that write ``piece.key`` at ``indent`` only where its value is set."""
    field = (f"{piece.key}: {{{{- toYaml . | nindent {len(indent) + 2} }}}}" if piece.block
             else f"{piece.key}: {{{{ . | quote }}}}")
    return (f"{indent}{{{{- with {piece.expr.text} }}}}\n{indent}{field}\n"
            f"{indent}{{{{- end }}}}")


def _render_if_on(piece: IfOn, prefix: str, rest: str, where: str) -> str:
    """The lines that write ``piece`` (a map key after ``prefix``, followed by ``rest``, or a
    list item) only where its value is true."""
    indent = prefix.removesuffix("- ") if piece.key is None else prefix
    if piece.key is None and (indent.strip() or not prefix.endswith("- ") or rest):
        raise ChartError(f"{where}: a list item added by a patch part not alone on its line")
    if piece.key is not None and (prefix.strip() or rest != ": null"):
        raise ChartError(f"{where}: {piece.key} cannot be the first field of a list item: "
                         f"{prefix}...{rest}")
    added = [piece.content] if piece.key is None else {piece.key: piece.content}
    text = yaml.safe_dump(added, sort_keys=False, width=10**9, default_flow_style=False,
                          allow_unicode=True)
    body = "\n".join(indent + line for line in text.rstrip("\n").split("\n"))
    return f"{indent}{{{{- if .Values.{piece.value} }}}}\n{body}\n{indent}{{{{- end }}}}"


def _render_labels(piece: Labels, prefix: str) -> str:
    """``labels:`` content after ``prefix``: the standard labels, then the object's own."""
    column = _key_column(prefix)
    own = yaml.safe_dump(piece.own, sort_keys=False, width=10**9, allow_unicode=True)
    extra = (f"\n{' ' * column}{{{{- with .Values.{piece.extra} }}}}{{{{- toYaml . | nindent "
             f"{column} }}}}{{{{- end }}}}") if piece.extra else ""
    return (f'{{{{- include "gpufrag.labels" . | nindent {column} }}}}'
            + "".join(f"\n{' ' * column}{line}" for line in own.rstrip("\n").split("\n"))
            + extra)


def _dump(doc: Doc, where: str) -> str:
    """``doc`` as YAML with every Whole/Spliced/IfSet/Labels piece written as its template."""
    pieces: dict[str, Whole | Spliced | IfSet | Labels | IfOn] = {}

    def token(piece: Whole | Spliced | IfSet | Labels | IfOn) -> _Token:
        name = f"gpufragtemplatepiece{len(pieces):04d}"
        pieces[name] = piece
        return _Token(name)

    def tokenize(node: object) -> object:
        if isinstance(node, (Whole, Spliced, Labels, IfOn)):
            return token(node)
        if isinstance(node, str) and "{{" in node:  # a literal "{{": emit through a template
            return tokenize(Spliced([node]))
        if isinstance(node, dict):
            return {token(k) if isinstance(k, (IfSet, IfOn)) else k: tokenize(v)
                    for k, v in node.items()}
        if isinstance(node, list):
            return [tokenize(v) for v in node]
        return node

    text = yaml.dump(tokenize(doc), Dumper=_Dumper, sort_keys=False, width=10**9,
                     default_flow_style=False, allow_unicode=True)
    lines = text.split("\n")
    for i, line in enumerate(lines):
        for m in re.finditer(r"gpufragtemplatepiece\d{4}", line):
            piece = pieces[m.group(0)]
            prefix = line[:m.start()]
            if isinstance(piece, IfOn):
                lines[i] = _render_if_on(piece, prefix, line[m.end():], where)
                continue
            if isinstance(piece, IfSet):
                if prefix.strip() or line[m.end():] != ": null":
                    raise ChartError(f"{where}: {piece.key} cannot be the first field of a list "
                                     f"item: {line!r}")
                lines[i] = _render_if_set(piece, prefix)
                continue
            if line[m.end():].strip():
                raise ChartError(f"{where}: placeholder not alone at the end of its line: {line!r}")
            lines[i] = prefix + (_render_labels(piece, prefix) if isinstance(piece, Labels)
                                 else _render_piece(piece, prefix, where))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The chart


_HEADER: Final = ("# Generated by devkit/chart.py from manifests/ (the base and its components); "
                  f"do not edit: change\n# them, then run `{REGENERATE}`.\n")
# Templates carry it as a template comment, so the rendered objects do not.
_TEMPLATE_HEADER: Final = ("{{- /* Generated by devkit/chart.py from manifests/ (the base and its "
                           f"components); do not edit: change them, then run `{REGENERATE}`. "
                           "*/}}\n")


def _name(doc: Doc) -> str:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        raise ChartError(f"a {doc.get('kind')} in the base has no metadata.name")
    return name


def _find(docs: Sequence[Doc], kind: str, name: str, where: str) -> Doc:
    for doc in docs:
        if doc.get("kind") == kind and _name(doc) == name:
            return doc
    raise ChartError(f"{where}: {kind}/{name} is not in the base")


def _file_name(doc: Doc, taken: set[str]) -> str:
    meta = doc["metadata"]
    assert isinstance(meta, dict)
    stem = f"{str(doc['kind']).lower()}-{meta['name']}"
    if stem in taken:
        stem = f"{stem}-{meta.get('namespace', 'cluster')}"
    if stem in taken:
        raise ChartError(f"two objects would be written to templates/{stem}.yaml")
    taken.add(stem)
    return f"templates/{stem}.yaml"


def _get_default(values: dict[str, object], dotted: str, where: str) -> object:
    node: object = values
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            raise ChartError(f"{where}: reads a value no earlier knob declares")
        node = node[key]
    return node


def _set_default(values: dict[str, object], dotted: str, value: object) -> None:
    node = values
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.setdefault(key, {})
        assert isinstance(child, dict)
        node = child
    if leaf in node:
        raise ChartError(f"value {dotted} is set twice")
    node[leaf] = value


def _declare_optional(values: dict[str, object], notes: dict[str, str], parts: Sequence[Part],
                      docs: Sequence[Doc]) -> None:
    """The values of the optional parts (off by default), of the API groups' toggles and of
    the webhooks' CA, where the objects they govern are in ``docs``."""
    declared = {part.value for part in parts if not part.also}
    for part in parts:
        if part.also:
            missing = [v for v in (part.value, *part.also) if v not in declared]
            if missing:
                raise ChartError(f"part {part.path}: needs {', '.join(missing)}, which no "
                                 f"other part declares")
            continue
        _set_default(values, part.value, False)
        notes[part.value] = part.help
        if part.labels:
            _set_default(values, part.labels, {})
            notes[part.labels] = ("Labels added to each of its objects, e.g. the label your "
                                  "Prometheus selects monitors and rules by (release: NAME).")
    present_groups = {str(d.get("apiVersion", "")).split("/")[0] for d in docs}
    for group, (value, note) in GROUP_TOGGLES.items():
        if group in present_groups:
            _set_default(values, value, True)
            notes[value] = note
    if any(str(d.get("kind")).endswith("WebhookConfiguration") for d in docs):
        _set_default(values, CA_BUNDLE[0], "")
        notes[CA_BUNDLE[0]] = CA_BUNDLE[1]
        _set_default(values, SELF_SIGNED[0], False)
        notes[SELF_SIGNED[0]] = SELF_SIGNED[1]


def _conditions(doc: Doc, name: str, toggles: Sequence[Toggle], values: Sequence[str]
                ) -> list[str]:
    """What must be true for ``doc`` to be rendered: ``values`` (its part's, its hook's), the
    one toggle its name falls under, its API group's toggle, ``namespace.create`` for the
    Namespace."""
    toggled = [f".Values.{t.value}" for t in toggles if name.startswith(t.name_prefix)]
    if len(toggled) > 1:
        raise ChartError(f"{doc.get('kind')}/{name}: more than one toggle applies "
                         f"({', '.join(toggled)})")
    group_toggle = GROUP_TOGGLES.get(str(doc.get("apiVersion", "")).split("/")[0])
    return [*(f".Values.{v}" for v in values), *toggled,
            *([f".Values.{group_toggle[0]}"] if group_toggle else []),
            *([".Values.namespace.create"] if doc.get("kind") == "Namespace" else [])]


def build_chart(docs: Sequence[Doc], version: str, *,
                parts: Mapping[Part, Sequence[Doc]] | None = None,
                patched: Mapping[PatchPart, Sequence[Doc]] | None = None,
                knobs: Sequence[Knob] = KNOBS, toggles: Sequence[Toggle] = TOGGLES,
                components: Sequence[Component] = COMPONENTS, lines: Sequence[Line] = LINES,
                hooks: bool = True) -> dict[str, str]:
    """The chart's files (relative path -> text) for the rendered base ``docs`` and the
    rendered optional ``parts``; ``hooks``: with the ``helm test`` hooks (:func:`test_hooks`)
    and the CRD upgrade hook (:func:`crd_upgrade_hooks`)."""
    base = [copy.deepcopy(d) for d in docs]
    sources: list[tuple[Doc, Part | None]] = [(d, None) for d in base] + [
        (copy.deepcopy(d), part) for part, part_docs in (parts or {}).items() for d in part_docs]
    docs = [doc for doc, _ in sources]
    # The order of values.yaml.
    values: dict[str, object] = {"fullnameOverride": ""} | {group: {} for group in GROUP_HELP}
    values["global"] = {"imageRegistry": "", "imagePullPolicy": "", "imagePullSecrets": []}
    values["namespace"] = {"name": "", "create": False}
    images: dict[str, dict[str, str]] = {}
    notes = {k.value: k.help for k in knobs if not k.again} | {
        t.value: t.help for t in toggles}

    names = [_name(d) for d in docs]
    for toggle in toggles:
        if not any(name.startswith(toggle.name_prefix) for name in names[:len(base)]):
            raise ChartError(f"toggle {toggle.value}: no object named {toggle.name_prefix}* in "
                             f"the base")
        _set_default(values, toggle.value, toggle.default)
    _declare_optional(values, notes, list(parts or {}), docs)
    for patch_part, patched_docs in (patched or {}).items():
        _apply_patch_part(base, patched_docs, patch_part)

    for knob in knobs:
        where = f"knob {knob.value}"
        default = _apply_knob(_find(docs, knob.kind, knob.name, where), knob)
        if not knob.again:
            _set_default(values, knob.value, default)
        elif _get_default(values, knob.value, where) != default:
            raise ChartError(f"{where} ({knob.kind}/{knob.name} {knob.path}): the base has "
                             f"{default!r} there, not the value's default")
    for line in lines:
        _apply_line(_find(docs, line.kind, line.name, f"line {line.value}"), line)
        _set_default(values, line.value, False)
        notes[line.value] = line.help
    for component in components:
        where = f"component {component.value}"
        doc = _find(docs, component.kind, component.name, where)
        for value, (default, note) in _apply_pod_fields(doc, component).items():
            _set_default(values, value, default)
            notes[value] = note
    for patch_part in patched or {}:
        _set_default(values, patch_part.value, False)
        notes[patch_part.value] = patch_part.help

    # Each hook with the folder of its template and the value it needs, if any.
    extra: list[tuple[Doc, str, str]] = []
    if hooks:
        extra += [(hook, "templates/tests/", "") for hook in test_hooks(base)]
        extra += [(hook, "templates/crd-upgrade/", CRD_UPGRADE_VALUE)
                  for hook in crd_upgrade_hooks(base)]
        _set_default(values, CRD_UPGRADE_VALUE, True)
        notes[CRD_UPGRADE_VALUE] = (
            "helm upgrade applies crds/ (Helm itself installs them once and never upgrades "
            "them) with a pre-upgrade hook Job running kubectl; false: apply "
            "charts/gpufrag/crds/ yourself before an upgrade.")
    scoped_roles = {_name(doc) for doc in [*docs, *(hook for hook, _, _ in extra)]
                    if doc.get("kind") == "ClusterRole" and _scoped(doc)}
    scoped_policies = frozenset(_name(doc) for doc in docs
                                if doc.get("kind") in POLICY_BINDINGS.values() and _scoped(doc))
    # From the Certificate as the components have it: the loop below templates its namespace.
    webhook_prelude = (self_signed_prelude(docs) if any(
        str(d.get("kind", "")).endswith("WebhookConfiguration") for d in docs) else "")
    files: dict[str, str] = {}
    taken: set[str] = set()
    hook_of = {id(hook): (folder, value) for hook, folder, value in extra}
    for doc, name, source in [*((d, n, src) for (d, src), n in zip(sources, names, strict=True)),
                              *((h, _name(h), None) for h, _, _ in extra)]:
        where = f"{doc.get('kind')}/{name}"
        if doc.get("kind") == "CustomResourceDefinition":
            # In crds/, which Helm installs before the templates and never upgrades or deletes:
            # `helm uninstall` must not take every live GPUReservation with the CRD. Plain YAML
            # there (Helm does not template it), so no knob or image may reach a CRD.
            files[f"crds/{name}.yaml"] = _HEADER + yaml.safe_dump(
                doc, sort_keys=False, width=10**9, allow_unicode=True)
            continue
        if doc.get("kind") == "Namespace":
            # Kept on uninstall: it holds the reservations, the record key and the hints.
            meta = doc["metadata"]
            assert isinstance(meta, dict)
            meta.setdefault("annotations", {})[KEEP_ANNOTATION] = "keep"
        path = _file_name(doc, taken)
        folder, hook_value = hook_of.get(id(doc), ("templates/", ""))
        path = path.replace("templates/", folder, 1)
        _apply_release_names(doc, scoped_roles, where, scoped_policies)
        _apply_namespace(doc)
        _apply_images(doc, images, where)
        _apply_labels(doc, source.labels if source else "")
        if str(doc.get("kind", "")).endswith("WebhookConfiguration"):
            _apply_ca_bundle(doc)
        conditions = _conditions(doc, name, toggles, [
            v for v in (hook_value, *((source.value, *source.also) if source else ())) if v])
        body = _dump(doc, where)
        if str(doc.get("kind", "")).endswith("WebhookConfiguration"):
            body = webhook_prelude + body
        if doc.get("kind") == "Namespace":
            body = NAMESPACE_GUARD + body
        if conditions:
            test = conditions[0] if len(conditions) == 1 else f"and {' '.join(conditions)}"
            body = f"{{{{- if {test} }}}}\n{body}{{{{- end }}}}\n"
        files[path] = _TEMPLATE_HEADER + body
    values["images"] = dict(sorted(images.items()))
    files["templates/_helpers.tpl"] = HELPERS
    files["Chart.yaml"] = _chart_yaml(version)
    enums = {k.value: k.enum for k in knobs if k.enum}
    files["values.yaml"] = _values_yaml(values, notes)
    files["values.schema.json"] = json.dumps(_schema(values, enums), indent=2) + "\n"
    files["README.md"] = _readme(values, notes)
    files["templates/NOTES.txt"] = NOTES
    return dict(sorted(files.items()))


# Helm leaves an object with this annotation in place on uninstall (and on an upgrade that
# drops it).
KEEP_ANNOTATION: Final = "helm.sh/resource-policy"
# At the top of the Namespace's template (rendered with namespace.create only): the release's own
# namespace exists before any object is made -- helm keeps the release record there, and
# --create-namespace makes it -- so creating it again can only fail the install, after some
# objects are in (the STATUS failed this default used to give). Refused up front, saying what
# to set instead.
NAMESPACE_GUARD: Final = """\
{{- if eq (include "gpufrag.namespace" .) .Release.Namespace }}
{{- fail (printf "namespace.create: the release's namespace %s exists before the chart's objects \
(helm keeps the release there; --create-namespace makes it), so the chart cannot create it: \
leave namespace.create false, or set namespace.name to another namespace for the chart to \
create" .Release.Namespace) }}
{{- end }}
"""
HOOK_ANNOTATION: Final = "helm.sh/hook"

# `helm test`: a pod that asks every extender replica's probe listener, found through the API.
TEST_POD: Final = "gpufrag-test-extender-answers"
TEST_DEADLINE_S: Final = 120
TEST_PATHS: Final = ("/healthz", "/readyz")
# Run by the gpufrag image's python, as the hook's ServiceAccount (list pods, its namespace
# only): find the extender's pods by their labels, then GET each path on each pod's IP until it
# answers 200, within one deadline (a replica may still be starting, /readyz waits for the
# first sync); exit non-zero naming the pod, the path and the last error otherwise. Pod IPs, not
# a Service: nothing in the cluster's DNS or Service routing stands between the test and the
# extender, and every replica is asked. Outside a pod (a test of this script) it reads
# $KUBECONFIG instead.
_TEST_SCRIPT: Final = """\
import os, sys, time, urllib.request
from kubernetes import client, config
selector, port, deadline = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
if "KUBERNETES_SERVICE_HOST" in os.environ:
    config.load_incluster_config()
else:
    config.load_kube_config()
namespace, core = os.environ["POD_NAMESPACE"], client.CoreV1Api()
while True:
    pods = [p for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.status.pod_ip and p.metadata.deletion_timestamp is None]
    if pods:
        break
    if time.monotonic() > deadline:
        sys.exit(f"no pod {selector} in {namespace} has an IP within the deadline")
    time.sleep(1)
for pod in pods:
    for path in sys.argv[4:]:
        url = f"http://{pod.status.pod_ip}:{port}{path}"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    print(pod.metadata.name, url, reply.status, reply.read().decode().strip(),
                          flush=True)
                    break
            except OSError as e:
                if time.monotonic() > deadline:
                    sys.exit(f"{pod.metadata.name} {url}: no 200 within the deadline: {e}")
            time.sleep(1)
"""


# `helm upgrade` never touches crds/: this pre-upgrade hook applies them (as KAI's chart does).
CRD_HOOK: Final = "gpufrag-crd-upgrade"
CRD_UPGRADE_VALUE: Final = "crds.upgrade"


def crd_upgrade_hooks(docs: Sequence[Doc]) -> list[Doc]:
    """The pre-upgrade hook that applies the chart's ``crds/`` (server-side, taking ownership
    of the fields), since ``helm upgrade`` never does: a ServiceAccount bound to a ClusterRole
    that may change only those CRDs (and create one that a new chart version adds: create
    cannot be limited by name; the account lives as long as the hook), the ``crds/`` files as a
    ConfigMap (read from the chart with ``.Files``, so one copy), and a Job running kubectl,
    whose image is the base's (the example's pre-warm CronJob)."""
    where = "CRD upgrade hook"
    crds = [_name(d) for d in docs if d.get("kind") == "CustomResourceDefinition"]
    kubectl = sorted({ref for ref in _image_refs(docs) if
                      split_image(ref)[0].rsplit("/", 1)[-1] == "kubectl"})
    if not crds or len(kubectl) != 1:
        raise ChartError(f"{where}: needs the base's CRDs ({len(crds)}) and one kubectl image "
                         f"({', '.join(kubectl) or 'none'})")

    def meta(name: str, weight: int, namespaced: bool = True) -> Doc:
        return {"name": name, **({"namespace": BASE_NAMESPACE} if namespaced else {}),
                "labels": {NAME_LABEL: CRD_HOOK, "app.kubernetes.io/part-of": NAME_PREFIX},
                "annotations": {HOOK_ANNOTATION: "pre-upgrade",
                                "helm.sh/hook-weight": str(weight),
                                "helm.sh/hook-delete-policy":
                                    "before-hook-creation,hook-succeeded"}}

    rbac = "rbac.authorization.k8s.io/v1"
    subject = {"kind": "ServiceAccount", "name": CRD_HOOK, "namespace": BASE_NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(CRD_HOOK, -10)},
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": meta(CRD_HOOK, -10, False),
         "rules": [{"apiGroups": ["apiextensions.k8s.io"],
                    "resources": ["customresourcedefinitions"],
                    "resourceNames": crds, "verbs": ["get", "patch"]},
                   {"apiGroups": ["apiextensions.k8s.io"],
                    "resources": ["customresourcedefinitions"], "verbs": ["create"]}]},
        {"apiVersion": rbac, "kind": "ClusterRoleBinding",
         "metadata": meta(CRD_HOOK, -10, False),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": CRD_HOOK},
         "subjects": [subject]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(CRD_HOOK, -10),
         "data": Whole(Expr('((.Files.Glob "crds/*.yaml").AsConfig | fromYaml)'), {})},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta(CRD_HOOK, 0),
         "spec": {"backoffLimit": 2, "activeDeadlineSeconds": 300, "template": {"spec": {
             "serviceAccountName": CRD_HOOK,
             "restartPolicy": "Never",
             "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                 "runAsGroup": 65532,
                                 "seccompProfile": {"type": "RuntimeDefault"}},
             "containers": [{
                 "name": "kubectl",
                 "image": kubectl[0],
                 "command": ["/bin/kubectl"],
                 "args": list(CRD_APPLY_ARGS),
                 "env": [{"name": "HOME", "value": "/tmp"}],  # kubectl's discovery cache
                 "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                               "limits": {"cpu": "500m", "memory": "128Mi"}},
                 "securityContext": {"allowPrivilegeEscalation": False,
                                     "readOnlyRootFilesystem": True,
                                     "capabilities": {"drop": ["ALL"]}},
                 "volumeMounts": [{"name": "crds", "mountPath": "/crds", "readOnly": True},
                                  {"name": "tmp", "mountPath": "/tmp"}],
             }],
             "volumes": [{"name": "crds", "configMap": {"name": CRD_HOOK}},
                         {"name": "tmp", "emptyDir": {}}],
         }}}},
    ]


# What the hook's kubectl runs: a server-side apply of every file in crds/ that takes over the
# fields `helm install` set (--force-conflicts), under a field manager of its own.
CRD_APPLY_ARGS: Final = ("apply", "--server-side", "--force-conflicts",
                         "--field-manager=gpufrag-crd-upgrade", "-f", "/crds/")


def _image_refs(docs: Sequence[Doc]) -> set[str]:
    return {str(c["image"]) for doc in docs for holder, key, value in _walk(doc)
            if key in _CONTAINER_LISTS and isinstance(value, list)
            for c in value if isinstance(c, dict) and isinstance(c.get("image"), str)}


def test_hooks(docs: Sequence[Doc]) -> list[Doc]:
    """The ``helm test`` objects, built from what the base says about the extender: its pod's
    labels, its probe port (``ext-health``) and its image. The verbs listen on the pod's
    loopback only (nothing outside the pod may bind), so the test asks the probe listener:
    ``/healthz`` (the process answers) and ``/readyz`` (its state has synced), on every
    replica; a ServiceAccount that may list pods in the namespace finds them."""
    where = "helm test"
    scheduler = _find(docs, *_SCHED, where)
    holder, key = _resolve(scheduler, "spec/template/spec/containers[name=extender]", where)
    extender = _get(holder, key)
    assert isinstance(extender, dict)
    ports = [p for p in extender.get("ports", []) if p.get("name") == "ext-health"]
    if len(ports) != 1 or not isinstance(extender.get("image"), str):
        raise ChartError(f"{where}: the extender container has no ext-health port or no image")
    port = ports[0]["containerPort"]
    holder, key = _resolve(scheduler, "spec/selector/matchLabels", where)
    selector = _get(holder, key)
    assert isinstance(selector, dict)

    def meta(weight: int) -> Doc:
        return {"name": TEST_POD, "namespace": BASE_NAMESPACE,
                "labels": {NAME_LABEL: TEST_POD, "app.kubernetes.io/part-of": NAME_PREFIX},
                "annotations": {HOOK_ANNOTATION: "test", "helm.sh/hook-weight": str(weight),
                                "helm.sh/hook-delete-policy":
                                    "before-hook-creation,hook-succeeded"}}

    rbac = "rbac.authorization.k8s.io/v1"
    pod: Doc = {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta(0),
        "spec": {
            "serviceAccountName": TEST_POD,
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "extender-answers",
                "image": extender["image"],
                "command": ["python", "-c", _TEST_SCRIPT,
                            ",".join(f"{k}={v}" for k, v in sorted(selector.items())),
                            str(port), str(TEST_DEADLINE_S), *TEST_PATHS],
                "env": [{"name": "POD_NAMESPACE",
                         "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"},
                              "limits": {"cpu": "1", "memory": "256Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }]}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(-1)},
        {"apiVersion": rbac, "kind": "Role", "metadata": meta(-1),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": meta(-1),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TEST_POD},
         "subjects": [{"kind": "ServiceAccount", "name": TEST_POD,
                       "namespace": BASE_NAMESPACE}]},
        pod,
    ]

HELPERS: Final = """\
{{/* Generated by devkit/chart.py; do not edit. */}}

{{/* The namespace of every namespaced object: namespace.name, else the release namespace. */}}
{{- define "gpufrag.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* What every release-scoped name starts with (a ClusterRole's, a ClusterRoleBinding's, an
object's in kube-system): fullnameOverride, else the release name where it holds "gpufrag",
else <release>-gpufrag. The release named gpufrag gets the kustomize base's names. */}}
{{- define "gpufrag.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride -}}
{{- else if contains "gpufrag" .Release.Name -}}
{{- .Release.Name -}}
{{- else -}}
{{- printf "%s-gpufrag" .Release.Name -}}
{{- end -}}
{{- end -}}

{{/* The labels the chart puts on every object beside the base's. */}}
{{- define "gpufrag.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* An image reference from {image: {repository, tag, digest}, registry}:
repository[:tag][@digest], with registry (global.imageRegistry) in place of the repository's
registry host where set. */}}
{{- define "gpufrag.image" -}}
{{- $repository := .image.repository -}}
{{- with .registry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) (regexReplaceAll "^[^/]+/" $repository "") -}}
{{- end -}}
{{- $repository -}}
{{- with .image.tag -}}:{{ . }}{{- end -}}{{- with .image.digest -}}@{{ . }}{{- end -}}
{{- end -}}
"""

NOTES: Final = """\
gpufrag is installed in namespace {{ include "gpufrag.namespace" . }}.
{{- $hostPaths := or .Values.agent.enabled .Values.devicePlugin.enabled }}
{{- if and $hostPaths (not .Values.namespace.create) }}
The agent and the device plugin mount hostPath volumes, which Pod Security's baseline and
restricted levels refuse: where this namespace enforces one (a cluster-wide default included),
label it: kubectl label namespace {{ include "gpufrag.namespace" . }} \\
  pod-security.kubernetes.io/enforce=privileged pod-security.kubernetes.io/warn=restricted
{{- end }}
{{- if .Values.servingExample.enabled }}
The example model service resnet-serving is installed (servingExample.enabled=true).
{{- end }}
{{- if .Values.defrag.enabled }}
The defrag CronJob runs {{ if .Values.defrag.dryRun -}}
in dry-run: it prints plans and evicts nothing (set defrag.dryRun=false once they look right).
{{- else -}}
for real: it evicts through the Eviction API, within the PDBs.
{{- end }}
{{- end }}
Opt workloads in with spec.schedulerName: {{ .Values.scheduler.name }} (docs/operations.md).
Check that the extender answers: helm test {{ .Release.Name }} -n {{ .Release.Namespace }}
"""


def _chart_yaml(version: str) -> str:
    return _HEADER + yaml.safe_dump({
        "apiVersion": "v2",
        "name": "gpufrag",
        "description": "GPU-fragmentation-aware scheduling for Kubernetes: the FGD scheduler "
                       "extender, the defrag controller and the GPU node side.",
        "type": "application",
        "version": version,
        "appVersion": version,
    }, sort_keys=False)


def _help(path: str, notes: dict[str, str]) -> str:
    fixed = {
        "fullnameOverride": "What the release-scoped names (ClusterRoles, ClusterRoleBindings, "
                            "the admission policies and their bindings, the RoleBinding in "
                            "kube-system) start with; empty: the release "
                            "name where it holds \"gpufrag\", else <release>-gpufrag.",
        "global.imageRegistry": "Registry host (and path) in place of every image's own, e.g. "
                                "a mirror; empty: each image's as set under images.",
        "global.imagePullPolicy": "imagePullPolicy of every container (Always, IfNotPresent, "
                                  "Never); empty: Kubernetes' default.",
        "global.imagePullSecrets": "imagePullSecrets of every pod, as [{name: secret}].",
        "namespace.name": "Namespace of every namespaced object (and of every reference to "
                          "it: RBAC subjects, the admission policies' user names, the webhook's "
                          "Service and certificate, the hints' location); empty: the release "
                          "namespace.",
        "namespace.create": "Create namespace.name, which must then be another namespace than "
                            "the release's, with the Pod Security labels the agent and the "
                            "device plugin need, kept on uninstall (helm.sh/resource-policy: "
                            "keep). false: the namespace exists (helm install -n NS "
                            "--create-namespace makes the release's).",
    }
    if path.startswith("images.") and path.count(".") == 2:
        fixed[path] = {"repository": "Registry host and repository of the image.",
                       "tag": "Tag of the image.",
                       "digest": "sha256:... to pin the image by digest; empty: by tag only.",
                       }.get(path.rsplit(".", 1)[1], "")
    return notes.get(path) or fixed.get(path) or GROUP_HELP.get(path, "")


def _values_yaml(values: dict[str, object], notes: dict[str, str]) -> str:
    out = [_HEADER.rstrip("\n")]

    def emit(node: dict[str, object], prefix: str, depth: int) -> None:
        pad = "  " * depth
        for key, value in node.items():
            path = f"{prefix}{key}"
            note = _help(path, notes)
            if note:
                out.extend(f"{pad}# {line}" for line in textwrap.wrap(note, 96 - len(pad),
                                                                   break_on_hyphens=False))
            if isinstance(value, dict) and value and (depth == 0 or path.startswith("images.")):
                out.append(f"{pad}{key}:")
                emit(value, f"{path}.", depth + 1)
                continue
            text = yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False,
                                  width=10**9).rstrip("\n")
            out.extend(pad + line for line in text.split("\n"))

    emit(values, "", 0)
    return "\n".join(out) + "\n"


# What the binaries refuse at start, refused by `helm install` instead (naming the field), so a
# bad value is an install error, not a crash loop. Integers: inclusive bounds. Ratios: [0, 1),
# as the defrag controller reads --threshold.
INTEGER_BOUNDS: Final[dict[str, tuple[int, int]]] = {
    "scheduler.replicas": (1, 16),
    "extender.weight": (1, 100_000),
    "defrag.maxEvictionsPerNode": (0, 10_000),
    "defrag.maxEvictionsPerNamespace": (0, 10_000),
    "defrag.maxEvictionsTotal": (0, 100_000),
    "agent.intervalS": (1, 3600),
}
RATIOS: Final = frozenset({"defrag.threshold"})
# A ratio in [0, 1) as helm --set passes it (a string): 0, 0.25, .5, never 1 or more.
_RATIO_TEXT = r"^0*(\.[0-9]+|0(\.[0-9]*)?)$"


_LABEL: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # one DNS label
# Values whose schema is more than their default's type says.
SCHEMAS: Final[dict[str, dict[str, object]]] = {
    # A DNS subdomain, as kube-scheduler and gpufrag's names (names.scheduler_name) require.
    "scheduler.name": {"type": "string", "maxLength": 253,
                       "pattern": rf"^{_LABEL}(\.{_LABEL})*$"},
    "fullnameOverride": {"type": "string", "maxLength": 200,
                         "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$"},
    "global.imagePullPolicy": {"type": "string", "enum": ["", "Always", "IfNotPresent", "Never"]},
    "global.imagePullSecrets": {
        "type": "array", "items": {"type": "object", "additionalProperties": False,
                                   "required": ["name"],
                                   "properties": {"name": {"type": "string", "minLength": 1}}}},
    "global.imageRegistry": {"type": "string", "pattern": r"^([^/\s]+(/[^/\s]+)*/?)?$"},
    # A DNS label, as a Namespace's name is; empty: the release's.
    "namespace.name": {"type": "string", "maxLength": 63, "pattern": rf"^({_LABEL})?$"},
}


def _schema_of(value: object, path: str, enums: dict[str, tuple[str, ...]]
               ) -> dict[str, object]:
    if path in SCHEMAS:
        return SCHEMAS[path]
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        low, high = INTEGER_BOUNDS.get(path, (None, None))
        bounded = {} if low is None else {"minimum": low, "maximum": high}
        return {"type": "integer", **bounded}
    if isinstance(value, float):
        # `helm --set x=0.4` passes a float as a string (it types only integers and booleans);
        # a numeric string prints the same in a template, so it is accepted too.
        if path in RATIOS:
            return {"anyOf": [{"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                              {"type": "string", "pattern": _RATIO_TEXT}]}
        return {"anyOf": [{"type": "number"},
                          {"type": "string", "pattern": r"^-?[0-9]+(\.[0-9]+)?$"}]}
    if isinstance(value, str):
        if path in enums:
            return {"type": "string", "enum": list(enums[path])}
        if path.startswith("images.") and path.endswith(".repository"):
            return {"type": "string", "minLength": 1}
        return {"type": "string"}
    if isinstance(value, list):
        return {"type": "array"}
    assert isinstance(value, dict)
    if path and not (path.count(".") == 0 or path.startswith("images")):
        return {"type": "object"}  # a Kubernetes map (resources, nodeSelector): free-form
    schema: dict[str, object] = {
        "type": "object", "additionalProperties": False,
        "properties": {k: _schema_of(v, f"{path}.{k}" if path else k, enums)
                       for k, v in value.items()}}
    if path == "scheduler":
        rules = [
            # Two kube-scheduler replicas without leader election both schedule: double binds.
            {"if": {"properties": {"replicas": {"minimum": 2}}, "required": ["replicas"]},
             "then": {"properties": {"leaderElect": {"const": True}},
                      "required": ["leaderElect"]}},
        ]
        if "disruptionBudget" in value:
            # minAvailable 1 of one replica: no drain could ever evict it.
            rules.append({
                "if": {"properties": {"disruptionBudget": {"const": True}},
                       "required": ["disruptionBudget"]},
                "then": {"properties": {"replicas": {"minimum": 2}}, "required": ["replicas"]}})
        schema["allOf"] = rules
    if path == "namespace":
        # The release's namespace exists already (NAMESPACE_GUARD): the one to create is named.
        schema["allOf"] = [{
            "if": {"properties": {"create": {"const": True}}, "required": ["create"]},
            "then": {"properties": {"name": {"minLength": 1}}, "required": ["name"]}}]
    if path == "rightsizing" and "selfSigned" in value and "certManager" in value:
        # Either cert-manager makes the certificate or the chart does, never both.
        schema["allOf"] = [{
            "if": {"properties": {"selfSigned": {"const": True}}, "required": ["selfSigned"]},
            "then": {"properties": {"certManager": {"const": False}},
                     "required": ["certManager"]}}]
    return schema


def _schema(values: dict[str, object], enums: dict[str, tuple[str, ...]]) -> dict[str, object]:
    return {"$schema": "https://json-schema.org/draft-07/schema#", "title": "gpufrag values",
            **_schema_of(values, "", enums)}


def _readme(values: dict[str, object], notes: dict[str, str]) -> str:
    rows = []

    def leaves(node: dict[str, object], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value and (not prefix or path.startswith("images.")):
                leaves(value, f"{path}.")
            else:
                shown = json.dumps(value) if not isinstance(value, str) else value or '""'
                rows.append(f"| `{path}` | `{shown}` | {_help(path, notes)} |")

    leaves(values, "")
    layout = ",".join(f"{k}={v}" for k, v in BASE_LAYOUT)
    return (f"<!-- Generated by devkit/chart.py; do not edit: run `{REGENERATE}`. -->\n"
            "# gpufrag Helm chart\n\n"
            "```bash\nhelm install gpufrag charts/gpufrag -n gpufrag-system --create-namespace "
            "\\\n  --set images.gpufrag.repository=<your-registry>/gpufrag\n```\n\n"
            "Every namespaced object goes to the release's namespace (`-n`), which the chart "
            "does not create (`--create-namespace` does; `namespace.name` names another one, "
            "which `namespace.create=true` creates and keeps on uninstall). Where the cluster "
            "enforces a Pod Security level by default, label the namespace "
            "`pod-security.kubernetes.io/enforce=privileged`: the agent and the device plugin "
            "mount hostPath volumes. The example model service (a ResNet Deployment with its "
            "Service, PDB, HPA and pre-warm CronJobs) is off unless `servingExample.enabled=true`."
            "\n\n"
            "Generated from the kustomize base (`manifests/base`): with "
            f"`--set {layout}` (the base's namespace and its example) and the "
            "release named `gpufrag`, `helm template` renders exactly the objects `kubectl "
            "kustomize manifests/base` renders, plus the chart's standard labels (`helm.sh/chart`, "
            "`app.kubernetes.io/instance`, `-managed-by`, `-version`, and `-name` where the base "
            "has none) and the Namespace's keep policy (checked by `tests/e2e/test_helm.py`). "
            "Another release name gives the cluster-wide objects (ClusterRoles, "
            "ClusterRoleBindings, the admission policies and their bindings, the RoleBinding in "
            "kube-system) names of their own "
            "(`<release>-gpufrag-...`, or `fullnameOverride`), so a second release installs "
            "beside the first. The optional pieces of the kustomize layout (monitoring, "
            "dashboards, the right-sizing webhook, the scheduler's PodDisruptionBudget, the "
            "agent's MIG monitoring) are rendered from their components under "
            "`manifests/components` and are off by default; with "
            "`scheduler.replicas=2,scheduler.leaderElect=true,"
            "extender.ignorable=false,extender.bind=true,defrag.dryRun=false,"
            "scheduler.disruptionBudget=true` added to those, it renders the production "
            "overlay's objects. "
            "`helm test <release> -n <namespace>` runs the hooks in `templates/tests/`: a pod "
            "that asks every extender replica's probe listener for `/healthz` and `/readyz`. "
            "`helm upgrade` applies `crds/` through a pre-upgrade hook (`crds.upgrade`). "
            "Install and "
            "upgrade: the operations guide, "
            "[Install with Helm](../../docs/operations.md#install-with-helm).\n\n"
            "| value | default | what it sets |\n|---|---|---|\n" + "\n".join(rows) + "\n")


# --------------------------------------------------------------------------------------------
# Rendering the base, writing and checking


def render_sources(kubectl: Sequence[str], parts: Sequence[Part] = PARTS
                   ) -> tuple[list[Doc], dict[Part, list[Doc]]]:
    """The base and each optional part, rendered by kustomize: what :func:`build_chart`
    takes."""
    return render_base(kubectl), {part: render_base(kubectl, BASE_DIR.parent / part.path)
                                  for part in parts}


def render_patched(kubectl: Sequence[str], parts: Sequence[PatchPart] = PATCH_PARTS
                   ) -> dict[PatchPart, list[Doc]]:
    """The base rendered with each patch part's component, as an overlay would have it (a
    kustomization in a temporary folder naming both by relative path, which kustomize
    requires)."""
    rendered: dict[PatchPart, list[Doc]] = {}
    for part in parts:
        with tempfile.TemporaryDirectory(prefix="gpufrag-chart-") as folder:
            root = Path(folder)
            (root / "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": [os.path.relpath(BASE_DIR, root)],
                "components": [os.path.relpath(BASE_DIR.parent / part.path, root)]}))
            rendered[part] = render_base(kubectl, root)
    return rendered


def generate(kubectl: Sequence[str]) -> dict[str, str]:
    """The chart's files, from the current base and parts."""
    docs, parts = render_sources(kubectl)
    return build_chart(docs, project_version(), parts=parts, patched=render_patched(kubectl))


def render_base(kubectl: Sequence[str], base: Path = BASE_DIR) -> list[Doc]:
    """``kubectl kustomize base`` as a list of objects (``kubectl`` is the command prefix)."""
    result = subprocess.run([*kubectl, "kustomize", str(base)], capture_output=True, text=True,
                            timeout=120, check=False)
    if result.returncode != 0:
        raise ChartError(f"kubectl kustomize {base} exited {result.returncode}: "
                         f"{result.stderr.strip()}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def project_version() -> str:
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert isinstance(version, str)
    return version


def stale_files(files: dict[str, str], chart_dir: Path = CHART_DIR) -> list[str]:
    """The chart files that differ from ``files``, are missing, or should not be there."""
    present = {str(p.relative_to(chart_dir)) for p in chart_dir.rglob("*") if p.is_file()
               } if chart_dir.is_dir() else set()
    differ = [name for name, text in files.items()
              if name not in present or (chart_dir / name).read_text() != text]
    return sorted(differ + sorted(present - set(files)))


def write_chart(files: dict[str, str], chart_dir: Path = CHART_DIR) -> None:
    for name in stale_files(files, chart_dir):
        path = chart_dir / name
        if name in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[name])
        else:
            path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each out-of-date file")
    parser.add_argument("--kubectl", default=None,
                        help="kubectl command (default: the control-plane binary's kubectl)")
    args = parser.parse_args(argv)
    try:
        kubectl = (args.kubectl.split() if args.kubectl
                   else [str(build_control_plane(progress=sys.stderr)), "kubectl"])
        files = generate(kubectl)
    except (ChartError, BuildError) as e:
        print(f"devkit.chart: {e}", file=sys.stderr)
        return 2
    stale = stale_files(files)
    if args.check:
        for name in stale:
            print(f"devkit.chart: charts/gpufrag/{name} is out of date; run `{REGENERATE}`",
                  file=sys.stderr)
        return 1 if stale else 0
    write_chart(files)
    print(f"charts/gpufrag: {len(stale)} file(s) written, {len(files)} in the chart")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
