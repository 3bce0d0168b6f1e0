"""The one home of every name and format that crosses components.

The extender writes what the defrag controller and the node agent read (the GPU indices on a
pod, the placement hints), so the names of resources, labels and annotations, and the location
and encoding of placement hints, live here and nowhere else. The constants are the defaults;
:class:`KubeNames` is the shared ``names`` section of every component's configuration, so a
remap (HAMi's or Aliyun's resource names, say) set once applies to the extender, defrag, the
agent and the what-if alike. Every component reads it the same way: defaults, then the shared
environment ``GPUFRAG_NAMES__<FIELD>`` (one ConfigMap in the manifests, mounted with
``envFrom`` into every workload), then the component's own settings.

Placement hints: the defrag controller evicts a pod to make room and knows where its
replacement should land; it writes ``data[<owner uid>] = '[{"node": "gpu-7", "expires":
1767225600}]'`` into one ConfigMap (:attr:`KubeNames.hints_configmap` in
:attr:`KubeNames.hints_namespace`). The extender scores the hinted node(s) highest for pods of
that owner until the hint expires. A malformed entry is skipped and reported, never fatal:
hints are advice.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpufrag.errors import BadInput

# Whole GPUs (NVIDIA device plugin).
RESOURCE_GPU = "nvidia.com/gpu"
# Shared GPUs: per-GPU share in milli-GPU (as the openb trace) and GPU memory in MiB.
RESOURCE_GPU_MILLI = "gpufrag.io/gpu-milli"
RESOURCE_GPU_MEMORY_MIB = "gpufrag.io/gpu-memory-mib"
# MIG instances as NVIDIA's device plugin advertises them (``mixed`` strategy): one resource per
# profile of the MIG table (scheduler/core/mig.py, the one home of MIG geometry, which this list
# must name exactly: tests/scheduler/kube/test_mignodes.py checks it).
RESOURCE_MIG_PREFIX = "nvidia.com/mig-"
MIG_RESOURCES: tuple[str, ...] = tuple(RESOURCE_MIG_PREFIX + profile for profile in (
    "1g.10gb", "1g.18gb", "1g.20gb", "1g.35gb", "1g.5gb", "2g.10gb", "2g.20gb", "2g.35gb",
    "3g.20gb", "3g.40gb", "3g.71gb", "4g.20gb", "4g.40gb", "4g.71gb", "7g.141gb", "7g.40gb",
    "7g.80gb"))
# The resources the extender manages in kube-scheduler's configuration (managedResources), and
# whether kube-scheduler ignores them (ignoredByScheduler). Whole GPUs are counted by both:
# the device plugin advertises them. The shares are the extender's alone: kube-scheduler sees
# neither per-GPU room nor (for memory) any allocatable at all, since no device plugin
# advertises GPU memory and would fail every memory-share pod as "Insufficient" before the
# extender is asked; the kubelet drops requests for extended resources its node does not
# advertise at admission, so such a pod still runs. MIG instances are counted by both too (the
# device plugin advertises them); without them here kube-scheduler would never send a MIG pod
# to the extender. Every shipped configuration (kustomize, Helm, the dev kit) lists exactly
# these; tests/e2e/test_manifests.py checks it.
MANAGED_RESOURCES: dict[str, bool] = {RESOURCE_GPU: False, RESOURCE_GPU_MILLI: True,
                                      RESOURCE_GPU_MEMORY_MIB: True,
                                      **dict.fromkeys(MIG_RESOURCES, False)}

# Optional share resources, off ("") unless mapped: a share's compute in percent of one GPU
# (HAMi's nvidia.com/gpucores).
RESOURCE_GPU_CORES_PERCENT = ""
# The unit of the GPU-memory share resource: "MiB" (gpufrag, HAMi's nvidia.com/gpumem), "GiB"
# (Aliyun gpushare's aliyun.com/gpu-mem with its device plugin's default --memory-unit) or
# "bytes" (Koordinator's koordinator.sh/gpu-memory: "8Gi" is 8 GiB).
GPU_MEMORY_UNITS = ("MiB", "GiB", "bytes")
# Whose device plugin runs on the nodes, and so which annotations a bind writes besides the
# GPU indices: "gpufrag", "hami" (Project-HAMi's hami.io/* keys) or "gpushare"
# (AliyunContainerService's ALIYUN_COM_GPU_MEM_* keys).
DEVICE_PLUGINS = ("gpufrag", "hami", "gpushare")

# GPU feature discovery labels on nodes.
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_MEMORY_MIB = "nvidia.com/gpu.memory"
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
# NVIDIA's MIG manager: the node label naming the mig-parted config (a key of its
# ``mig-configs:``) the node's GPUs are to carry; the manager applies it when the value changes.
LABEL_MIG_CONFIG = "nvidia.com/mig.config"

# Model identity on pods.
LABEL_MODEL = "gpufrag.io/model"
LABEL_MODEL_VERSION = "gpufrag.io/model-version"

# Acceptable GPU products for a pod, "|"-separated like openb's gpu_spec.
ANNOTATION_GPU_SPEC = "gpufrag.io/gpu-spec"
# GPUs chosen at bind: comma-separated GPU indices on the node, e.g. "0,3".
ANNOTATION_GPU_INDICES = "gpufrag.io/gpu-indices"
# The extender's signature of that record (gpufrag.records): the device plugin honours
# gpu-indices only with it. The private key (Secret) and the public keys (ConfigMap) live in
# the hints namespace.
ANNOTATION_GPU_RECORD = "gpufrag.io/gpu-record"
RECORD_KEY_SECRET = "gpufrag-record-key"
RECORD_KEYS_CONFIGMAP = "gpufrag-record-keys"
# The GPUs the device plugin gave each container (JSON, gpufrag.records.allocated_text): written
# by the device plugin at Allocate, read by the node agent and gpufrag inspect against gpu-indices.
ANNOTATION_GPU_ALLOCATED = "gpufrag.io/gpu-allocated"
# Per-GPU usage published by the node agent on its Node (JSON, see node.agent).
ANNOTATION_GPU_USAGE = "gpufrag.io/gpu-usage"
# Opt a pod out of defragmentation moves ("false").
ANNOTATION_DEFRAG_MOVABLE = "gpufrag.io/defrag-movable"
# On the hints ConfigMap: what one defrag cycle leaves for the next (cooldown, hysteresis).
ANNOTATION_DEFRAG_STATE = "gpufrag.io/defrag-state"
# GPU right-sizing (defrag.rightsizing): the mode on a workload's controller ("off",
# "recommend" (default), "auto"); the recommendation (+ its history) the defrag controller
# publishes there (JSON); the admission webhook's record of what it changed on a pod, and why.
ANNOTATION_RIGHTSIZING_MODE = "gpufrag.io/rightsizing-mode"
ANNOTATION_GPU_RECOMMENDATION = "gpufrag.io/gpu-recommendation"
ANNOTATION_RIGHTSIZING_CHANGE = "gpufrag.io/rightsizing"

# How GPUs reach a node's pods: on GPU nodes, the DRA driver runs where this label says
# DELIVERY_DRA and the device plugin everywhere else; on a namespace, DELIVERY_DRA opts its pods
# into the admission webhook's conversion of GPU asks into ResourceClaims (docs/dra.md).
LABEL_DELIVERY = "gpufrag.io/delivery"
DELIVERY_DRA = "dra"

SCHEDULER_NAME = "gpufrag-scheduler"

# Placement hints from the defrag controller to the extender: one ConfigMap whose data maps an
# owner's UID (the ReplicaSet/StatefulSet/Job of an evicted pod) to a JSON list of
# {"node": <target node>, "expires": <unix seconds>}.
HINTS_CONFIGMAP = "gpufrag-placement-hints"
HINTS_NAMESPACE = "gpufrag-system"

# The namespace of a GPU reservation's placement in a ClusterState (its key is
# "<reservation>/<name>"; scheduler.kube.reservations): ':' is not allowed in a namespace name,
# so no pod key can collide with it. Here so the pure planner can tell a held share from a pod.
RESERVATION_PLACEMENT_NAMESPACE = "<reservation>"

# The shared names section in the environment: GPUFRAG_NAMES__GPU_MILLI=aliyun.com/gpu-mem.
NAMES_ENV_PREFIX = "GPUFRAG_NAMES__"


@dataclass(frozen=True, slots=True)
class KubeNames:
    """Resource names, label and annotation keys, the scheduler's name and the hints location:
    the shared ``names`` section of every component's configuration."""

    gpu: str = RESOURCE_GPU
    gpu_milli: str = RESOURCE_GPU_MILLI
    gpu_memory: str = RESOURCE_GPU_MEMORY_MIB
    gpu_memory_unit: str = "MiB"
    gpu_cores: str = RESOURCE_GPU_CORES_PERCENT
    device_plugin: str = "gpufrag"
    label_gpu_product: str = LABEL_GPU_PRODUCT
    label_gpu_memory: str = LABEL_GPU_MEMORY_MIB
    label_model: str = LABEL_MODEL
    label_model_version: str = LABEL_MODEL_VERSION
    label_delivery: str = LABEL_DELIVERY
    annotation_gpu_spec: str = ANNOTATION_GPU_SPEC
    annotation_gpu_indices: str = ANNOTATION_GPU_INDICES
    annotation_gpu_record: str = ANNOTATION_GPU_RECORD
    annotation_gpu_usage: str = ANNOTATION_GPU_USAGE
    annotation_defrag_movable: str = ANNOTATION_DEFRAG_MOVABLE
    annotation_defrag_state: str = ANNOTATION_DEFRAG_STATE
    annotation_rightsizing_mode: str = ANNOTATION_RIGHTSIZING_MODE
    annotation_gpu_recommendation: str = ANNOTATION_GPU_RECOMMENDATION
    annotation_rightsizing_change: str = ANNOTATION_RIGHTSIZING_CHANGE
    scheduler_name: str = SCHEDULER_NAME
    hints_namespace: str = HINTS_NAMESPACE
    hints_configmap: str = HINTS_CONFIGMAP
    record_key_secret: str = RECORD_KEY_SECRET
    record_keys_configmap: str = RECORD_KEYS_CONFIGMAP

    def problems(self) -> list[tuple[str, str]]:
        """(field, message) for every value the API server would refuse where it is used."""
        found = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            check = _OBJECT_NAME_CHECKS.get(f.name, qualified_name_problem)
            problem = check(value)
            if problem is not None:
                found.append((f.name, problem))
        return found


DEFAULT_NAMES = KubeNames()
NAME_FIELDS = tuple(f.name for f in dataclasses.fields(KubeNames))

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def qualified_name_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes qualified name (``[prefix/]name``, the form of label
    and annotation keys and extended resource names), or None.

    Checked here because the API server does not check it where the extender writes: a Binding's
    annotations are copied onto the pod unvalidated, and a bad key there would make every later
    update of that pod (the kubelet's status writes included) fail."""
    if not value:
        return "must not be empty"
    prefix, _, name = value.rpartition("/")
    if "/" in value and (not prefix or len(prefix) > 253
                         or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return (f"{value!r}: the prefix before '/' must be a DNS subdomain (lowercase "
                f"alphanumerics, '-' and '.', at most 253 characters)")
    if len(name) > 63 or not _NAME_PART.fullmatch(name):
        return (f"{value!r} is not a Kubernetes qualified name: the name part must be 1-63 "
                f"characters of A-Z, a-z, 0-9, '-', '_' and '.', starting and ending with a "
                f"letter or digit")
    return None


def _dns_label_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        return (f"{value!r} is not a namespace name: 1-63 lowercase alphanumerics or '-', "
                f"starting and ending with an alphanumeric")
    return None


def dns_subdomain_problem(value: str) -> str | None:
    """Why ``value`` is not a DNS subdomain (RFC 1123: a Node's or a ConfigMap's name), or
    None."""
    return _dns_subdomain_problem(value)


def _dns_subdomain_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
        return (f"{value!r} is not an object name: lowercase alphanumerics, '-' and '.', at "
                f"most 253 characters")
    return None


def _optional_name_problem(value: str) -> str | None:
    return None if value == "" else qualified_name_problem(value)


def _choice_problem(choices: tuple[str, ...]) -> Any:
    def check(value: str) -> str | None:
        return None if value in choices else f"{value!r}: must be one of {', '.join(choices)}"
    return check


_OBJECT_NAME_CHECKS = {
    "gpu_cores": _optional_name_problem,
    "gpu_memory_unit": _choice_problem(GPU_MEMORY_UNITS),
    "device_plugin": _choice_problem(DEVICE_PLUGINS),
    "hints_namespace": _dns_label_problem,
    "hints_configmap": _dns_subdomain_problem,
    "record_key_secret": _dns_subdomain_problem,
    "record_keys_configmap": _dns_subdomain_problem,
    "scheduler_name": _dns_subdomain_problem,
}


def names_from_mapping(data: Mapping[str, Any], *, base: KubeNames = DEFAULT_NAMES,
                       where: str = "names") -> KubeNames:
    """``base`` with the fields in ``data`` replaced, validated; a bad key or value raises
    :class:`BadInput` naming ``where.<field>``."""
    changes: dict[str, str] = {}
    for key, value in data.items():
        if key not in NAME_FIELDS:
            raise BadInput(f"unknown setting; known here: {', '.join(NAME_FIELDS)}",
                           field=f"{where}.{key}")
        if not isinstance(value, str):
            raise BadInput(f"expected a string, got {value!r}", field=f"{where}.{key}")
        changes[str(key)] = value
    names = dataclasses.replace(base, **changes)
    for name, problem in names.problems():
        raise BadInput(problem, field=f"{where}.{name}")
    return names


def names_from_environ(environ: Mapping[str, str] | None = None, *,
                       base: KubeNames = DEFAULT_NAMES) -> KubeNames:
    """``base`` remapped by the shared ``GPUFRAG_NAMES__<FIELD>`` variables (validated)."""
    env = os.environ if environ is None else environ
    data = {name[len(NAMES_ENV_PREFIX):].lower(): value for name, value in sorted(env.items())
            if name.startswith(NAMES_ENV_PREFIX)}
    try:
        return names_from_mapping(data, base=base)
    except BadInput as e:
        key = (e.field or "").removeprefix("names.")
        raise BadInput(e.detail, field=f"environment {NAMES_ENV_PREFIX}{key.upper()}") from None


# ----------------------------------------------------------------------------- placement hints


@dataclass(frozen=True, slots=True)
class PlacementHints:
    """Owner UID -> ((node, expires unix seconds), ...)."""

    by_owner: Mapping[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)

    def nodes_for(self, owner: str, now: float) -> frozenset[str]:
        """The nodes hinted for pods of ``owner`` that have not expired at ``now``."""
        if not owner:
            return frozenset()
        return frozenset(node for node, expires in self.by_owner.get(owner, ()) if expires > now)

    def __len__(self) -> int:
        return len(self.by_owner)


NO_HINTS = PlacementHints()


def encode_hint_entries(entries: Iterable[tuple[str, float]]) -> str:
    """One ConfigMap value: the JSON list the reader below parses back to ``entries``."""
    return orjson.dumps([{"node": n, "expires": round(float(e), 3)} for n, e in entries]).decode()


def _entries(text: str) -> list[tuple[str, float]]:
    value = orjson.loads(text)
    if isinstance(value, dict):  # one hint, as the per-workload annotation carries it
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"expected a JSON list of {{node, expires}}, got {type(value).__name__}")
    entries = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"item {i} is not an object")
        node, expires = item.get("node"), item.get("expires")
        if not isinstance(node, str) or not node:
            raise ValueError(f"item {i}: 'node' must be a non-empty string, got {node!r}")
        if isinstance(expires, bool) or not isinstance(expires, int | float):
            raise ValueError(f"item {i}: 'expires' must be unix seconds, got {expires!r}")
        entries.append((node, float(expires)))
    return entries


def hints_from_configmap(obj: Mapping[str, Any] | None) -> tuple[PlacementHints, list[str]]:
    """The hints in a ConfigMap (None = no ConfigMap = no hints) and a problem per bad entry."""
    if obj is None:
        return NO_HINTS, []
    data = obj.get("data") or {}
    if not isinstance(data, Mapping):
        return NO_HINTS, [f"data is {type(data).__name__}, not a mapping"]
    hints: dict[str, tuple[tuple[str, float], ...]] = {}
    problems: list[str] = []
    for owner, text in data.items():
        try:
            if not isinstance(text, str):
                raise ValueError(f"value is {type(text).__name__}, not a string")
            hints[str(owner)] = tuple(_entries(text))
        except (ValueError, orjson.JSONDecodeError) as e:
            problems.append(f"hint for owner {owner}: {e}")
    return PlacementHints(hints), problems
