"""The schema of the Node annotation ``gpufrag.io/gpu-usage``: what each GPU on a node is using.

The node agent writes it; the defrag controller (and anyone else) reads it with :func:`parse`.
This module is the one definition of that JSON, so both sides import it rather than poke at
dictionaries. It depends on nothing but the standard library, orjson and :mod:`gpufrag.errors`.

Example (``version`` lets the schema grow without breaking readers)::

    {"version": 1, "node": "gpu-node-7", "timestamp": 1732900000.0, "interval_s": 15.0,
     "gpus": [{"index": 0, "uuid": "GPU-5a3c...", "product": "NVIDIA A100-SXM4-80GB",
               "memory_used_mib": 30512, "memory_total_mib": 81920, "utilization_pct": 63,
               "pods": [{"namespace": "serving", "name": "llama-7b-0", "uid": "0b8f...",
                         "memory_used_mib": 30000, "peak_mib": 31200,
                         "peak_since": 1732300000.0}]}]}

Memory is in MiB (as ``nvidia-smi`` and DCGM report it), utilisation in whole percent over the
driver's last sample period. ``timestamp`` is the wall-clock time of the NVML reading. A GPU's
``memory_used_mib`` minus the sum of its pods' is memory held by processes that are not in a pod
(or whose pod could not be resolved) plus the driver's own reservations.

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
class GpuUsage:
    """One GPU as NVML saw it, and the pods using it (sorted by namespace, name)."""

    index: int
    uuid: str
    product: str
    memory_used_mib: int
    memory_total_mib: int
    utilization_pct: int
    pods: tuple[PodGpuUsage, ...] = ()

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
        memory, which pods are on a GPU). Numbers count when they move by more than the
        tolerance: memory (per GPU and per pod) by ``tolerance_mib``, utilisation by
        ``tolerance_pct`` points. Timestamps never count.
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
    theirs_pods = {pod.uid: pod for pod in theirs.pods}
    if theirs_pods.keys() != {pod.uid for pod in mine.pods}:
        return True
    return any(
        abs(pod.memory_used_mib - theirs_pods[pod.uid].memory_used_mib) > tolerance_mib
        or abs(pod.window_peak_mib - theirs_pods[pod.uid].window_peak_mib) > tolerance_mib
        for pod in mine.pods
    )


def _pod_dict(pod: PodGpuUsage) -> dict[str, Any]:
    out: dict[str, Any] = {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid,
                           "memory_used_mib": pod.memory_used_mib}
    if pod.peak_mib is not None and pod.peak_since is not None:
        out["peak_mib"] = pod.peak_mib
        out["peak_since"] = pod.peak_since
    return out


def _to_dict(usage: NodeGpuUsage) -> dict[str, Any]:
    return {
        "version": SCHEMA_VERSION,
        "node": usage.node,
        "timestamp": usage.timestamp,
        "interval_s": usage.interval_s,
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "product": gpu.product,
                "memory_used_mib": gpu.memory_used_mib,
                "memory_total_mib": gpu.memory_total_mib,
                "utilization_pct": gpu.utilization_pct,
                "pods": [_pod_dict(pod) for pod in gpu.pods],
            }
            for gpu in usage.gpus
        ],
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
    return GpuUsage(
        index=index, uuid=uuid, product=product, memory_used_mib=used, memory_total_mib=total,
        utilization_pct=utilization_pct, pods=pods,
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
