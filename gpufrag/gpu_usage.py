"""The schema of the Node annotation ``gpufrag.io/gpu-usage``: what each GPU on a node is using.

The node agent writes it; the extender (for the MIG instances in use), the defrag controller,
the demo and ``gpufrag inspect`` read it with :func:`parse`. This module is the one definition
of that JSON, so every side imports it rather than poke at dictionaries. It lives in the shared
base, below every component that reads it: the readers depend on the format, never on the agent
that writes it. It depends on nothing but the standard library, orjson and
:mod:`gpufrag.errors`.

Example (``version`` lets the schema grow without breaking readers)::

    {"version": 1, "node": "gpu-node-7", "timestamp": 1732900000.0, "interval_s": 15.0,
     "gpus": [{"index": 0, "uuid": "GPU-5a3c...", "product": "NVIDIA A100-SXM4-80GB",
               "memory_used_mib": 30512, "memory_total_mib": 81920, "utilization_pct": 63,
               "pods": [{"namespace": "serving", "name": "llama-7b-0", "uid": "0b8f...",
                         "memory_used_mib": 30000, "peak_mib": 31200,
                         "peak_since": 1732300000.0}],
               "strays": [{"pid": 7070, "memory_used_mib": 256, "reason": "no_pod"}]}]}

Memory is in MiB (as ``nvidia-smi`` and DCGM report it), utilisation in whole percent over the
driver's last sample period. ``timestamp`` is the wall-clock time of the NVML reading. A GPU's
``memory_used_mib`` minus the sum of its pods' is memory held by processes that are not in a pod
(or whose pod could not be resolved) plus the driver's own reservations.

A GPU's ``strays`` are its processes that belong to no live pod on the node (:data:`STRAY_REASONS`
says why each can be), so ``gpufrag inspect`` can show who holds memory nobody asked for. The key
is written only when there is one (an annotation without it, as an older agent wrote, reads as
none), and readers that predate it ignore it: the schema version stays 1.

A GPU in MIG mode carries ``mig``: its GPU instances as NVML's MIG calls report them, one entry
each, sorted by ``start``::

    "mig": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-9e1c...", "memory_used_mib": 20480,
             "memory_total_mib": 40192, "utilization_pct": null, "pods": ["0b8f..."]}]

``profile`` is the name the NVIDIA device plugin's resource uses (``nvidia.com/mig-3g.40gb``),
``start`` the first memory slice the instance takes (NVML's placement start), ``pods`` the uids
of the pods whose processes run on it (any pod listed here is also in the GPU's ``pods``).
``utilization_pct`` is null where the driver has no per-instance figure (an A100 has none; an
H100 gives one through GPM). The slices an instance takes follow from its profile and the GPU's
product (:mod:`scheduler.core.mig`, the one home of MIG geometry), so a reader with that table
can tell which slice positions are free; this schema only checks what it can alone (a start in
0..7, unique starts and uuids). The key is absent on GPUs not in MIG mode, so older readers and
older annotations are unaffected and the schema version stays 1.

A pod's ``peak_mib`` is the most it used on that GPU over the agent's window
(``--peak-window-s``, the recommender's 7 days by default) as far back as ``peak_since`` (the
later of the window's start and when the agent first saw the pod there: an agent restart
starts it again). It is what the defrag trigger reads (memory reserved and not touched over
the window); readers of annotations without it take the current figure as the peak.

The agent republishes at least every :data:`REFRESH_INTERVALS` intervals even when nothing
changed, so a reader can tell a live annotation from one left by a dead agent with
:meth:`NodeGpuUsage.is_stale`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gpufrag.errors import BadInput

SCHEMA_VERSION = 1
# The agent republishes an unchanged reading after this many intervals ...
REFRESH_INTERVALS = 4
# ... so a reading older than this many intervals means the agent stopped publishing.
STALE_AFTER_INTERVALS = 2 * REFRESH_INTERVALS

# Why a GPU process belongs to no live pod (node.agent.cgroup.PodResolver.stray_reason), and
# what that means, in words for people.
STRAY_REASONS: Mapping[str, str] = {
    "pod_gone": "its pod is gone from this node",
    "no_pod": "it runs in no pod",
}


@dataclass(frozen=True, slots=True)
class PodGpuUsage:
    """GPU memory one pod's processes hold on one GPU now, and the most they held over the
    window since ``peak_since`` (None: not known, as from an agent before peaks)."""

    namespace: str
    name: str
    uid: str
    memory_used_mib: int
    peak_mib: int | None = None
    peak_since: float | None = None

    @property
    def window_peak_mib(self) -> int:
        """The peak over the window, never below the current figure."""
        return self.memory_used_mib if self.peak_mib is None else max(self.peak_mib,
                                                                       self.memory_used_mib)


@dataclass(frozen=True, slots=True)
class StrayProcess:
    """A process holding memory on one GPU that belongs to no live pod on the node: the memory
    counts as used on its GPU (no share looks free) but nobody asked for it, and nothing gives
    it back until the process exits. ``reason`` is a key of :data:`STRAY_REASONS`."""

    pid: int
    memory_used_mib: int
    reason: str

    @property
    def why(self) -> str:
        return STRAY_REASONS.get(self.reason, self.reason)

    def message(self, gpu_index: int, gpu_uuid: str) -> str:
        """The one sentence for people (the agent's Node Event, ``gpufrag inspect``)."""
        return (f"process {self.pid} holds {self.memory_used_mib} MiB on GPU {gpu_index} "
                f"({gpu_uuid}) and {self.why}: the memory stays taken until it exits")


MIG_SLICES = 8  # memory slices of a MIG-capable GPU: a start is one of 0..7


@dataclass(frozen=True, slots=True)
class MigInstanceUsage:
    """One MIG GPU instance of a GPU in MIG mode: where it sits, what it holds, who uses it."""

    profile: str
    start: int
    uuid: str
    memory_used_mib: int
    memory_total_mib: int
    utilization_pct: int | None = None
    pods: tuple[str, ...] = ()  # uids, sorted

    @property
    def in_use(self) -> bool:
        """An instance is taken when a pod runs on it or anything holds its memory."""
        return bool(self.pods) or self.memory_used_mib > 0


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One GPU as NVML saw it, the pods using it (sorted by namespace, name) and the processes
    on it that belong to no live pod (sorted by pid)."""

    index: int
    uuid: str
    product: str
    memory_used_mib: int
    memory_total_mib: int
    utilization_pct: int
    pods: tuple[PodGpuUsage, ...] = ()
    strays: tuple[StrayProcess, ...] = ()
    mig: tuple[MigInstanceUsage, ...] = ()  # empty: not in MIG mode

    @property
    def mig_mode(self) -> bool:
        return bool(self.mig)

    @property
    def memory_free_mib(self) -> int:
        return max(self.memory_total_mib - self.memory_used_mib, 0)

    @property
    def memory_unattributed_mib(self) -> int:
        """Used memory not held by any listed pod (host processes, driver reservations)."""
        return max(self.memory_used_mib - sum(p.memory_used_mib for p in self.pods), 0)


@dataclass(frozen=True, slots=True)
class NodeGpuUsage:
    """Every GPU of one node at one moment; the value of the node's usage annotation."""

    node: str
    timestamp: float
    interval_s: float
    gpus: tuple[GpuUsage, ...] = ()

    def to_json(self) -> str:
        """Compact JSON, keys in a fixed order, so equal readings give equal annotations."""
        return orjson.dumps(_to_dict(self)).decode()

    def age_s(self, now: float) -> float:
        return now - self.timestamp

    def is_stale(self, now: float, max_intervals: float = STALE_AFTER_INTERVALS) -> bool:
        """True when the reading is older than ``max_intervals`` publishing intervals.

        The agent skips publishing unchanged readings for up to :data:`REFRESH_INTERVALS`
        intervals, so ``max_intervals`` below that would call a healthy agent's reading stale.
        """
        return now - self.timestamp > max_intervals * self.interval_s

    def changed_beyond(self, other: NodeGpuUsage, tolerance_mib: int, tolerance_pct: int) -> bool:
        """True when ``other`` differs from this reading by more than noise.

        Any change of shape counts (node, interval, the set of GPUs, a GPU's product or total
        memory, which pods or stray processes are on a GPU, and why a stray is one). Numbers
        count when they move by more than the tolerance: memory (per GPU, per pod and per stray)
        by ``tolerance_mib``, utilisation by ``tolerance_pct`` points. Timestamps never count.
        """
        if self.node != other.node or self.interval_s != other.interval_s:
            return True
        theirs_by_index = {gpu.index: gpu for gpu in other.gpus}
        if len(theirs_by_index) != len(self.gpus):
            return True
        for mine in self.gpus:
            theirs = theirs_by_index.get(mine.index)
            if theirs is None or _gpu_changed(mine, theirs, tolerance_mib, tolerance_pct):
                return True
        return False


def _gpu_changed(mine: GpuUsage, theirs: GpuUsage, tolerance_mib: int, tolerance_pct: int) -> bool:
    if (mine.uuid, mine.product, mine.memory_total_mib) != (
        theirs.uuid, theirs.product, theirs.memory_total_mib
    ):
        return True
    if abs(mine.memory_used_mib - theirs.memory_used_mib) > tolerance_mib:
        return True
    if abs(mine.utilization_pct - theirs.utilization_pct) > tolerance_pct:
        return True
    theirs_strays = {stray.pid: stray for stray in theirs.strays}
    if {(s.pid, s.reason) for s in mine.strays} != {(s.pid, s.reason) for s in theirs.strays}:
        return True
    if any(abs(stray.memory_used_mib - theirs_strays[stray.pid].memory_used_mib) > tolerance_mib
           for stray in mine.strays):
        return True
    if _mig_changed(mine.mig, theirs.mig, tolerance_mib, tolerance_pct):
        return True
    theirs_pods = {pod.uid: pod for pod in theirs.pods}
    if theirs_pods.keys() != {pod.uid for pod in mine.pods}:
        return True
    return any(
        abs(pod.memory_used_mib - theirs_pods[pod.uid].memory_used_mib) > tolerance_mib
        or abs(pod.window_peak_mib - theirs_pods[pod.uid].window_peak_mib) > tolerance_mib
        for pod in mine.pods
    )


def _mig_changed(mine: tuple[MigInstanceUsage, ...], theirs: tuple[MigInstanceUsage, ...],
                 tolerance_mib: int, tolerance_pct: int) -> bool:
    """Any change of layout or of who uses an instance counts; numbers beyond the tolerance."""
    if [(i.profile, i.start, i.uuid, i.memory_total_mib, i.pods) for i in mine] != [
            (i.profile, i.start, i.uuid, i.memory_total_mib, i.pods) for i in theirs]:
        return True
    for a, b in zip(mine, theirs, strict=True):
        if abs(a.memory_used_mib - b.memory_used_mib) > tolerance_mib:
            return True
        if (a.utilization_pct is None) != (b.utilization_pct is None):
            return True
        if (a.utilization_pct is not None and b.utilization_pct is not None
                and abs(a.utilization_pct - b.utilization_pct) > tolerance_pct):
            return True
    return False


def _mig_dict(instance: MigInstanceUsage) -> dict[str, Any]:
    return {"profile": instance.profile, "start": instance.start, "uuid": instance.uuid,
            "memory_used_mib": instance.memory_used_mib,
            "memory_total_mib": instance.memory_total_mib,
            "utilization_pct": instance.utilization_pct, "pods": list(instance.pods)}


def _pod_dict(pod: PodGpuUsage) -> dict[str, Any]:
    out: dict[str, Any] = {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid,
                           "memory_used_mib": pod.memory_used_mib}
    if pod.peak_mib is not None and pod.peak_since is not None:
        out["peak_mib"] = pod.peak_mib
        out["peak_since"] = pod.peak_since
    return out


def _gpu_dict(gpu: GpuUsage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "product": gpu.product,
        "memory_used_mib": gpu.memory_used_mib,
        "memory_total_mib": gpu.memory_total_mib,
        "utilization_pct": gpu.utilization_pct,
        "pods": [_pod_dict(pod) for pod in gpu.pods],
    }
    if gpu.strays:  # absent when none: an annotation as small as before, and as old agents wrote
        out["strays"] = [{"pid": s.pid, "memory_used_mib": s.memory_used_mib, "reason": s.reason}
                         for s in gpu.strays]
    if gpu.mig:  # absent when not in MIG mode, as for strays
        out["mig"] = [_mig_dict(instance) for instance in gpu.mig]
    return out


def _to_dict(usage: NodeGpuUsage) -> dict[str, Any]:
    return {
        "version": SCHEMA_VERSION,
        "node": usage.node,
        "timestamp": usage.timestamp,
        "interval_s": usage.interval_s,
        "gpus": [_gpu_dict(gpu) for gpu in usage.gpus],
    }


# --- parsing -----------------------------------------------------------------------------------

_SOURCE = "annotation gpufrag.io/gpu-usage"


def parse(text: str | bytes, *, source: str = _SOURCE) -> NodeGpuUsage:
    """Read and validate an annotation value.

    Raises :class:`BadInput` whose ``field`` is the JSON path of the first bad value
    (``gpus[1].pods[0].memory_used_mib``), so a reader can log exactly what to fix.
    """
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"not valid JSON ({exc})", source=source) from None
    reader = _Reader(source)
    root = reader.obj(doc, "")
    version = reader.integer(root, "version", "", minimum=1)
    if version != SCHEMA_VERSION:
        raise BadInput(
            f"schema version {version} is not supported (this reader knows {SCHEMA_VERSION}); "
            "upgrade the reader",
            source=source, field="version",
        )
    node = reader.string(root, "node", "")
    timestamp = reader.number(root, "timestamp", "", minimum=0.0)
    interval_s = reader.number(root, "interval_s", "", minimum=0.0, exclusive=True)
    gpus = tuple(
        _parse_gpu(reader, item, f"gpus[{i}]")
        for i, item in enumerate(reader.array(root, "gpus", ""))
    )
    _unique(reader, [g.index for g in gpus], "gpus", "index")
    _unique(reader, [g.uuid for g in gpus], "gpus", "uuid")
    return NodeGpuUsage(node=node, timestamp=timestamp, interval_s=interval_s, gpus=gpus)


def _parse_gpu(reader: _Reader, item: object, path: str) -> GpuUsage:
    obj = reader.obj(item, path)
    index = reader.integer(obj, "index", path, minimum=0)
    uuid = reader.string(obj, "uuid", path)
    product = reader.string(obj, "product", path)
    used = reader.integer(obj, "memory_used_mib", path, minimum=0)
    total = reader.integer(obj, "memory_total_mib", path, minimum=0)
    if used > total:
        raise BadInput(
            f"memory_used_mib {used} exceeds memory_total_mib {total}",
            source=reader.source, field=f"{path}.memory_used_mib",
        )
    utilization_pct = reader.integer(obj, "utilization_pct", path, minimum=0, maximum=100)
    pods = tuple(
        _parse_pod(reader, pod, f"{path}.pods[{j}]")
        for j, pod in enumerate(reader.array(obj, "pods", path))
    )
    _unique(reader, [p.uid for p in pods], f"{path}.pods", "uid")
    strays = tuple(
        _parse_stray(reader, stray, f"{path}.strays[{j}]")
        for j, stray in enumerate(reader.array(obj, "strays", path) if "strays" in obj else ())
    )
    _unique(reader, [s.pid for s in strays], f"{path}.strays", "pid")
    mig = tuple(
        _parse_mig(reader, instance, f"{path}.mig[{j}]")
        for j, instance in enumerate(reader.array(obj, "mig", path) if "mig" in obj else ())
    )
    _unique(reader, [i.start for i in mig], f"{path}.mig", "start")
    _unique(reader, [i.uuid for i in mig], f"{path}.mig", "uuid")
    pod_uids = {p.uid for p in pods}
    for j, instance in enumerate(mig):
        for k, uid in enumerate(instance.pods):
            if uid not in pod_uids:
                raise BadInput(f"pod {uid!r} runs on this instance but is not in {path}.pods",
                               source=reader.source, field=f"{path}.mig[{j}].pods[{k}]")
    return GpuUsage(
        index=index, uuid=uuid, product=product, memory_used_mib=used, memory_total_mib=total,
        utilization_pct=utilization_pct, pods=pods, strays=strays,
        mig=tuple(sorted(mig, key=lambda i: i.start)),
    )


def _parse_mig(reader: _Reader, item: object, path: str) -> MigInstanceUsage:
    obj = reader.obj(item, path)
    used = reader.integer(obj, "memory_used_mib", path, minimum=0)
    total = reader.integer(obj, "memory_total_mib", path, minimum=0)
    if used > total:
        raise BadInput(f"memory_used_mib {used} exceeds memory_total_mib {total}",
                       source=reader.source, field=f"{path}.memory_used_mib")
    utilization = None
    if obj.get("utilization_pct") is not None:
        utilization = reader.integer(obj, "utilization_pct", path, minimum=0, maximum=100)
    pods = tuple(reader.array(obj, "pods", path))
    for k, uid in enumerate(pods):
        if not isinstance(uid, str) or not uid:
            raise BadInput(f"expected a non-empty pod uid, got {uid!r}", source=reader.source,
                           field=f"{path}.pods[{k}]")
    if len(set(pods)) != len(pods):
        raise BadInput("a pod uid repeats", source=reader.source, field=f"{path}.pods")
    return MigInstanceUsage(
        profile=reader.string(obj, "profile", path),
        start=reader.integer(obj, "start", path, minimum=0, maximum=MIG_SLICES - 1),
        uuid=reader.string(obj, "uuid", path),
        memory_used_mib=used, memory_total_mib=total, utilization_pct=utilization,
        pods=tuple(sorted(pods)),
    )


def _parse_stray(reader: _Reader, item: object, path: str) -> StrayProcess:
    obj = reader.obj(item, path)
    # Any non-empty reason reads: a newer agent may know a reason this reader does not.
    return StrayProcess(
        pid=reader.integer(obj, "pid", path, minimum=1),
        memory_used_mib=reader.integer(obj, "memory_used_mib", path, minimum=0),
        reason=reader.string(obj, "reason", path),
    )


def _parse_pod(reader: _Reader, item: object, path: str) -> PodGpuUsage:
    obj = reader.obj(item, path)
    peak = peak_since = None
    if "peak_mib" in obj or "peak_since" in obj:  # both, or neither (an older agent)
        peak = reader.integer(obj, "peak_mib", path, minimum=0)
        peak_since = reader.number(obj, "peak_since", path, minimum=0.0)
    return PodGpuUsage(
        namespace=reader.string(obj, "namespace", path),
        name=reader.string(obj, "name", path),
        uid=reader.string(obj, "uid", path),
        memory_used_mib=reader.integer(obj, "memory_used_mib", path, minimum=0),
        peak_mib=peak, peak_since=peak_since,
    )


def _unique(reader: _Reader, values: list[Any], path: str, key: str) -> None:
    seen: dict[Any, int] = {}
    for i, value in enumerate(values):
        if value in seen:
            raise BadInput(
                f"{key} {value!r} repeats {path}[{seen[value]}].{key}",
                source=reader.source, field=f"{path}[{i}].{key}",
            )
        seen[value] = i


class _Reader:
    """Typed field access that names the JSON path of whatever is wrong."""

    def __init__(self, source: str) -> None:
        self.source = source

    def _fail(self, path: str, message: str) -> BadInput:
        return BadInput(message, source=self.source, field=path or "(root)")

    @staticmethod
    def _join(path: str, key: str) -> str:
        return f"{path}.{key}" if path else key

    def obj(self, value: object, path: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self._fail(path, f"expected an object, got {type(value).__name__}")
        return value

    def _get(self, obj: Mapping[str, Any], key: str, path: str) -> Any:
        if key not in obj:
            raise self._fail(self._join(path, key), "missing")
        return obj[key]

    def string(self, obj: Mapping[str, Any], key: str, path: str) -> str:
        value = self._get(obj, key, path)
        if not isinstance(value, str) or not value:
            raise self._fail(self._join(path, key), f"expected a non-empty string, got {value!r}")
        return value

    def integer(self, obj: Mapping[str, Any], key: str, path: str, *, minimum: int,
                maximum: int | None = None) -> int:
        value = self._get(obj, key, path)
        # bool is an int subclass; true/false is never a count of MiB.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._fail(self._join(path, key), f"expected an integer, got {value!r}")
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
            raise self._fail(self._join(path, key), f"{value} is not {bounds}")
        return value

    def number(self, obj: Mapping[str, Any], key: str, path: str, *, minimum: float,
               exclusive: bool = False) -> float:
        value = self._get(obj, key, path)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._fail(self._join(path, key), f"expected a number, got {value!r}")
        number = float(value)
        too_small = number <= minimum if exclusive else number < minimum
        if not math.isfinite(number) or too_small:
            bound = f"> {minimum}" if exclusive else f">= {minimum}"
            raise self._fail(self._join(path, key), f"{value!r} is not a finite number {bound}")
        return number

    def array(self, obj: Mapping[str, Any], key: str, path: str) -> list[Any]:
        value = self._get(obj, key, path)
        if not isinstance(value, list):
            raise self._fail(self._join(path, key), f"expected an array, got {value!r}")
        return value
