"""Which GPUs a pod holds through gpufrag's DRA driver (pure: ResourceClaim and Pod dicts -> data).

Under DRA, kube-scheduler writes what a pod got into its ResourceClaim's
``status.allocation.devices.results``: one entry per device, with ``request``, ``driver``,
``pool``, ``device`` and, for a device shared under consumable capacity, ``consumedCapacity``
and ``shareID``. A DRA pod has no ``gpu-indices`` annotation, so every reader of "which GPUs
does this pod hold" (the extender's cache, the node's driver) reads those results, and reads
them here: one parser, so the node preparing a claim and the extender counting it can never
disagree on what it holds.

The driver publishes one pool per node, named after the node, with one device ``gpu-<index>``
per GPU and two consumable capacities (``node/dra/slices.py``): ``milli`` (1000 a GPU) and
``memory`` (bytes). A result that consumed no ``milli`` holds the whole GPU (the capacity has
no request policy, so a request that does not name it takes all of it). Results of other
drivers in the same claim are theirs and skipped. Malformed input is :class:`BadInput` naming
the field, never a crash: a reader of the cluster must survive any object it is shown.

Before the allocation, what a claim *asks* is read here too (:func:`asked_gpus`, from
``spec.devices.requests``): the extender judges a DRA pod for it and assumes the GPU DRA's
first fit will take, until the allocation shows (docs/dra.md, "What reads claims").

Field names follow ``k8s.io/api/resource/v1/types.go`` and ``k8s.io/api/core/v1`` (Pod's
``spec.resourceClaims`` and ``status.resourceClaimStatuses``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, TypeVar

from gpufrag.conventions import DEFAULT_NAMES, KubeNames
from gpufrag.errors import BadInput
from scheduler.core.mig import is_profile_name
from scheduler.core.types import MAX_GPUS_PER_NODE, MILLI_PER_GPU, NodeSpec, PodRequest
from scheduler.kube.convert import effective_requests, gpu_labels
from scheduler.kube.quantity import QuantityError, parse_quantity

DRIVER_NAME = "gpu.gpufrag.io"  # gpufrag's DRA driver, the one whose devices are GPUs we place
# The DeviceClasses the install ships for the driver's devices (manifests/components/dra): a
# claim's request names a class, not a driver, so these names say which requests ask our GPUs.
DEVICE_CLASSES = (DRIVER_NAME, f"whole.{DRIVER_NAME}")
MIG_CLASS_PREFIX = "mig-"


def gpu_selector(driver: str = DRIVER_NAME) -> str:
    """The CEL of the classes for whole GPUs and shares: the driver's devices outside MIG
    mode (every device of the driver has ``migEnabled``; a MIG partition has it true, so a
    request of the generic class never lands on a partition)."""
    return f'device.driver == "{driver}" && !device.attributes["{driver}"].migEnabled'


def mig_class_name(profile: str, driver: str = DRIVER_NAME) -> str:
    """The DeviceClass of one MIG profile: ``mig-3g.40gb.gpu.gpufrag.io``."""
    return f"{MIG_CLASS_PREFIX}{profile}.{driver}"


def mig_class_profile(device_class: str, driver: str = DRIVER_NAME) -> str | None:
    """The MIG profile whose class ``device_class`` is (:func:`mig_class_name`), or None
    when it is not one."""
    suffix = f".{driver}"
    if not (device_class.startswith(MIG_CLASS_PREFIX) and device_class.endswith(suffix)):
        return None
    profile = device_class[len(MIG_CLASS_PREFIX):-len(suffix)]
    return profile if is_profile_name(profile) else None


def mig_selector(profile: str, driver: str = DRIVER_NAME) -> str:
    """The CEL of a MIG profile's class: the driver's partitions of that profile (``in``
    first: a device without the attribute is then no match rather than a CEL error, which
    would fail the allocation)."""
    attributes = f'device.attributes["{driver}"]'
    return (f'device.driver == "{driver}" && "profile" in {attributes} && '
            f'{attributes}.profile == "{profile}"')
CAPACITY_MILLI = "milli"
CAPACITY_MEMORY = "memory"
DEVICE_PREFIX = "gpu-"
MIB = 1 << 20

Obj = Mapping[str, Any]
_T = TypeVar("_T")


def device_name(index: int) -> str:
    """The device name of GPU ``index`` (a DNS label, unique in the pool)."""
    return f"{DEVICE_PREFIX}{index}"


def device_index(name: str) -> int | None:
    """The GPU index a device name stands for, or None when it is not one of ours."""
    prefix, _, number = name.partition(DEVICE_PREFIX)
    if prefix or not number.isdigit() or number != str(int(number)):
        return None
    return int(number)


# A MIG partition (KEP-4815): GPU index, profile (its dot a dash: a device name is a DNS
# label) and start slice, e.g. gpu-0-mig-3g-40gb-4 for a 3g.40gb instance at slice 4 of GPU 0.
_MIG_DEVICE = re.compile(r"^gpu-(0|[1-9][0-9]*)-mig-([0-9]+g)-([0-9]+gb)-([0-7])$")


@dataclass(frozen=True, slots=True)
class MigPartition:
    """Which MIG placement a partition device stands for."""

    index: int  # the GPU's
    profile: str  # as scheduler.core.mig names it: 3g.40gb
    start: int  # its first memory slice


def mig_device_name(index: int, profile: str, start: int) -> str:
    """The device name of ``profile``'s placement at ``start`` on GPU ``index``."""
    return f"{DEVICE_PREFIX}{index}-mig-{profile.replace('.', '-')}-{start}"


def mig_partition(name: str) -> MigPartition | None:
    """The placement a device name stands for, or None when it is not a MIG partition."""
    found = _MIG_DEVICE.match(name)
    if found is None:
        return None
    return MigPartition(int(found[1]), f"{found[2]}.{found[3]}", int(found[4]))


@dataclass(frozen=True, slots=True)
class ClaimedGpu:
    """One GPU of gpufrag's driver in a claim's allocation, and the share of it consumed."""

    result: int  # its position in status.allocation.devices.results, for messages
    request: str
    pool: str  # the node's name: one pool per node
    device: str
    index: int
    milli: int  # consumed of the GPU's milli, 1..1000 (1000: the whole GPU)
    memory_mib: int  # consumed of its memory, rounded up (0: none named)
    share_id: str | None


def _mapping(value: Any, field: str) -> Obj:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadInput(f"{value!r} is not an object", field=field)
    return value


def _list(value: Any, field: str) -> Sequence[Any]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise BadInput(f"{value!r} is not a list", field=field)
    return value


def _amount(value: Any, field: str) -> int:
    """A consumed quantity as an integer in base units, rounded up."""
    try:
        return math.ceil(parse_quantity(value))
    except QuantityError as exc:
        raise BadInput(str(exc), field=field) from None


def _pool_and_request(result: Obj, where: str) -> tuple[str, str]:
    """An allocation result's pool and request names, each required."""
    pool = result.get("pool")
    if not isinstance(pool, str) or not pool:
        raise BadInput(f"{pool!r}; it must name the node's pool", field=f"{where}.pool")
    request = result.get("request")
    if not isinstance(request, str) or not request:
        raise BadInput(f"{request!r}; it must name the request", field=f"{where}.request")
    return pool, request


def _claimed_gpu(result: Obj, position: int, where: str) -> ClaimedGpu:
    name = result.get("device")
    index = device_index(name) if isinstance(name, str) else None
    if not isinstance(name, str) or index is None:
        raise BadInput(f"{name!r} is not a device of the form {DEVICE_PREFIX}<index>",
                       field=f"{where}.device")
    pool, request = _pool_and_request(result, where)
    milli, memory_mib = _capacity(result.get("consumedCapacity"), f"{where}.consumedCapacity")
    share_id = result.get("shareID")
    return ClaimedGpu(position, request, pool, name, index, milli, memory_mib,
                      share_id if isinstance(share_id, str) else None)


def _capacity(value: Any, where: str) -> tuple[int, int]:
    """A device's ``milli`` and ``memory`` (MiB, rounded up) from its capacity amounts
    (consumed, or requested) at ``where``: ``milli`` unnamed is the whole GPU (the capacity
    has no request policy), ``memory`` unnamed none."""
    amounts = _mapping(value, where)
    milli_field = f"{where}.{CAPACITY_MILLI}"
    milli_value = amounts.get(CAPACITY_MILLI)
    milli = MILLI_PER_GPU if milli_value is None else _amount(milli_value, milli_field)
    if not 0 < milli <= MILLI_PER_GPU:
        raise BadInput(f"{milli}; it must be 1..{MILLI_PER_GPU}", field=milli_field)
    memory_field = f"{where}.{CAPACITY_MEMORY}"
    memory_value = amounts.get(CAPACITY_MEMORY)
    memory_bytes = 0 if memory_value is None else _amount(memory_value, memory_field)
    if memory_bytes < 0:
        raise BadInput(f"{memory_bytes}; it must not be negative", field=memory_field)
    return milli, math.ceil(memory_bytes / MIB)


def claimed_gpus(claim: Obj, *, driver: str) -> tuple[ClaimedGpu, ...] | None:
    """``driver``'s GPUs in ``claim``'s allocation, in result order; None when the claim is
    not allocated (yet, or any more: a deallocated claim holds nothing)."""
    status = _mapping(claim.get("status"), "status")
    if status.get("allocation") is None:
        return None
    allocation = _mapping(status.get("allocation"), "status.allocation")
    devices = _mapping(allocation.get("devices"), "status.allocation.devices")
    results = _list(devices.get("results"), "status.allocation.devices.results")
    found = []
    for i, result in enumerate(results):
        where = f"status.allocation.devices.results[{i}]"
        if not isinstance(result, Mapping):
            raise BadInput(f"{result!r} is not an object", field=where)
        if result.get("driver") != driver:
            continue  # another driver's device in the same claim: not a GPU we place
        if isinstance(result.get("device"), str) and mig_partition(result["device"]):
            continue  # a MIG partition: claimed_partitions reads it
        found.append(_claimed_gpu(result, i, where))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class ClaimedPartition:
    """One MIG partition of gpufrag's driver in a claim's allocation."""

    result: int  # its position in status.allocation.devices.results, for messages
    request: str
    pool: str
    device: str
    partition: MigPartition


def claimed_partitions(claim: Obj, *, driver: str) -> tuple[ClaimedPartition, ...]:
    """``driver``'s MIG partitions in ``claim``'s allocation, in result order (none when the
    claim is not allocated); malformed results are BadInput naming the field, as in
    :func:`claimed_gpus`, which reads the rest of the same results."""
    status = _mapping(claim.get("status"), "status")
    allocation = _mapping(status.get("allocation"), "status.allocation")
    devices = _mapping(allocation.get("devices"), "status.allocation.devices")
    found = []
    for i, result in enumerate(_list(devices.get("results"),
                                     "status.allocation.devices.results")):
        where = f"status.allocation.devices.results[{i}]"
        if not isinstance(result, Mapping):
            raise BadInput(f"{result!r} is not an object", field=where)
        name = result.get("device")
        partition = mig_partition(name) if isinstance(name, str) else None
        if result.get("driver") != driver or partition is None or not isinstance(name, str):
            continue
        pool, request = _pool_and_request(result, where)
        found.append(ClaimedPartition(i, request, pool, name, partition))
    return tuple(found)


def pod_claim_names(pod: Obj) -> tuple[str, ...]:
    """The names of the ResourceClaims (in the pod's namespace) that ``pod`` uses.

    A claim named in ``spec.resourceClaims[].resourceClaimName`` is used as is; one made from a
    template is named by the entry of the same name in ``status.resourceClaimStatuses`` once
    the claim controller has made it (until then, and when that status names none because
    the claim was not needed, the pod holds nothing through it). A pod that asks an extended
    resource a DeviceClass maps (KEP-5004) uses the claim kube-scheduler made for it while
    binding, named in ``status.extendedResourceClaimStatus.resourceClaimName``."""
    spec = _mapping(pod.get("spec"), "spec")
    status = _mapping(pod.get("status"), "status")
    generated: dict[str, str] = {}
    for i, entry in enumerate(_list(status.get("resourceClaimStatuses"),
                                    "status.resourceClaimStatuses")):
        where = f"status.resourceClaimStatuses[{i}]"
        entry = _mapping(entry, where)
        name, claim_name = entry.get("name"), entry.get("resourceClaimName")
        if not isinstance(name, str):
            raise BadInput(f"{name!r} is not a name", field=f"{where}.name")
        if claim_name is not None and not isinstance(claim_name, str):
            raise BadInput(f"{claim_name!r} is not a name", field=f"{where}.resourceClaimName")
        if claim_name:
            generated[name] = claim_name
    names = []
    for i, entry in enumerate(_list(spec.get("resourceClaims"), "spec.resourceClaims")):
        where = f"spec.resourceClaims[{i}]"
        entry = _mapping(entry, where)
        direct = entry.get("resourceClaimName")
        if direct is not None and not isinstance(direct, str):
            raise BadInput(f"{direct!r} is not a name", field=f"{where}.resourceClaimName")
        claim_name = direct or generated.get(str(entry.get("name")))
        if claim_name:
            names.append(claim_name)
    where = "status.extendedResourceClaimStatus"
    extended = _mapping(status.get("extendedResourceClaimStatus"), where)
    claim_name = extended.get("resourceClaimName")
    if claim_name is not None and not isinstance(claim_name, str):
        raise BadInput(f"{claim_name!r} is not a name", field=f"{where}.resourceClaimName")
    if claim_name:
        names.append(claim_name)
    return tuple(names)


def direct_claim_names(pod: Obj) -> tuple[str, ...]:
    """The claims ``pod`` names directly (``spec.resourceClaims[].resourceClaimName``), not
    made from a template for it: such a claim, and its allocation, outlive the pod, so a
    replacement of the pod uses the same claim on the same devices. Raises BadInput."""
    spec = _mapping(pod.get("spec"), "spec")
    names = []
    for i, entry in enumerate(_list(spec.get("resourceClaims"), "spec.resourceClaims")):
        where = f"spec.resourceClaims[{i}]"
        direct = _mapping(entry, where).get("resourceClaimName")
        if direct is not None and not isinstance(direct, str):
            raise BadInput(f"{direct!r} is not a name", field=f"{where}.resourceClaimName")
        if direct:
            names.append(direct)
    return tuple(names)


@dataclass(frozen=True, slots=True)
class AskedGpus:
    """One request of a claim for devices of our classes: ``count`` GPUs, each ``milli`` of
    its 1000 (1000: whole) and ``memory_mib`` of its memory (0: none named)."""

    request: str
    count: int
    milli: int
    memory_mib: int


def _ours(device_class: Any, device_classes: Collection[str]) -> bool:
    return isinstance(device_class, str) and device_class in device_classes


def asked_gpus(claim: Obj, *, device_classes: Collection[str]) -> tuple[AskedGpus, ...]:
    """What ``claim``'s ``spec.devices.requests`` ask of devices in ``device_classes``, in
    request order (other classes' requests skipped): the allocator's view before it allocates,
    read the way :func:`claimed_gpus` reads what it allocated. A request that names no
    ``milli`` takes all of it (the capacity has no request policy): a whole GPU. Requests the
    placement cannot model are :class:`BadInput` naming the field: ``allocationMode: All``,
    ``firstAvailable`` (KEP-4816's alternatives: which one the allocator takes depends on the
    node), and several devices of a request that each take part of a GPU."""
    spec = _mapping(claim.get("spec"), "spec")
    devices = _mapping(spec.get("devices"), "spec.devices")
    found = []
    for i, entry in enumerate(_list(devices.get("requests"), "spec.devices.requests")):
        where = f"spec.devices.requests[{i}]"
        entry = _mapping(entry, where)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise BadInput(f"{name!r}; it must name the request", field=f"{where}.name")
        alternatives = _list(entry.get("firstAvailable"), f"{where}.firstAvailable")
        if any(isinstance(a, Mapping) and _ours(a.get("deviceClassName"), device_classes)
               for a in alternatives):
            raise BadInput("a list of alternatives (firstAvailable) is not placed by gpufrag; "
                           "ask one request of the class", field=f"{where}.firstAvailable")
        exactly = _mapping(entry.get("exactly"), f"{where}.exactly")
        if not _ours(exactly.get("deviceClassName"), device_classes):
            continue
        count = _exact_count(exactly, f"{where}.exactly", "GPUs")
        capacity = _mapping(exactly.get("capacity"), f"{where}.exactly.capacity")
        milli, memory_mib = _capacity(capacity.get("requests"),
                                      f"{where}.exactly.capacity.requests")
        if count > 1 and milli < MILLI_PER_GPU:
            raise BadInput(f"{count} devices of {milli} milli each; a request for part of a "
                           "GPU asks one device", field=f"{where}.exactly.count")
        found.append(AskedGpus(name, count, milli, memory_mib))
    return tuple(found)


def partitions_asked(claims: Iterable[tuple[str, Obj]], *, driver: str) -> dict[str, int]:
    """The MIG instances a pod asks through its ``claims`` ((name, ResourceClaim) pairs), by
    profile: each request of a MIG profile's class (:func:`mig_class_profile`) asks ``count``
    partitions (an exact count; any other is BadInput naming the claim and field, as in
    :func:`asked_gpus`). The extender judges such a pod on the nodes' MIG instances, as a
    pod asking ``nvidia.com/mig-<profile>``."""
    asked: dict[str, int] = {}
    for profile, count in _each_claim(claims, lambda claim: _partitions_asked(claim, driver)):
        asked[profile] = asked.get(profile, 0) + count
    return asked


def _partitions_asked(claim: Obj, driver: str) -> list[tuple[str, int]]:
    spec = _mapping(claim.get("spec"), "spec")
    devices = _mapping(spec.get("devices"), "spec.devices")
    found = []
    for i, entry in enumerate(_list(devices.get("requests"), "spec.devices.requests")):
        where = f"spec.devices.requests[{i}].exactly"
        exactly = _mapping(_mapping(entry, where).get("exactly"), where)
        device_class = exactly.get("deviceClassName")
        profile = (mig_class_profile(device_class, driver)
                   if isinstance(device_class, str) else None)
        if profile is None:
            continue
        found.append((profile, _exact_count(exactly, where, "MIG partitions")))
    return found


def _exact_count(exactly: Obj, where: str, what: str) -> int:
    """The ``count`` of a request's ``exactly`` (at ``where``) in ``ExactCount`` mode, the
    one mode placement models; any other mode or count is BadInput naming the field."""
    mode = exactly.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise BadInput(f"{mode!r}; gpufrag places an exact count of {what}",
                       field=f"{where}.allocationMode")
    count = exactly.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise BadInput(f"{count!r}; it must be a whole number >= 1", field=f"{where}.count")
    return count


def gpus_asked(claims: Iterable[tuple[str, Obj]], *, device_classes: Collection[str],
               mapped: int = 0) -> tuple[int, int]:
    """How many GPUs a pod asks through its ``claims`` ((name, ResourceClaim) pairs) and
    ``mapped`` (whole GPUs asked through an extended resource one of our DeviceClasses maps,
    before kube-scheduler made their claim: :func:`mapped_count`), and how much of each, in
    milli: one device of part of a GPU is a share; anything else counts as whole GPUs, as
    :func:`gpus_held` counts several results. (0, 0): none."""
    count, milli, _ = _totals(_claims_asks(claims, device_classes), mapped)
    return count, milli


def _each_claim(claims: Iterable[tuple[str, Obj]], read: Callable[[Obj], Iterable[_T]]
                ) -> list[_T]:
    """What ``read`` finds in each of ``claims`` ((name, ResourceClaim) pairs), in order; a
    BadInput it raises names the claim."""
    found: list[_T] = []
    for name, claim in claims:
        try:
            found.extend(read(claim))
        except BadInput as exc:
            raise BadInput(f"ResourceClaim {name!r}: {exc}") from None
    return found


def _claims_asks(claims: Iterable[tuple[str, Obj]],
                 device_classes: Collection[str]) -> list[AskedGpus]:
    return _each_claim(claims, lambda claim: asked_gpus(claim, device_classes=device_classes))


def _totals(asks: Sequence[AskedGpus], mapped: int) -> tuple[int, int, int]:
    """(GPUs, milli of each, memory MiB of the one share or 0) of ``asks`` and ``mapped``."""
    count = sum(ask.count for ask in asks) + mapped
    if count > MAX_GPUS_PER_NODE:
        raise BadInput(f"its claims ask {count} GPUs; a node has at most {MAX_GPUS_PER_NODE}")
    if count == 1 and asks:
        share = asks[0].milli < MILLI_PER_GPU
        return 1, asks[0].milli, asks[0].memory_mib if share else 0
    return count, MILLI_PER_GPU if count else 0, 0


def mapped_resource(device_class: Obj) -> str | None:
    """The extended resource a DeviceClass maps to its devices (KEP-5004's
    ``spec.extendedResourceName``), or None when it maps none. Raises BadInput."""
    spec = _mapping(device_class.get("spec"), "spec")
    name = spec.get("extendedResourceName")
    if name is not None and not isinstance(name, str):
        raise BadInput(f"{name!r} is not a resource name", field="spec.extendedResourceName")
    return name or None


def mapped_count(pod: Obj, resources: Collection[str]) -> int:
    """How many devices ``pod`` asks through the extended ``resources`` (those our
    DeviceClasses map, :func:`mapped_resource`) while kube-scheduler has not made their claim
    yet: it makes it in the pod's binding cycle and names it in
    ``status.extendedResourceClaimStatus``, from when on the claim itself is read
    (:func:`pod_claim_names`), so 0 then, and 0 for a pod that asks none. Each device of a
    mapped class is a whole GPU (the class's requests name no capacity). Raises BadInput."""
    if not resources:
        return 0
    status = _mapping(pod.get("status"), "status")
    extended = _mapping(status.get("extendedResourceClaimStatus"),
                        "status.extendedResourceClaimStatus")
    if extended.get("resourceClaimName"):
        return 0
    wanted = tuple(sorted(resources))
    total = sum(effective_requests(pod, wanted).values(), Decimal(0))
    if total != total.to_integral_value():
        raise BadInput(f"{total} devices of {', '.join(wanted)}; extended resources are "
                       "whole numbers", field="spec.containers[].resources")
    return int(total)


@dataclass(frozen=True, slots=True)
class HeldGpu:
    """A GPU a pod holds through its claims: on which node, and how much of it."""

    node: str
    index: int
    milli: int  # 1..1000 (1000: the whole GPU)
    memory_mib: int


def held_gpus(pod: Obj, claims: Mapping[str, Obj], *, driver: str) -> tuple[HeldGpu, ...]:
    """The GPUs ``pod`` holds through ``driver``, from ``claims`` (the pod's namespace's
    ResourceClaims by name; a claim not in it holds nothing yet): :func:`gpus_held`."""
    return gpus_held([(name, claims[name]) for name in pod_claim_names(pod) if name in claims],
                     driver=driver)


def gpus_held(claims: Iterable[tuple[str, Obj]], *, driver: str) -> tuple[HeldGpu, ...]:
    """The GPUs a pod holds through ``driver`` from its ``claims`` ((name, ResourceClaim)
    pairs, the name for messages). The shares of several results on one GPU add up, capped
    at the whole GPU; sorted by node and index."""
    totals: dict[tuple[str, int], tuple[int, int]] = {}
    for name, claim in claims:
        try:
            found = claimed_gpus(claim, driver=driver) or ()
        except BadInput as exc:
            raise BadInput(f"ResourceClaim {name!r}: {exc}") from None
        for gpu in found:
            milli, memory = totals.get((gpu.pool, gpu.index), (0, 0))
            totals[(gpu.pool, gpu.index)] = (min(MILLI_PER_GPU, milli + gpu.milli),
                                             memory + gpu.memory_mib)
    return tuple(HeldGpu(node, index, milli, memory)
                 for (node, index), (milli, memory) in sorted(totals.items()))


def pod_claim_keys(pod: Obj) -> tuple[str, ...]:
    """:func:`pod_claim_names` as ``namespace/name`` keys (claims live in the pod's
    namespace)."""
    meta = _mapping(pod.get("metadata"), "metadata")
    namespace = meta.get("namespace") or ""
    if not isinstance(namespace, str):
        raise BadInput(f"{namespace!r} is not a name", field="metadata.namespace")
    return tuple(f"{namespace}/{name}" for name in pod_claim_names(pod))


def holding(request: PodRequest, held: Sequence[HeldGpu]) -> PodRequest:
    """``request`` holding the GPUs ``held`` (on one node) instead of any its containers
    ask: one share (its milli and the memory it consumed: a memory share is counted for the
    larger part of the GPU, as a device-plugin memory share is), or whole GPUs (several
    results that are not one share count whole)."""
    share = len(held) == 1 and held[0].milli < MILLI_PER_GPU
    milli = held[0].milli if len(held) == 1 else MILLI_PER_GPU
    return replace(request, num_gpu=len(held), gpu_milli=milli,
                   gpu_memory_mib=held[0].memory_mib if share else 0)


def asking(request: PodRequest, claims: Iterable[tuple[str, Obj]], *,
           device_classes: Collection[str], mapped: int = 0) -> PodRequest:
    """``request`` asking what ``claims`` ask of ``device_classes`` and the ``mapped`` whole
    GPUs (:func:`gpus_asked`), instead of any its containers ask; as it is when they ask
    none. Raises BadInput."""
    count, milli, memory_mib = _totals(_claims_asks(claims, device_classes), mapped)
    if not count:
        return request
    return replace(request, num_gpu=count, gpu_milli=milli, gpu_memory_mib=memory_mib)


def listed_pod_gpus(pod: Obj, request: PodRequest, claims: Mapping[str, Obj], *,
                    driver: str = DRIVER_NAME, device_classes: Collection[str] = DEVICE_CLASSES
                    ) -> tuple[PodRequest, tuple[int, ...] | None] | None:
    """How a reader of a listed cluster (the defrag snapshot, ``gpufrag inspect``) counts a
    pod that uses ResourceClaims, as the extender's cache counts it once its watch has caught
    up; None for a pod that uses none. ``claims``: the ResourceClaims by ``namespace/name``.

    A bound pod holds the GPUs its claims' allocations name on its node (their indices are
    its record); with none there, its CPU and memory only (``()``). A pending pod asks what
    its claims ask (no record). Raises BadInput naming the claim for one that cannot be
    read."""
    keys = pod_claim_keys(pod)
    if not keys:
        return None
    listed = [(key, claims[key]) for key in keys if key in claims]
    spec = _mapping(pod.get("spec"), "spec")
    node = spec.get("nodeName")
    if not node:
        return asking(request, listed, device_classes=device_classes), None
    held = [gpu for gpu in gpus_held(listed, driver=driver) if gpu.node == node]
    if not held:
        return replace(request, num_gpu=0, gpu_milli=0, gpu_memory_mib=0), ()
    return holding(request, held), tuple(gpu.index for gpu in held)


def partitions_held(claims: Iterable[tuple[str, Obj]], *, driver: str
                    ) -> tuple[ClaimedPartition, ...]:
    """The MIG partitions of ``driver`` a pod holds through its ``claims`` ((name,
    ResourceClaim) pairs, the name for messages), in claim and result order: what
    :func:`gpus_held` is for GPUs. Raises BadInput naming the claim."""
    return tuple(_each_claim(claims, lambda claim: claimed_partitions(claim, driver=driver)))


def listed_pod_partitions(pod: Obj, claims: Mapping[str, Obj], *, driver: str = DRIVER_NAME
                          ) -> tuple[MigPartition, ...]:
    """The MIG partitions a bound ``pod`` holds on its node through its claims (``claims``:
    the ResourceClaims by ``namespace/name``, as for :func:`listed_pod_gpus`), sorted by GPU
    and start; none for a pending pod, one that uses no claims, or one whose claims name
    partitions of other nodes only. A DRA MIG pod asks no GPU of the placement state (its
    request reads as CPU and memory): this is what it holds, the instance its GPU runs it
    in. Raises BadInput naming the claim."""
    node = _mapping(pod.get("spec"), "spec").get("nodeName")
    if not node:
        return ()
    listed = [(key, claims[key]) for key in pod_claim_keys(pod) if key in claims]
    held = {p.partition for p in partitions_held(listed, driver=driver) if p.pool == node}
    return tuple(sorted(held, key=lambda p: (p.index, p.start, p.profile)))


@dataclass(frozen=True, slots=True)
class SliceGpus:
    """What a node's ResourceSlice of the driver offers: its GPUs (the devices ``gpu-<index>``
    not in MIG mode), their product (NVML's name) and memory (MiB, the smallest)."""

    node: str
    count: int
    product: str
    memory_mib: int


def slice_gpus(obj: Obj, *, driver: str) -> SliceGpus | None:
    """The GPUs ``obj`` (a ``resource.k8s.io/v1`` ResourceSlice) offers on its node, as
    ``node.dra.slices`` publishes them; None for another driver's slice or one of no node.
    A node whose Node object advertises no GPU (the device plugin left it: DRA serves it)
    holds these. Raises BadInput naming the field."""
    spec = _mapping(obj.get("spec"), "spec")
    if spec.get("driver") != driver:
        return None
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return None
    products: set[str] = set()
    memory: list[int] = []
    count = 0
    for i, device in enumerate(_list(spec.get("devices"), "spec.devices")):
        where = f"spec.devices[{i}]"
        device = _mapping(device, where)
        name = device.get("name")
        if not isinstance(name, str) or device_index(name) is None:
            continue
        attributes = _mapping(device.get("attributes"), f"{where}.attributes")
        if _mapping(attributes.get("migEnabled"), f"{where}.attributes.migEnabled").get("bool"):
            continue  # a MIG GPU: its instances are not shares of a GPU
        count += 1
        product = _mapping(attributes.get("productName"),
                           f"{where}.attributes.productName").get("string")
        if isinstance(product, str) and product:
            products.add(product)
        capacity = _mapping(device.get("capacity"), f"{where}.capacity")
        value = _mapping(capacity.get(CAPACITY_MEMORY),
                         f"{where}.capacity.{CAPACITY_MEMORY}").get("value")
        if value is not None:
            memory.append(math.ceil(_amount(value, f"{where}.capacity.{CAPACITY_MEMORY}.value")
                                    / MIB))
    if count > MAX_GPUS_PER_NODE:
        raise BadInput(f"{count} GPUs; a node has at most {MAX_GPUS_PER_NODE}",
                       field="spec.devices")
    return SliceGpus(node, count, min(products) if len(products) == 1 else "",
                     min(memory, default=0))


def with_slice_gpus(spec: NodeSpec, found: SliceGpus | None,
                    names: KubeNames = DEFAULT_NAMES) -> NodeSpec:
    """``spec`` (a Node as :func:`~scheduler.kube.convert.node_from_k8s` reads it) with the
    GPUs its ResourceSlice offers, when the Node advertises none (``nvidia.com/gpu`` 0 or
    absent: the device plugin left the node, DRA serves it); the product and memory from the
    GPU feature discovery labels where the node has them (the names placement matches), else
    from the slice. ``spec`` as it is otherwise."""
    if spec.gpu_count or found is None or not found.count:
        return spec
    labels = gpu_labels(spec.labels, names)
    return replace(spec, gpu_count=found.count, gpu_product=labels.product or found.product,
                   gpu_memory_mib=spec.gpu_memory_mib or found.memory_mib)


@dataclass(frozen=True, slots=True)
class SliceMigGpu:
    """A GPU in MIG mode whose partitions a ResourceSlice of the driver publishes (KEP-4815):
    its node, index, product (NVML's name) and memory (MiB: its largest partition's, the
    whole-GPU profile's, which tells the MIG table's families apart as the GPU's does)."""

    node: str
    index: int
    product: str
    memory_mib: int


def slice_mig_gpus(obj: Obj, *, driver: str) -> tuple[SliceMigGpu, ...]:
    """The GPUs whose MIG partitions ``obj`` (a ``resource.k8s.io/v1`` ResourceSlice)
    publishes, by index, as ``node.dra.slices`` publishes them (a device
    ``gpu-<index>-mig-<profile>-<start>`` per legal placement); none for another driver's
    slice, one of no node, or one without partitions. Such a GPU is a dynamic MIG GPU:
    kube-scheduler's allocator hands out its placements and the driver makes the instance
    when a claim is prepared. Raises BadInput naming the field."""
    spec = _mapping(obj.get("spec"), "spec")
    node = spec.get("nodeName")
    if spec.get("driver") != driver or not isinstance(node, str) or not node:
        return ()
    products: dict[int, str] = {}
    memory: dict[int, int] = {}
    for i, device in enumerate(_list(spec.get("devices"), "spec.devices")):
        where = f"spec.devices[{i}]"
        device = _mapping(device, where)
        name = device.get("name")
        partition = mig_partition(name) if isinstance(name, str) else None
        if partition is None:
            continue
        attributes = _mapping(device.get("attributes"), f"{where}.attributes")
        product = _mapping(attributes.get("productName"),
                           f"{where}.attributes.productName").get("string")
        if isinstance(product, str) and product:
            products.setdefault(partition.index, product)
        capacity = _mapping(device.get("capacity"), f"{where}.capacity")
        value = _mapping(capacity.get(CAPACITY_MEMORY),
                         f"{where}.capacity.{CAPACITY_MEMORY}").get("value")
        mib = 0 if value is None else math.ceil(
            _amount(value, f"{where}.capacity.{CAPACITY_MEMORY}.value") / MIB)
        memory[partition.index] = max(memory.get(partition.index, 0), mib)
    return tuple(SliceMigGpu(node, index, products.get(index, ""), memory[index])
                 for index in sorted(memory))
