"""Which pod an Allocate call is for, and which GPUs its container gets: pure functions.

The kubelet's Allocate carries device IDs and nothing about the pod. Like gpushare's plugin,
the answer is found among the pods on this node: the **candidates** for a call of ``n`` devices
of a resource are the pods that are

- bound to this node (``spec.nodeName``), ``Pending`` and not being deleted;
- asking for that resource, with a container not yet allocated (neither in the pod's
  ``gpufrag.io/gpu-allocated`` annotation nor in the plugin's own record) whose request is ``n``
  — the *first* such container in the kubelet's order (init containers, then app containers),
  since the kubelet allocates a pod's containers in that order;

and the call is taken to be the **oldest** candidate's (``metadata.creationTimestamp``, then
namespace and name: the kubelet admits new pods in creation order). Only then is the pod's
``gpufrag.io/gpu-indices`` annotation read: when it is malformed, names the wrong number of
GPUs, a GPU this node does not have, or an unhealthy GPU, the call fails with a message that
says which pod and what to fix (a record that is wrong is an error, never a reason to pick some
other GPU). The oldest candidate is never skipped for a younger one with a usable annotation:
that would hand the older pod's container the younger pod's GPUs, a GPU the extender did not
choose for it.

**A pod with no record** was placed by a scheduler other than gpufrag-scheduler's bind (the
default kube-scheduler, or gpufrag-scheduler with the extender scoring only). When it asks whole
GPUs its container gets the devices the kubelet chose (:func:`kubelet_choice`), as NVIDIA's
plugin would give them, after the same health check (:func:`takes_kubelet_choice`; off with
``--no-kubelet-fallback``); GetPreferredAllocation steers that choice to the lowest-index GPUs no
gpufrag-placed container holds or is promised (:func:`idle_gpus`), the GPUs the extender's cache
counts such a pod on. A share names no GPU of its own, so a share pod with no record is refused.

**Two identical requests racing** (two pods asking the same count of the same resource, both
waiting): the kubelet admits them one at a time, oldest first, and each call takes the oldest
candidate left, so normally each pod gets its own GPUs. If the kubelet admits the younger first
(the two share a creation second and the kubelet breaks the tie otherwise, or the older one was
bound later), the two swap: each container gets the GPUs the extender chose for the other. The
node then holds exactly the per-GPU load the extender planned (the requests are identical), so
no GPU is over-committed, and ``gpufrag.io/gpu-allocated`` records which GPUs each container
really got; only the pod-to-GPU naming differs from ``gpufrag.io/gpu-indices``.

How a pod's GPUs are split among its containers mirrors the effective request the extender
placed (``scheduler.kube.convert.pod_from_k8s``): app containers take consecutive slices of the
recorded GPUs, in order; an init container runs before them and takes a slice from the start. A
share (below 1000 milli) always names one GPU, and every container asking a fraction gets it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from gpufrag.records import Given, parse_allocated
from node.deviceplugin.config import Kind
from node.gpus import Gpu
from node.health import HealthBoard
from scheduler.core.types import MILLI_PER_GPU
from scheduler.kube.convert import annotations_of, bound_gpus, container_gpus, pod_from_k8s
from scheduler.kube.quantity import QuantityError, parse_quantity

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """One container's request for the resource, in devices (GPUs, or milli-GPU)."""

    name: str
    count: int
    init: bool = False
    memory_mib: int = 0  # its GPU-memory ask (names.gpu_memory), in MiB: a memory share


@dataclass(frozen=True, slots=True)
class PodAsk:
    """What the device plugin needs of one pod, read once per pod version."""

    namespace: str
    name: str
    uid: str
    node: str
    created: str  # RFC 3339 UTC, so it sorts as text
    phase: str
    deleting: bool
    kind: Kind
    containers: tuple[ContainerAsk, ...]  # kubelet order; only those asking the resource
    gpu_count: int = 0  # GPUs the extender places the pod on (pod_from_k8s)
    gpus: tuple[int, ...] | None = None  # the recorded indices; None = unusable (see below)
    gpus_text: str | None = None  # the annotation as written; None = absent
    record: str | None = None  # the extender's signature of the record (gpu-record); None = absent
    allocated: Given = field(default_factory=dict)  # the gpu-allocated annotation
    problem: str = ""  # why the pod cannot be given GPUs at all (bad spec, bad mark)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def order(self) -> tuple[str, str, str]:
        return (self.created, self.namespace, self.name)


def _count(container: Obj, resource: str) -> int:
    resources = container.get("resources") or {}
    # The kubelet's device manager reads limits; extended resources must have limits equal to
    # requests, and a limit alone defaults the request.
    for section in ("limits", "requests"):
        value = (resources.get(section) or {}).get(resource)
        if value is not None:
            quantity = parse_quantity(value)
            if quantity != quantity.to_integral_value() or quantity < 0:
                raise BadInput(f"{value!r} is not a whole number of devices",
                               field=f"{container.get('name')}.{section}.{resource}")
            return int(quantity)
    return 0


def _allocated(text: str | None) -> tuple[Given, str]:
    if text is None:
        return {}, ""
    try:
        return parse_allocated(text), ""
    except BadInput:
        return {}, (f"its allocation mark {text[:200]!r} is not a JSON object of container "
                    f"name -> GPU UUIDs; the plugin does not know what it was given, so it "
                    f"gives it nothing more")


def pod_ask(obj: Obj, names: KubeNames, *, annotation_allocated: str) -> PodAsk | None:
    """The pod as the plugin sees it; None when it asks for neither GPU resource."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    problem = ""
    asks: dict[Kind, list[ContainerAsk]] = {Kind.WHOLE: [], Kind.SHARE: []}
    try:
        for key, init in (("initContainers", True), ("containers", False)):
            memory = [c.memory_mib for c in container_gpus(obj, names, key)]
            for i, container in enumerate(spec.get(key) or ()):
                for kind, resource in ((Kind.WHOLE, names.gpu), (Kind.SHARE, names.gpu_milli)):
                    count = _count(container, resource)
                    if count:
                        asks[kind].append(ContainerAsk(str(container.get("name") or ""),
                                                       count, init, memory[i]))
    except (BadInput, QuantityError, AttributeError, TypeError) as exc:
        problem = f"its GPU request cannot be read: {exc}"
    kinds = [kind for kind, found in asks.items() if found]
    if not kinds and not problem:
        return None
    kind = kinds[0] if kinds else Kind.WHOLE
    gpu_count = 0
    if not problem:
        try:
            gpu_count = pod_from_k8s(obj, names).num_gpu
        except (BadInput, ValueError) as exc:
            problem = f"its GPU request cannot be placed: {exc}"
    annotations = annotations_of(obj)
    allocated, mark_problem = _allocated(annotations.get(annotation_allocated))
    return PodAsk(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=str(spec.get("nodeName") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        phase=str((obj.get("status") or {}).get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        kind=kind,
        containers=tuple(asks[kind]),
        gpu_count=gpu_count,
        gpus=bound_gpus(obj, names),
        gpus_text=annotations.get(names.annotation_gpu_indices),
        record=annotations.get(names.annotation_gpu_record),
        allocated=allocated,
        problem=problem or mark_problem,
    )


def next_container(pod: PodAsk, given: Given) -> ContainerAsk | None:
    """The first container, in the kubelet's order, not yet given its GPUs."""
    for container in pod.containers:
        if container.name not in pod.allocated and container.name not in given:
            return container
    return None


@dataclass(frozen=True, slots=True)
class Candidate:
    pod: PodAsk
    container: ContainerAsk


@dataclass(frozen=True, slots=True)
class Refusal:
    """No GPUs for this call, and why, in words for the pod's Events."""

    message: str
    pod: PodAsk | None = None  # the pod the message is about, when there is one


def find(pods: Iterable[PodAsk], kind: Kind, count: int, *, node: str, resource: str,
         given: Mapping[str, Given]) -> Candidate | Refusal:
    """The oldest candidate for a call of ``count`` devices (module docstring)."""
    best: Candidate | None = None
    waiting: list[str] = []
    for pod in pods:
        if (pod.kind is not kind or pod.node != node or pod.phase != "Pending"
                or pod.deleting):
            continue
        container = next_container(pod, given.get(pod.uid, {}))
        if container is None:
            continue
        if container.count != count:
            waiting.append(f"{pod.key} ({container.count})")
            continue
        if best is None or pod.order < best.pod.order:
            best = Candidate(pod, container)
    if best is not None:
        return best
    others = (f"; pods waiting here ask other amounts: {', '.join(sorted(waiting)[:5])}"
              if waiting else "")
    return Refusal(f"no pod on node {node} is waiting for {count} {resource}{others}; the "
                   f"kubelet and the device plugin disagree about which pods are pending (a "
                   f"pod bound moments ago: the kubelet retries)")


def takes_kubelet_choice(pod: PodAsk, *, kubelet_fallback: bool) -> bool:
    """True for a pod whose containers get the devices the kubelet chose: readable, whole
    GPUs, no ``gpu-indices`` record at all (module docstring)."""
    return (kubelet_fallback and pod.kind is Kind.WHOLE and pod.gpus_text is None
            and not pod.problem)


def kubelet_choice(pod: PodAsk, board: HealthBoard,
                   device_ids: Sequence[str]) -> tuple[Gpu, ...] | Refusal:
    """The GPUs of the whole-GPU devices the kubelet chose (their IDs are GPU UUIDs), in index
    order, or why the container gets none (a device not of this node, or unhealthy)."""
    found: list[Gpu] = []
    for device_id in device_ids:
        gpu = board.by_uuid.get(device_id)
        if gpu is None:
            return Refusal(f"pod {pod.key}: the kubelet chose device {device_id[:80]!r}, which "
                           f"is not a GPU of node {pod.node} (its GPUs: "
                           f"{', '.join(g.uuid for g in board.gpus)})", pod)
        if gpu in found:
            return Refusal(f"pod {pod.key}: the kubelet named GPU {gpu.index} ({gpu.uuid}) "
                           f"twice for one container", pod)
        found.append(gpu)
    return _healthy(pod, tuple(sorted(found, key=lambda gpu: gpu.index)), board, "the kubelet")


def _healthy(pod: PodAsk, gpus: tuple[Gpu, ...], board: HealthBoard,
             chooser: str) -> tuple[Gpu, ...] | Refusal:
    """``gpus``, or the refusal naming the first unhealthy one and who chose it."""
    for gpu in gpus:
        if not board.is_healthy(gpu.uuid):
            why = board.reason(gpu.uuid) or "reported by NVML"
            return Refusal(f"pod {pod.key}: GPU {gpu.index} ({gpu.uuid}), chosen for it by "
                           f"{chooser}, is unhealthy ({why}); no new container is given it", pod)
    return gpus


def holders(pods: Iterable[PodAsk], board: HealthBoard,
            given: Mapping[str, Given]) -> dict[str, list[str]]:
    """GPU UUID -> the pods (``ns/name``) holding it: by the allocation marks and ``given`` (the
    plugin's own record), or promised it by their ``gpu-indices``. The kubelet's books cannot
    say this: they count whole GPUs and shares as two resources, and a recorded pod it has not
    admitted yet as nothing."""
    held: dict[str, list[str]] = {}
    for pod in pods:
        if pod.deleting:
            continue
        uuids = {u for got in (*pod.allocated.values(), *given.get(pod.uid, {}).values())
                 for u in got}
        uuids.update(board.gpus[i].uuid for i in pod.gpus or () if i < len(board.gpus))
        for uuid in uuids:
            held.setdefault(uuid, []).append(pod.key)
    return held


def idle_gpus(pods: Iterable[PodAsk], board: HealthBoard,
              given: Mapping[str, Given]) -> tuple[str, ...]:
    """UUIDs, in index order, of the healthy GPUs no pod :func:`holders` names."""
    held = holders(pods, board, given)
    return tuple(gpu.uuid for gpu in board.gpus
                 if gpu.uuid not in held and board.is_healthy(gpu.uuid))


def _unrecorded(pod: PodAsk, names: KubeNames) -> str:
    """Why a pod with no ``gpu-indices`` record gets nothing (the kubelet's choice not taken)."""
    key, scheduler = names.annotation_gpu_indices, names.scheduler_name
    if pod.kind is Kind.SHARE:
        return (f"pod {pod.key} asks {names.gpu_milli} and has no {key} annotation: a share "
                f"names no GPU, so only {scheduler}'s bind, which records the GPU, can place "
                f"it (set spec.schedulerName: {scheduler}, with the extender's bindVerb "
                f"configured); pods of other schedulers can ask whole GPUs ({names.gpu})")
    return (f"pod {pod.key} has no {key} annotation, and this device plugin runs with "
            f"--no-kubelet-fallback, so it gives GPUs only to pods {scheduler}'s bind placed "
            f"(set spec.schedulerName: {scheduler}, with the extender's bindVerb configured)")


def resolve(candidate: Candidate, board: HealthBoard,
            names: KubeNames) -> tuple[Gpu, ...] | Refusal:
    """The GPUs recorded for ``candidate``'s container, or why it gets none; for a pod that
    :func:`takes_kubelet_choice` the caller asks :func:`kubelet_choice` instead."""
    pod, container = candidate.pod, candidate.container
    key = names.annotation_gpu_indices
    if pod.problem:
        return Refusal(f"pod {pod.key}: {pod.problem}", pod)
    if pod.gpus_text is None:
        return Refusal(_unrecorded(pod, names), pod)
    if pod.gpus is None:
        return Refusal(f"pod {pod.key} has {key}={pod.gpus_text!r}, which is not "
                       f"comma-separated GPU indices such as '0' or '0,3'", pod)
    if len(pod.gpus) != pod.gpu_count:
        return Refusal(f"pod {pod.key} has {key}={pod.gpus_text!r}: {len(pod.gpus)} GPU(s) for "
                       f"a request of {pod.gpu_count}", pod)
    if len(set(pod.gpus)) != len(pod.gpus):
        return Refusal(f"pod {pod.key} has {key}={pod.gpus_text!r}: a GPU named twice", pod)
    gpus = board.gpus
    for index in pod.gpus:
        if index >= len(gpus):
            return Refusal(f"pod {pod.key} has {key}={pod.gpus_text!r}: GPU {index} does not "
                           f"exist on node {pod.node}, which has {len(gpus)} "
                           f"(0..{len(gpus) - 1})", pod)
    chosen = _split(pod, container)
    if isinstance(chosen, Refusal):
        return chosen
    return _healthy(pod, tuple(gpus[index] for index in chosen), board, "the extender")


def _split(pod: PodAsk, container: ContainerAsk) -> tuple[int, ...] | Refusal:
    """The slice of the pod's recorded GPUs that ``container`` gets."""
    assert pod.gpus is not None
    if pod.kind is Kind.SHARE:
        if container.count % MILLI_PER_GPU and len(pod.gpus) == 1:
            return pod.gpus  # a fraction of the pod's one GPU
        if container.count % MILLI_PER_GPU:
            return Refusal(f"pod {pod.key}: container {container.name!r} asks a fraction "
                           f"({container.count} milli) of a pod spread over "
                           f"{len(pod.gpus)} GPUs; ask whole GPUs in every container", pod)
        width = container.count // MILLI_PER_GPU
        units = [c.count // MILLI_PER_GPU for c in pod.containers
                 if not c.init and c.count % MILLI_PER_GPU == 0]
    else:
        width = container.count
        units = [c.count for c in pod.containers if not c.init]
    start = 0
    if not container.init:
        app = [c for c in pod.containers if not c.init and
               (pod.kind is Kind.WHOLE or c.count % MILLI_PER_GPU == 0)]
        start = sum(units[:app.index(container)])
    chosen = pod.gpus[start:start + width]
    if len(chosen) != width:
        return Refusal(f"pod {pod.key}: its containers ask more GPUs than the "
                       f"{len(pod.gpus)} recorded for it", pod)
    return chosen
