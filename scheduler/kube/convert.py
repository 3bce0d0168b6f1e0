"""Kubernetes Node and Pod objects (as JSON dicts) -> core types.

Pure functions over the API's JSON shape (what the watch, the extender wire and snapshot files
all carry), so the extender, the defrag controller and ``export-snapshot`` read objects the same
way. Quantities follow Kubernetes' rules: a pod's effective request is the larger of the sum of
its containers and any single init container, plus its overhead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from gpufrag.conventions import (
    DEFAULT_NAMES,
    LABEL_GPU_COUNT,
    RESOURCE_GPU_MEMORY_MIB,
    RESOURCE_MIG_PREFIX,
    KubeNames,
)
from gpufrag.errors import BadInput
from scheduler.core.mig import is_profile_name
from scheduler.core.types import MAX_GPUS_PER_NODE, MILLI_PER_GPU, NodeSpec, PodRequest
from scheduler.kube.quantity import QuantityError, parse_quantity

Obj = Mapping[str, Any]
_MIB = Decimal(1024 * 1024)
# NVIDIA's device plugin with the ``mixed`` MIG strategy advertises each GPU instance profile
# as its own resource, nvidia.com/mig-<profile> (nvidia.com/mig-3g.40gb), and GPU feature
# discovery says which strategy a node runs (nvidia.com/mig.strategy: none, single, mixed).
MIG_RESOURCE_PREFIX = RESOURCE_MIG_PREFIX  # the device plugin's, in gpufrag.conventions
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_STRATEGY_MIXED = "mixed"


def _quantity(value: object, path: str) -> Decimal:
    try:
        q = parse_quantity(value)
    except QuantityError as e:
        raise BadInput(str(e), field=path) from None
    if q < 0:
        raise BadInput(f"{value!r} is negative", field=path)
    return q


def _mapping(obj: Obj, key: str, path: str) -> Mapping[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadInput(f"expected an object, got {type(value).__name__}", field=f"{path}.{key}")
    return value


def _list(obj: Obj, key: str, path: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadInput(f"expected a list, got {type(value).__name__}", field=f"{path}.{key}")
    return value


def _name(obj: Obj, kind: str) -> tuple[str, str]:
    meta = _mapping(obj, "metadata", kind)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise BadInput(f"{kind} without metadata.name", field="metadata.name")
    namespace = meta.get("namespace") or ""
    if not isinstance(namespace, str):
        raise BadInput("expected a string", field="metadata.namespace")
    return name, namespace


def labels_of(obj: Obj) -> dict[str, str]:
    return {str(k): str(v) for k, v in _mapping(_mapping(obj, "metadata", ""), "labels", "metadata")
            .items()}


def annotations_of(obj: Obj) -> dict[str, str]:
    meta = _mapping(obj, "metadata", "")
    return {str(k): str(v) for k, v in _mapping(meta, "annotations", "metadata").items()}


def node_from_k8s(obj: Obj, names: KubeNames = DEFAULT_NAMES) -> NodeSpec:
    """A Node's allocatable resources and GPU identity."""
    name, _ = _name(obj, "Node")
    status = _mapping(obj, "status", "node")
    alloc = _mapping(status, "allocatable", "status")
    path = "status.allocatable"
    cpu = _quantity(alloc.get("cpu", "0"), f"{path}.cpu")
    memory = _quantity(alloc.get("memory", "0"), f"{path}.memory")
    gpus = _quantity(alloc.get(names.gpu, "0"), f"{path}.{names.gpu}")
    if gpus != gpus.to_integral_value() or gpus > MAX_GPUS_PER_NODE:
        raise BadInput(f"{gpus} GPUs is not a whole number in 0..{MAX_GPUS_PER_NODE}",
                       field=f"{path}.{names.gpu}")
    labels = labels_of(obj)
    if labels.get(LABEL_MIG_STRATEGY) == "single" and names.gpu == "nvidia.com/gpu":
        # The ``single`` strategy advertises MIG instances as nvidia.com/gpu: none of them is
        # a whole GPU, so gpufrag places no whole-GPU or share pod on them. (``mixed``
        # advertises only the GPUs not in MIG mode as nvidia.com/gpu; their MIG GPUs are
        # nvidia.com/mig-<profile>, read by scheduler.kube.mignodes.)
        gpus = Decimal(0)
    gpu = gpu_labels(labels, names)
    return NodeSpec(
        name=name,
        cpu_milli=int(cpu * 1000),
        memory_mib=int(memory / _MIB),
        gpu_count=int(gpus),
        gpu_product=gpu.product if gpus else "",
        gpu_memory_mib=gpu.memory_mib,
        labels=labels,
    )


@dataclass(frozen=True, slots=True)
class GpuLabels:
    """What GPU feature discovery says of a node's GPUs: product, memory per GPU (MiB) and
    how many; '' and 0 where a label is absent or not a whole number."""

    product: str
    memory_mib: int
    count: int


def gpu_labels(labels: Mapping[str, str], names: KubeNames = DEFAULT_NAMES) -> GpuLabels:
    """A node's GPU labels (:class:`GpuLabels`), read the one way every component reads them."""
    memory = labels.get(names.label_gpu_memory, "")
    count = labels.get(LABEL_GPU_COUNT, "")
    return GpuLabels(labels.get(names.label_gpu_product, ""),
                     int(memory) if memory.isdigit() else 0,
                     int(count) if count.isdigit() else 0)


def _requests(container: Obj, path: str) -> Mapping[str, Any]:
    resources = _mapping(container, "resources", path)
    requests = _mapping(resources, "requests", f"{path}.resources")
    # Extended resources may be given as limits only; Kubernetes then defaults requests to them.
    limits = _mapping(resources, "limits", f"{path}.resources")
    return {**limits, **requests}


def _container_requests(spec: Obj, key: str,
                        resource_names: tuple[str, ...]) -> Iterator[dict[str, Decimal]]:
    """Each container's requests (of ``spec[key]``) for the named resources, parsed."""
    for i, c in enumerate(_list(spec, key, "spec")):
        path = f"spec.{key}[{i}]"
        if not isinstance(c, Mapping):
            raise BadInput("expected an object", field=path)
        req = _requests(c, path)
        yield {r: _quantity(req[r], f"{path}.resources.requests.{r}")
               for r in resource_names if r in req}


def effective_requests(obj: Obj, resource_names: tuple[str, ...]) -> dict[str, Decimal]:
    """Per resource: max(sum of containers, largest init container) + pod overhead."""
    spec = _mapping(obj, "spec", "pod")
    totals = dict.fromkeys(resource_names, Decimal(0))
    for requests in _container_requests(spec, "containers", resource_names):
        for r, quantity in requests.items():
            totals[r] += quantity
    for requests in _container_requests(spec, "initContainers", resource_names):
        for r, quantity in requests.items():
            totals[r] = max(totals[r], quantity)
    overhead = _mapping(spec, "overhead", "spec")
    for r in resource_names:
        if r in overhead:
            totals[r] += _quantity(overhead[r], f"spec.overhead.{r}")
    return totals


class UnsupportedRequest(BadInput):
    """A pod asks for something the extender cannot place (a GPU-like resource the
    configuration does not map, a share of several GPUs): a reason to fail every node with,
    not a malformed request."""


# GPU-like extended resources: name part starting gpu / vgpu / mig- (nvidia.com/mig-1g.5gb,
# amd.com/gpu, nvidia.com/gpumem-percentage, aliyun.com/gpu-count, ...).
_GPU_LIKE = re.compile(r"(gpu|vgpu|mig-)", re.IGNORECASE)
_MIB_PER_GIB = 1024
_BYTES_PER_MIB = 1024 * 1024
# MiB in one unit of the GPU-memory resource (names.gpu_memory_unit): its quantities are counted
# in MiB (gpufrag, HAMi), GiB (gpushare) or bytes (Koordinator's koordinator.sh/gpu-memory,
# where "8Gi" is 8 GiB).
_MIB_PER_UNIT = {"MiB": Decimal(1), "GiB": Decimal(_MIB_PER_GIB),
                 "bytes": Decimal(1) / Decimal(_BYTES_PER_MIB)}


def memory_mib(amount: Decimal, unit: str) -> int:
    """A GPU-memory quantity in ``unit`` (``names.gpu_memory_unit``) as whole MiB, rounded up."""
    return math.ceil(amount * _MIB_PER_UNIT[unit])


def memory_quantity(mib: int, unit: str) -> str:
    """``mib`` MiB as a quantity of the GPU-memory resource in ``unit`` (rounded up)."""
    if unit == "bytes":
        return f"{mib}Mi"
    return str(math.ceil(Decimal(mib) / _MIB_PER_UNIT[unit]))
_PERCENT = Decimal(100)


def _gpu_like(resource: str) -> bool:
    prefix, _, name = resource.rpartition("/")
    return bool(prefix) and bool(_GPU_LIKE.match(name))


def _requested_names(obj: Obj) -> set[str]:
    """Every resource name any container, init container or the overhead names."""
    spec = _mapping(obj, "spec", "pod")
    found: set[str] = set()
    for key in ("containers", "initContainers"):
        for c in _list(spec, key, "spec"):
            if isinstance(c, Mapping):
                found.update(str(r) for r in _requests(c, f"spec.{key}"))
    found.update(str(r) for r in _mapping(spec, "overhead", "spec"))
    return found


def share_resources(names: KubeNames) -> tuple[str, ...]:
    """The resource names the configuration maps to GPUs: whole GPUs, milli-GPU, GPU memory
    and (when mapped) GPU cores in percent."""
    return tuple(r for r in (names.gpu, names.gpu_milli, names.gpu_memory, names.gpu_cores) if r)


@dataclass(frozen=True, slots=True)
class ContainerGpus:
    """One container's GPU request under the mapped names (HAMi's are per container:
    ``nvidia.com/gpu`` devices, each with ``nvidia.com/gpumem`` MiB and ``nvidia.com/gpucores``
    percent)."""

    name: str
    count: int  # whole devices (names.gpu)
    memory_mib: int  # names.gpu_memory, in MiB
    cores_percent: int  # names.gpu_cores
    milli: int  # names.gpu_milli

    @property
    def is_share(self) -> bool:
        return bool(self.memory_mib or self.cores_percent
                    or (self.milli and self.milli % MILLI_PER_GPU))

    @property
    def asks_gpu(self) -> bool:
        return bool(self.count or self.memory_mib or self.cores_percent or self.milli)


def container_gpus(obj: Obj, names: KubeNames = DEFAULT_NAMES,
                   key: str = "containers") -> tuple[ContainerGpus, ...]:
    """Each container of ``spec[key]`` (app containers by default) with its GPU request, in
    order; containers asking no GPU are included (with zeros), as HAMi counts them."""
    spec = _mapping(obj, "spec", "pod")
    found = []
    for i, c in enumerate(_list(spec, key, "spec")):
        if not isinstance(c, Mapping):
            raise BadInput("expected an object", field=f"spec.{key}[{i}]")
        path = f"spec.{key}[{i}]"
        req = _requests(c, path)
        found.append(ContainerGpus(
            str(c.get("name") or f"{key}[{i}]"), int(_amount(req, names.gpu, path)),
            memory_mib(_amount(req, names.gpu_memory, path), names.gpu_memory_unit),
            math.ceil(_amount(req, names.gpu_cores, path)),
            math.ceil(_amount(req, names.gpu_milli, path))))
    return tuple(found)


def container_mig_asks(obj: Obj, key: str = "containers") -> tuple[dict[str, Decimal], ...]:
    """Each container of ``spec[key]`` with its asks of the device plugin's MIG resources,
    by resource name, in order: every ``nvidia.com/mig-*`` name, whether or not it reads as a
    profile of the table (:func:`mig_profile_of` judges that), so a caller may refuse the
    others by name rather than pass them over."""
    spec = _mapping(obj, "spec", "pod")
    wanted = tuple(sorted(r for r in _requested_names(obj) if r.startswith(MIG_RESOURCE_PREFIX)))
    return tuple(_container_requests(spec, key, wanted))


def _amount(requests: Mapping[str, Any], resource: str, path: str) -> Decimal:
    """One container's request of ``resource`` (0 when absent or the name is not mapped)."""
    if not resource or resource not in requests:
        return Decimal(0)
    return _quantity(requests[resource], f"{path}.resources.requests.{resource}")


def _check_share_containers(obj: Obj, names: KubeNames) -> None:
    """A pod asking GPU memory or cores is one share of one GPU: every container that asks a
    share asks at most one device (HAMi: ``nvidia.com/gpu: 1`` per container), and no container
    asks whole GPUs beside them. The share is then the containers' sum (effective_requests)."""
    shares: list[str] = []
    wholes: list[str] = []
    for key in ("initContainers", "containers"):
        for i, c in enumerate(container_gpus(obj, names, key)):
            if c.is_share and c.count > 1:
                share = names.gpu_memory if c.memory_mib else names.gpu_cores
                raise UnsupportedRequest(
                    f"container {c.name!r} asks for {c.count} GPUs with a share of each "
                    f"({share}); the gpufrag extender places a pod's shares on one GPU only: "
                    f"ask for {names.gpu}: 1 in each container, or for whole GPUs without a "
                    "share", field=f"spec.{key}[{i}].resources.limits.{names.gpu}")
            if c.is_share:
                shares.append(c.name)
            elif c.count:
                wholes.append(c.name)
    if wholes:
        raise UnsupportedRequest(
            f"containers {', '.join(wholes)} ask for whole GPUs ({names.gpu} without a share) "
            f"and {', '.join(shares)} for shares of a GPU; the gpufrag extender places a pod "
            "either on whole GPUs or as one share of one GPU: give every container a share, "
            "or none", field=f"requests.{names.gpu}")


def uncarried(obj: Obj, names: KubeNames = DEFAULT_NAMES) -> list[tuple[str, int, str]]:
    """The containers that would start without their GPU, as (``containers`` or
    ``initContainers``, index, name): each asks gpufrag's own GPU-memory resource
    (``gpufrag.io/gpu-memory-mib``) and no resource a device plugin hands GPUs for. The kubelet
    drops a resource no device plugin advertises and calls no plugin for that container.
    Other vendors' memory resources (gpushare, Koordinator) come with their own device plugins
    and are not judged here."""
    if names.gpu_memory != RESOURCE_GPU_MEMORY_MIB:
        return []
    return [(key, i, c.name) for key in ("initContainers", "containers")
            for i, c in enumerate(container_gpus(obj, names, key))
            if c.memory_mib and not (c.count or c.milli)]


def device_gap(obj: Obj, names: KubeNames = DEFAULT_NAMES) -> str | None:
    """Why a pending pod would start without its GPU (:func:`uncarried`), or None. Asked of
    pods being placed only, never of pods already running (their GPU use must still count)."""
    found = uncarried(obj, names)
    if not found:
        return None
    return (f"container {found[0][2]!r} asks {names.gpu_memory} without {names.gpu_milli} or "
            f"{names.gpu}: no device plugin hands a GPU for memory alone, so it would start "
            f"without one; add {names.gpu_milli}: 1 (or its compute share) beside it, as the "
            "admission webhook does")


def mig_profile_of(resource: str) -> str | None:
    """The profile of a MIG resource (``nvidia.com/mig-3g.40gb`` -> ``3g.40gb``), or None for
    any other name (``nvidia.com/mig-1g.10gb+me``, a media variant, is not modelled)."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    profile = resource[len(MIG_RESOURCE_PREFIX):]
    return profile if is_profile_name(profile) else None


def advertised_count(value: object) -> int:
    """An allocatable count as the kubelet advertises it: a whole number above 0, else 0 (a
    count that does not read as one is not advertised)."""
    try:
        amount = parse_quantity(value)
    except QuantityError:
        return 0
    return int(amount) if amount > 0 and amount == amount.to_integral_value() else 0


def mig_offers(obj: Obj) -> dict[str, int]:
    """The MIG instances a Node advertises, by profile: each allocatable
    ``nvidia.com/mig-<profile>`` with a count (:func:`advertised_count`). What the extender's
    MIG book and the defrag controller's MIG step both take as the node's instances."""
    status = obj.get("status")
    alloc = status.get("allocatable") if isinstance(status, Mapping) else None
    offers: dict[str, int] = {}
    for resource, value in (alloc.items() if isinstance(alloc, Mapping) else ()):
        profile = mig_profile_of(str(resource))
        count = advertised_count(value) if profile else 0
        if profile and count:
            offers[profile] = count
    return offers


def mig_request(obj: Obj) -> dict[str, int]:
    """The MIG instances a pod asks, by profile (``{"1g.10gb": 2}``): each
    ``nvidia.com/mig-<profile>`` request as Kubernetes counts it (containers summed, the
    largest init container if more, plus overhead). Empty for a pod asking none; BadInput for
    a count that is not a whole number."""
    wanted = tuple(sorted(r for r in _requested_names(obj) if mig_profile_of(r)))
    if not wanted:
        return {}
    found: dict[str, int] = {}
    for resource, amount in effective_requests(obj, wanted).items():
        if amount != amount.to_integral_value():
            raise BadInput(f"{amount} is not a whole number of MIG instances",
                           field=f"requests.{resource}")
        if amount:
            found[resource[len(MIG_RESOURCE_PREFIX):]] = int(amount)
    return found


def pod_from_k8s(obj: Obj, names: KubeNames = DEFAULT_NAMES) -> PodRequest:
    """What a Pod asks for. Whole GPUs come from ``names.gpu``; a share of one GPU from
    ``names.gpu_milli`` (milli-GPU; 1000 or more means whole GPUs), from ``names.gpu_memory``
    (GPU memory in ``names.gpu_memory_unit``, converted per node) and from ``names.gpu_cores``
    (percent of one GPU's compute, HAMi's ``nvidia.com/gpucores``). Memory and cores may come
    with ``names.gpu: 1`` (HAMi) or alone (gpushare). A GPU-like resource the configuration
    does not map raises :class:`UnsupportedRequest` rather than being taken for a CPU pod.

    A pod asking MIG profiles (``nvidia.com/mig-<profile>``, :func:`mig_request`) reads as its
    CPU and memory only (``num_gpu`` 0): its instances are judged by
    :mod:`scheduler.kube.mignodes`, never as GPUs of the ``ClusterState``. Asking a profile
    beside whole GPUs or shares is refused (:class:`UnsupportedRequest`)."""
    name, namespace = _name(obj, "Pod")
    mapped = share_resources(names)
    requested = _requested_names(obj)
    unknown = sorted(r for r in requested
                     if _gpu_like(r) and r not in mapped and not mig_profile_of(r))
    if unknown:
        raise UnsupportedRequest(
            f"asks for {', '.join(unknown)}, a GPU resource the gpufrag extender is not "
            f"configured for (it maps {', '.join(mapped)} and {MIG_RESOURCE_PREFIX}<profile>); "
            "other names are mapped with names.gpu, names.gpu_milli, names.gpu_memory or "
            "names.gpu_cores", field=f"requests.{unknown[0]}")
    req = effective_requests(obj, ("cpu", "memory", *mapped))
    mig = sorted(r for r in requested if mig_profile_of(r))
    if mig and any(req[r] for r in mapped):
        others = ", ".join(r for r in mapped if req[r])
        raise UnsupportedRequest(
            f"asks for {', '.join(mig)} and {others}: a pod gets either MIG instances or whole "
            "GPUs / shares of a GPU, not both (a MIG GPU hands out only its instances); ask "
            "for one kind", field=f"requests.{mig[0]}")
    whole = req[names.gpu]
    milli = req[names.gpu_milli]
    memory = req.get(names.gpu_memory, Decimal(0))
    cores = req.get(names.gpu_cores, Decimal(0)) if names.gpu_cores else Decimal(0)
    if whole != whole.to_integral_value():
        raise BadInput(f"{whole} is not a whole number of GPUs", field=f"requests.{names.gpu}")
    num_gpu, gpu_milli, gpu_memory_mib = int(whole), MILLI_PER_GPU if whole else 0, 0
    if milli and whole:
        raise BadInput(f"asks for both {names.gpu} and {names.gpu_milli}; use one",
                       field=f"requests.{names.gpu_milli}")
    if milli and cores:
        raise BadInput(f"asks for both {names.gpu_milli} and {names.gpu_cores}; use one",
                       field=f"requests.{names.gpu_milli}")
    if milli and memory and milli >= MILLI_PER_GPU:
        raise BadInput(f"{milli} milli-GPU with {names.gpu_memory}: a memory share is a share "
                       f"of one GPU, so its {names.gpu_milli} must be below 1000",
                       field=f"requests.{names.gpu_milli}")
    if milli:
        # With a memory ask, milli is the share's compute and the device plugin's resource
        # (the kubelet hands a GPU only for a resource a device plugin advertises).
        gpu_memory_mib = memory_mib(memory, names.gpu_memory_unit)
        if milli < MILLI_PER_GPU:
            num_gpu, gpu_milli = 1, math.ceil(milli)
        elif milli % MILLI_PER_GPU == 0:
            num_gpu, gpu_milli = int(milli) // MILLI_PER_GPU, MILLI_PER_GPU
        else:
            raise BadInput(f"{milli} milli-GPU: shares must be below 1000 or whole GPUs",
                           field=f"requests.{names.gpu_milli}")
    elif memory or cores:
        _check_share_containers(obj, names)
        if cores > _PERCENT:
            raise BadInput(f"{cores}% of a GPU's compute: at most 100",
                           field=f"requests.{names.gpu_cores}")
        num_gpu, gpu_milli = 1, math.ceil(cores * MILLI_PER_GPU / _PERCENT)
        gpu_memory_mib = memory_mib(memory, names.gpu_memory_unit)
    if num_gpu > MAX_GPUS_PER_NODE:
        raise BadInput(f"{num_gpu} GPUs is more than any node has", field=f"requests.{names.gpu}")
    annotations = annotations_of(obj)
    labels = labels_of(obj)
    spec_text = annotations.get(names.annotation_gpu_spec, "")
    return PodRequest(
        name=name,
        namespace=namespace,
        cpu_milli=math.ceil(req["cpu"] * 1000),
        memory_mib=math.ceil(req["memory"] / _MIB),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        gpu_memory_mib=gpu_memory_mib,
        gpu_spec=frozenset(s.strip() for s in spec_text.split("|") if s.strip()) if num_gpu
        else frozenset(),
        model=labels.get(names.label_model, ""),
        model_version=labels.get(names.label_model_version, ""),
    )


def milli_memory_mib(milli: int, gpu_memory_total_mib: int) -> int:
    """The GPU memory a share of ``milli`` milli-GPU stands for on a GPU of
    ``gpu_memory_total_mib`` (floored): what the device plugin hands a share container as its
    memory limit and what the node agent holds the pod's measured memory against."""
    return gpu_memory_total_mib * milli // MILLI_PER_GPU


def share_memory_mib(pod: PodRequest, gpu_memory_total_mib: int) -> int | None:
    """The GPU memory ``pod`` may use on its one GPU (of ``gpu_memory_total_mib``): the memory
    it asks for (``names.gpu_memory``), else its milli share of the GPU's memory; None for a
    pod that is not a share (whole GPUs, or no GPU), which has no limit below the GPU's own."""
    if pod.gpu_memory_mib:
        return pod.gpu_memory_mib
    if not pod.is_share:
        return None
    return milli_memory_mib(pod.gpu_milli, gpu_memory_total_mib)


def bound_gpus(obj: Obj, names: KubeNames = DEFAULT_NAMES) -> tuple[int, ...] | None:
    """The GPU indices recorded on a pod at bind (None when absent or malformed)."""
    text = annotations_of(obj).get(names.annotation_gpu_indices)
    if not text:
        return None
    try:
        gpus = tuple(int(t) for t in text.split(","))
    except ValueError:
        return None
    return gpus if all(g >= 0 for g in gpus) else None


def node_name_of(obj: Obj) -> str:
    value = _mapping(obj, "spec", "pod").get("nodeName") or ""
    return str(value)


def controller_ref(obj: Obj) -> tuple[str, str, str]:
    """(kind, uid, name) of the pod's controlling owner (ReplicaSet, StatefulSet, Job, ...);
    empty strings for a bare pod. Affinity and hints key on the UID; the defrag planner also
    needs the kind (a DaemonSet pod never moves) and the name (for its plan table)."""
    for ref in _list(_mapping(obj, "metadata", ""), "ownerReferences", "metadata"):
        if isinstance(ref, Mapping) and ref.get("controller"):
            return (str(ref.get("kind") or ""), str(ref.get("uid") or ""),
                    str(ref.get("name") or ""))
    return "", "", ""


def owner_uid(obj: Obj) -> str:
    """The UID of the pod's controlling owner, or ''."""
    return controller_ref(obj)[1]


def is_terminal(obj: Obj) -> bool:
    """Succeeded/Failed pods hold no resources."""
    return _mapping(obj, "status", "pod").get("phase") in {"Succeeded", "Failed"}


def key_of(obj: Obj) -> str:
    """``namespace/name`` (the key ``ClusterState`` and the bind request use for a pod)."""
    name, namespace = _name(obj, "object")
    return f"{namespace}/{name}" if namespace else name


def uid_of(obj: Obj) -> str:
    return str(_mapping(obj, "metadata", "").get("uid") or "")


def is_deleting(obj: Obj) -> bool:
    """A deletionTimestamp is set: the object is on its way out (it still holds resources)."""
    return bool(_mapping(obj, "metadata", "").get("deletionTimestamp"))


# -------------------------------------------------------------------- core types -> Kubernetes
# The inverse direction, for snapshot files built from traces or synthetic clusters (demos,
# benchmarks, tests). ``node_from_k8s(node_to_k8s(n))`` and ``pod_from_k8s(pod_to_k8s(p))`` give
# back what went in (node labels gain the GPU feature labels; a pod without a namespace lands
# in "default").


def node_to_k8s(spec: NodeSpec, names: KubeNames = DEFAULT_NAMES) -> dict[str, Any]:
    """A v1 Node (JSON shape) with ``spec``'s allocatable resources and GPU labels."""
    labels = {"kubernetes.io/hostname": spec.name, **spec.labels}
    allocatable = {"cpu": f"{spec.cpu_milli}m", "memory": f"{spec.memory_mib}Mi", "pods": "110"}
    if spec.gpu_count:
        allocatable[names.gpu] = str(spec.gpu_count)
        allocatable[names.gpu_milli] = str(spec.gpu_count * MILLI_PER_GPU)
        if spec.gpu_product:
            labels[names.label_gpu_product] = spec.gpu_product
        if spec.gpu_memory_mib:
            labels[names.label_gpu_memory] = str(spec.gpu_memory_mib)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": spec.name, "labels": labels},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable}}


def pod_to_k8s(pod: PodRequest, names: KubeNames = DEFAULT_NAMES, *, node: str = "",
               gpus: tuple[int, ...] | None = None, uid: str = "", owner: str = "",
               scheduler_name: str = "") -> dict[str, Any]:
    """A v1 Pod (JSON shape) asking for what ``pod`` asks; bound to ``node`` when given, with
    the GPU indices annotation when ``gpus`` is given and ``owner`` as its controlling owner."""
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    if pod.gpu_memory_mib:
        requests[names.gpu] = "1"
        requests[names.gpu_memory] = memory_quantity(pod.gpu_memory_mib, names.gpu_memory_unit)
        if pod.gpu_milli and names.gpu_cores:
            requests[names.gpu_cores] = str(math.ceil(pod.gpu_milli / 10))
    elif pod.is_share:
        requests[names.gpu_milli] = str(pod.gpu_milli)
    elif pod.wants_gpu:
        requests[names.gpu] = str(pod.num_gpu)
    meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace or "default"}
    if uid:
        meta["uid"] = uid
    labels = {}
    if pod.model:
        labels[names.label_model] = pod.model
        labels[names.label_model_version] = pod.model_version
    if labels:
        meta["labels"] = labels
    annotations = {}
    if pod.gpu_spec:
        annotations[names.annotation_gpu_spec] = "|".join(sorted(pod.gpu_spec))
    if gpus is not None:
        annotations[names.annotation_gpu_indices] = ",".join(str(g) for g in gpus)
    if annotations:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                    "name": f"owner-{owner[:8]}", "uid": owner,
                                    "controller": True}]
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "main",
                                            "resources": {"requests": requests}}]}
    if node:
        spec["nodeName"] = node
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}


# ------------------------------------------------------------- annotations for device plugins
# What a bind writes besides ``names.annotation_gpu_indices`` when another project's device
# plugin runs on the nodes (``names.device_plugin``), so that plugin hands the container the
# GPU gpufrag chose. The keys are the ones those projects document (upstream sources could not
# be downloaded here; see docs/extender.md, "Interop with HAMi and gpushare").

# Aliyun gpushare (gpushare-scheduler-extender pkg/utils/const.go, read by
# gpushare-device-plugin pkg/gpu/nvidia/const.go and podmanager.go).
GPUSHARE_IDX = "ALIYUN_COM_GPU_MEM_IDX"
GPUSHARE_POD = "ALIYUN_COM_GPU_MEM_POD"
GPUSHARE_DEV = "ALIYUN_COM_GPU_MEM_DEV"
GPUSHARE_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
GPUSHARE_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
# HAMi (pkg/util/types.go, pkg/device/nvidia/device.go).
HAMI_NODE = "hami.io/vgpu-node"
HAMI_TIME = "hami.io/vgpu-time"
HAMI_BIND_PHASE = "hami.io/bind-phase"
HAMI_BIND_TIME = "hami.io/bind-time"
HAMI_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_NODE_REGISTER = "hami.io/node-nvidia-register"
HAMI_DEVICE_TYPE = "NVIDIA"


def hami_gpu_uuids(node: Obj) -> dict[int, str]:
    """GPU index -> UUID from the HAMi device plugin's registration annotation on a Node:
    the JSON list of newer releases (``[{"id": "GPU-..", "index": 0, ...}]``) or the older
    ``uuid,count,devmem,devcore,type,numa,health:`` records, in index order."""
    text = annotations_of(node).get(HAMI_NODE_REGISTER, "").strip()
    if not text:
        return {}
    if text.startswith("["):
        try:
            items = orjson.loads(text)
        except orjson.JSONDecodeError:
            return {}
        found = {}
        for i, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, Mapping) and isinstance(item.get("id"), str):
                index = item.get("index", i)
                found[int(index) if isinstance(index, int) else i] = item["id"]
        return found
    records = [r for r in text.split(":") if r.strip()]
    return {i: r.split(",")[0].strip() for i, r in enumerate(records)}


def _hami_device(uuid: str, memory_mib: int, cores_percent: int) -> str:
    return f"{uuid},{HAMI_DEVICE_TYPE},{memory_mib},{cores_percent}:"


def _hami_pod_devices(names: KubeNames, pod: PodRequest, uuids: tuple[str, ...],
                      gpu_memory_mib: int, pod_obj: Obj | None) -> str:
    """HAMi's ``vgpu-devices-*`` value: one ``;``-terminated segment per app container, in
    order (empty for a container without GPUs), each holding ``UUID,NVIDIA,MiB,cores:`` per
    device (HAMi ``EncodePodSingleDevice``; its device plugin decodes the segments in order,
    skipping empty ones, and hands each container its own). A share pod's containers all get
    its one GPU, each with its own memory and cores; a whole-GPU pod's containers get
    consecutive slices of its GPUs, as many as each asks."""
    milli = pod.milli_on(gpu_memory_mib) or MILLI_PER_GPU
    memory = pod.gpu_memory_mib or milli_memory_mib(milli, gpu_memory_mib)
    cores = math.ceil(pod.gpu_milli / 10)
    whole_pod = "".join(_hami_device(u, memory, cores) for u in uuids) + ";"
    containers = container_gpus(pod_obj, names) if pod_obj is not None else ()
    if not any(c.asks_gpu for c in containers):
        return whole_pod  # no app container asks (init containers only): one segment
    segments = []
    if pod.is_share or pod.gpu_memory_mib:
        for c in containers:
            if not c.asks_gpu:
                segments.append("")
                continue
            c_milli = c.milli or math.ceil(c.cores_percent * MILLI_PER_GPU / 100)
            c_memory = c.memory_mib or milli_memory_mib(c_milli, gpu_memory_mib)
            c_cores = c.cores_percent or math.ceil(c.milli / 10)
            segments.append(_hami_device(uuids[0], c_memory, c_cores))
    else:
        start = 0
        for c in containers:
            width = c.count or c.milli // MILLI_PER_GPU
            segments.append("".join(_hami_device(u, memory, cores)
                                    for u in uuids[start:start + width]))
            start += width
    return "".join(f"{segment};" for segment in segments)


def device_plugin_annotations(names: KubeNames, pod: PodRequest, gpus: tuple[int, ...], *,
                              node: str, gpu_memory_mib: int, node_obj: Obj | None,
                              now_ns: int, pod_obj: Obj | None = None) -> dict[str, str]:
    """The annotations ``names.device_plugin``'s device plugin reads for a pod bound to
    ``node`` on ``gpus`` (empty for gpufrag's own). ``pod_obj`` (the Pod) lets HAMi's be
    written per container; without it the pod's GPUs go to one container. Raises
    :class:`UnsupportedRequest` when they cannot be written (HAMi: the node does not say its
    GPUs' UUIDs)."""
    if names.device_plugin == "gpushare":
        if not pod.gpu_memory_mib or len(gpus) != 1:
            return {}  # whole GPUs: NVIDIA's own device plugin, no annotation
        gib = _MIB_PER_GIB if names.gpu_memory_unit == "GiB" else 1
        return {GPUSHARE_IDX: str(gpus[0]),
                GPUSHARE_POD: str(math.ceil(pod.gpu_memory_mib / gib)),
                GPUSHARE_DEV: str(gpu_memory_mib // gib),
                GPUSHARE_ASSIGNED: "false",
                GPUSHARE_ASSUME_TIME: str(now_ns)}
    if names.device_plugin == "hami":
        if not gpus:
            return {}
        uuids = hami_gpu_uuids(node_obj or {})
        missing = [g for g in gpus if g not in uuids]
        if missing:
            raise UnsupportedRequest(
                f"node {node} does not list the UUID of GPU {missing[0]} in its "
                f"{HAMI_NODE_REGISTER} annotation, which HAMi's device plugin needs to hand "
                "the container that GPU (is HAMi's device plugin running there?)",
                field=f"metadata.annotations.{HAMI_NODE_REGISTER}")
        encoded = _hami_pod_devices(names, pod, tuple(uuids[g] for g in gpus),
                                    gpu_memory_mib, pod_obj)
        seconds = str(now_ns // 1_000_000_000)
        return {HAMI_NODE: node, HAMI_TIME: seconds, HAMI_BIND_TIME: seconds,
                HAMI_BIND_PHASE: "allocating", HAMI_TO_ALLOCATE: encoded,
                HAMI_ALLOCATED: encoded}
    return {}
