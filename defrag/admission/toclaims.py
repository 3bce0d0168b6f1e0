"""A pod's GPU asks turned into ResourceClaims (pure: a pod -> a JSON patch and templates).

On a node served by the DRA driver no device plugin advertises ``gpufrag.io/gpu-milli``,
``gpufrag.io/gpu-memory-mib`` or ``nvidia.com/gpu``, so a pod asking for them would stay
pending there. Whole GPUs could come through an extended resource a DeviceClass maps
(KEP-5004), shares cannot: an extended resource counts devices. So, for pods of namespaces
that opted in to DRA delivery (docs/dra.md, "Unchanged pod specs"), the webhook rewrites each
container's GPU ask into a claim made from a ResourceClaimTemplate of that shape:

- a share (``names.gpu_milli`` below a whole GPU, or any ``names.gpu_memory``): one device of
  the driver's class with ``capacity.requests`` ``milli`` (the compute share; 1 for a memory
  ask that comes alone, the carrier the device-plugin path uses too) and ``memory`` (the
  memory share, in ``Mi``), the shape docs/dra.md and the e2e templates write;
- whole GPUs (``names.gpu``, or ``names.gpu_milli`` in whole thousands): ``count`` devices
  naming no capacity, which take all of each;
- MIG partitions (``nvidia.com/mig-<profile>: N``, the device plugin's ``mixed`` resources):
  ``count`` N devices of the profile's own class (``mig-<profile>.gpu.gpufrag.io``), which
  selects the driver's partitions of that profile. A name the MIG table lacks, several
  profiles in one container, or a MIG ask beside a GPU ask in one container is refused.

The ask is removed from the container's requests and limits, the pod gets one
``spec.resourceClaims`` entry per converted container (``resourceClaimTemplateName``) and the
container names it in ``resources.claims``. The template's name is derived from its spec
(``gpufrag-250m-<hash>``, ``gpufrag-300m-10240mi-<hash>``, ``gpufrag-2gpu-<hash>``,
``gpufrag-1mig-3g-40gb-<hash>``): the same
shape always has the same name, in every namespace, so :func:`same_spec` can tell a template
someone else made under that name (one that would steer these pods' asks) from ours.

An ask the driver cannot serve is :class:`BadInput` naming the container and the resource:
the webhook refuses the pod with it rather than admit a pod that would never run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from scheduler.core.mig import all_profile_names, most_per_gpu
from scheduler.core.types import MAX_GPUS_PER_NODE, MILLI_PER_GPU
from scheduler.kube.claims import CAPACITY_MEMORY, CAPACITY_MILLI, DRIVER_NAME, mig_class_name
from scheduler.kube.convert import (
    MIG_RESOURCE_PREFIX,
    ContainerGpus,
    container_gpus,
    container_mig_asks,
    mig_profile_of,
    share_resources,
)
from scheduler.kube.quantity import QuantityError, parse_quantity

# The DeviceClass every converted ask names: any of the driver's devices, a share by its
# capacity requests, a whole GPU by naming none (manifests/components/dra).
DEVICE_CLASS = DRIVER_NAME
REQUEST_NAME = "gpu"  # the one request of each template
CLAIM_PREFIX = "gpufrag-"  # the pod's resourceClaims entries this webhook adds
TEMPLATE_PREFIX = "gpufrag-"
HASH_CHARS = 10
# The milli a memory ask that comes alone is given (the device-plugin path's carrier too).
CARRIER_MILLI = 1
_KEYS = {"containers": "gpu", "initContainers": "init-gpu"}


@dataclass(frozen=True, slots=True)
class Shape:
    """What one container asks: ``count`` whole GPUs, or (``count`` 1) a share of one GPU of
    ``milli`` compute and ``memory_mib`` memory (0: none named), or ``count`` MIG partitions
    of ``profile`` (empty: not a MIG ask)."""

    count: int
    milli: int = MILLI_PER_GPU
    memory_mib: int = 0
    profile: str = ""

    @property
    def whole(self) -> bool:
        """Whether the request names no capacity: whole GPUs, or MIG partitions (a partition
        is allocated whole)."""
        return self.milli == MILLI_PER_GPU and not self.memory_mib


@dataclass(frozen=True, slots=True)
class ClaimTemplate:
    """A ResourceClaimTemplate this webhook makes: its name and its ``spec``."""

    name: str
    spec: Mapping[str, Any]
    shape: Shape

    def body(self, namespace: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": self.name, "namespace": namespace},
                "spec": orjson.loads(orjson.dumps(self.spec))}


@dataclass(frozen=True, slots=True)
class Conversion:
    """The patch that moves the asks into claims (empty: the pod asks no GPU), the templates
    its claims are made from (each once), and which container got which template."""

    patch: list[dict[str, Any]]
    templates: tuple[ClaimTemplate, ...]
    containers: tuple[tuple[str, str], ...]  # (container, template name)

    @property
    def message(self) -> str:
        moved = ", ".join(f"{c} -> {t}" for c, t in self.containers)
        return f"GPU asks moved into ResourceClaims: {moved}"


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def shape_of(gpus: ContainerGpus, names: KubeNames, where: str) -> Shape | None:
    """What ``gpus`` (one container's ask) becomes, or None when it asks no GPU; BadInput
    naming ``where`` for an ask the driver cannot serve."""
    if not gpus.asks_gpu:
        return None
    if gpus.cores_percent:
        raise BadInput(f"container {gpus.name!r} asks {names.gpu_cores}: the DRA driver "
                       f"publishes a GPU's compute in milli, not percent; ask "
                       f"{names.gpu_milli} instead", field=f"{where}.{names.gpu_cores}")
    if gpus.memory_mib or gpus.milli % MILLI_PER_GPU:
        if gpus.count > 1 or gpus.milli > MILLI_PER_GPU:
            raise BadInput(f"container {gpus.name!r} asks a share of more than one GPU "
                           f"({names.gpu}: {gpus.count}, {names.gpu_milli}: {gpus.milli}); a "
                           f"share is part of one GPU: {names.gpu_milli} 1..{MILLI_PER_GPU}",
                           field=f"{where}.{names.gpu_milli}")
        return Shape(1, gpus.milli or CARRIER_MILLI, gpus.memory_mib)
    whole_milli = gpus.milli // MILLI_PER_GPU
    if gpus.count and whole_milli and gpus.count != whole_milli:
        raise BadInput(f"container {gpus.name!r} asks {gpus.count} {names.gpu} and "
                       f"{gpus.milli} {names.gpu_milli}: ask one of them",
                       field=f"{where}.{names.gpu}")
    count = gpus.count or whole_milli
    if count > MAX_GPUS_PER_NODE:
        raise BadInput(f"container {gpus.name!r} asks {count} GPUs; a node has at most "
                       f"{MAX_GPUS_PER_NODE}", field=f"{where}.{names.gpu}")
    return Shape(count)


def mig_shape_of(gpus: ContainerGpus, mig: Mapping[str, Decimal], names: KubeNames,
                 where: str) -> Shape | None:
    """What one container's MIG asks become (``mig``: its ``nvidia.com/mig-*`` resources and
    amounts, :func:`~scheduler.kube.convert.container_mig_asks`; ``gpus``: its GPU ask), or
    None when it asks no partition; BadInput naming ``where`` for a partition the driver
    cannot serve as asked."""
    asked = {resource: amount for resource, amount in mig.items() if amount}
    if not asked:
        return None
    for resource in sorted(asked):
        profile = mig_profile_of(resource)
        if profile is None or not most_per_gpu(profile):
            raise BadInput(
                f"container {gpus.name!r} asks {resource}: "
                f"{resource[len(MIG_RESOURCE_PREFIX):]!r} is not a MIG profile of any GPU "
                f"gpufrag knows (media variants such as +me are not modelled); the DRA driver "
                f"publishes partitions of {', '.join(all_profile_names())}",
                field=f"{where}.{resource}")
    first = min(asked)
    if gpus.asks_gpu:
        others = [r for r, n in ((names.gpu, gpus.count), (names.gpu_milli, gpus.milli),
                                 (names.gpu_memory, gpus.memory_mib),
                                 (names.gpu_cores, gpus.cores_percent)) if n]
        raise BadInput(f"container {gpus.name!r} asks {first} and {', '.join(others)}: a "
                       "container gets either MIG partitions or whole GPUs / a share of a "
                       "GPU, not both (a MIG GPU hands out only its partitions); ask one "
                       "kind, or each in its own container", field=f"{where}.{first}")
    if len(asked) > 1:
        raise BadInput(f"container {gpus.name!r} asks several MIG profiles "
                       f"({', '.join(sorted(asked))}); its claim asks one profile: ask each "
                       "in its own container", field=f"{where}.{sorted(asked)[1]}")
    amount = asked[first]
    if amount != amount.to_integral_value():
        raise BadInput(f"container {gpus.name!r} asks {amount} {first}: not a whole number of "
                       "MIG partitions", field=f"{where}.{first}")
    profile = mig_profile_of(first) or ""
    most = MAX_GPUS_PER_NODE * most_per_gpu(profile)
    if amount > most:
        raise BadInput(f"container {gpus.name!r} asks {amount} {first}; a node holds at most "
                       f"{most} ({MAX_GPUS_PER_NODE} GPUs of {most_per_gpu(profile)} each)",
                       field=f"{where}.{first}")
    return Shape(int(amount), profile=profile)


def template_spec(shape: Shape) -> dict[str, Any]:
    """The ``spec`` of the template for ``shape``: one request of the driver's class (for
    MIG partitions, the profile's class)."""
    device_class = mig_class_name(shape.profile) if shape.profile else DEVICE_CLASS
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount",
                               "count": shape.count}
    if not shape.whole:
        requests = {CAPACITY_MILLI: str(shape.milli)}
        if shape.memory_mib:
            requests[CAPACITY_MEMORY] = f"{shape.memory_mib}Mi"
        exactly["capacity"] = {"requests": requests}
    return {"spec": {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}}}


def template_for(shape: Shape) -> ClaimTemplate:
    """The template for ``shape``, named from its spec: ``gpufrag-<shape>-<hash>``."""
    spec = template_spec(shape)
    digest = hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()
    if shape.profile:
        label = f"{shape.count}mig-{shape.profile.replace('.', '-')}"
    elif shape.whole:
        label = f"{shape.count}gpu"
    else:
        label = f"{shape.milli}m" + (f"-{shape.memory_mib}mi" if shape.memory_mib else "")
    return ClaimTemplate(f"{TEMPLATE_PREFIX}{label}-{digest[:HASH_CHARS]}", spec, shape)


def _canonical(value: Any) -> Any:
    """``value`` with what the API server may rewrite on the way in made equal: quantities
    as numbers (``10240Mi`` comes back ``10Gi``), a request's defaulted count and mode."""
    if isinstance(value, Mapping):
        out = {str(k): _canonical(v) for k, v in value.items()}
        if "deviceClassName" in out:  # an exact device request
            out.setdefault("allocationMode", "ExactCount")
            if out["allocationMode"] == "ExactCount":
                out.setdefault("count", 1)
            requests = (out.get("capacity") or {}).get("requests")
            if isinstance(requests, dict):
                out["capacity"]["requests"] = {k: _number(v) for k, v in requests.items()}
        return out
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _number(value: Any) -> Decimal | Any:
    try:
        return parse_quantity(value)
    except QuantityError:
        return value


def same_spec(found: Any, wanted: Mapping[str, Any]) -> bool:
    """Whether a template's ``spec`` as the API server holds it is ``wanted``, field for
    field (any selector, constraint, config or label beside it makes it another)."""
    return bool(_canonical(found) == _canonical(wanted))


def convert(pod: Mapping[str, Any], names: KubeNames) -> Conversion:
    """The conversion of every container's GPU ask (app and init containers); BadInput for
    an ask the driver cannot serve or a claim name the pod already uses."""
    spec = pod.get("spec") or {}
    taken = {entry.get("name") for entry in spec.get("resourceClaims") or []
             if isinstance(entry, Mapping)}
    resources_named = share_resources(names)
    entries: list[dict[str, Any]] = []
    patch: list[dict[str, Any]] = []
    templates: dict[str, ClaimTemplate] = {}
    converted: list[tuple[str, str]] = []
    for key, label in _KEYS.items():
        migs = container_mig_asks(pod, key)
        for i, gpus in enumerate(container_gpus(pod, names, key)):
            where = f"spec.{key}[{i}].resources"
            shape = mig_shape_of(gpus, migs[i], names, where) or shape_of(gpus, names, where)
            if shape is None:
                continue
            template = template_for(shape)
            templates.setdefault(template.name, template)
            claim = f"{CLAIM_PREFIX}{label}-{i}"
            if claim in taken:
                raise BadInput(f"the pod already has a claim named {claim!r}; that name is "
                               "the webhook's for this container's GPU",
                               field="spec.resourceClaims")
            entries.append({"name": claim, "resourceClaimTemplateName": template.name})
            converted.append((gpus.name, template.name))
            patch.extend(_container_patch(spec[key][i], f"/spec/{key}/{i}/resources", claim,
                                          (*resources_named, *migs[i])))
    if not entries:
        return Conversion([], (), ())
    head: list[dict[str, Any]]
    if spec.get("resourceClaims"):
        head = [{"op": "add", "path": "/spec/resourceClaims/-", "value": e} for e in entries]
    else:
        head = [{"op": "add", "path": "/spec/resourceClaims", "value": entries}]
    return Conversion([*head, *patch], tuple(templates.values()), tuple(converted))


def _container_patch(container: Mapping[str, Any], base: str, claim: str,
                     resources_named: tuple[str, ...]) -> list[dict[str, Any]]:
    resources = container.get("resources") or {}
    patch: list[dict[str, Any]] = []
    for part in ("requests", "limits"):
        for resource in resources_named:
            if resource in (resources.get(part) or {}):
                patch.append({"op": "remove", "path": f"{base}/{part}/{_escape(resource)}"})
    if resources.get("claims"):
        patch.append({"op": "add", "path": f"{base}/claims/-", "value": {"name": claim}})
    else:
        patch.append({"op": "add", "path": f"{base}/claims", "value": [{"name": claim}]})
    return patch
