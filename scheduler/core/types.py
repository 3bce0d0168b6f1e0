"""Plain value types for nodes, pods and placements.

They carry exactly what placement needs, in the units the openb trace uses (milli-CPU, MiB,
milli-GPU per GPU), so that trace rows, Kubernetes objects and wire requests all convert to the
same thing and every policy sees one shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

MILLI_PER_GPU = 1000
MAX_GPUS_PER_NODE = 16


def share_milli(milli: int, memory_mib: int, gpu_memory_mib: int) -> int:
    """The milli-GPU a share asking ``milli`` of compute and ``memory_mib`` of a GPU with
    ``gpu_memory_mib`` is counted for: the larger of its milli and its memory's part of the GPU
    (rounded up), at least 1. Placement counts it (:meth:`PodRequest.milli_on`) and the device
    plugin hands it to the container: a share's memory and compute are never split apart."""
    return max(milli, math.ceil(memory_mib * MILLI_PER_GPU / gpu_memory_mib), 1)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node's capacity as the scheduler may use it (allocatable, not raw capacity)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_product: str = ""
    gpu_memory_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"node {self.name}: negative cpu_milli or memory_mib")
        if not 0 <= self.gpu_count <= MAX_GPUS_PER_NODE:
            raise ValueError(
                f"node {self.name}: gpu_count {self.gpu_count} outside 0..{MAX_GPUS_PER_NODE}"
            )


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for.

    ``gpu_milli`` is per GPU, as in openb: 1000 for whole GPUs, below 1000 only when
    ``num_gpu == 1`` (a GPU share). ``gpu_spec`` lists acceptable GPU products; empty = any.

    A share may also (or instead) ask for GPU memory: ``gpu_memory_mib`` on its one GPU. How
    much of a GPU that is depends on the node (a 4,000 MiB share is a sixth of a 24 GiB GPU and
    a twentieth of an 80 GiB one), so it is converted per node by :meth:`on_gpu_memory` (the
    larger of the two shares wins); such a pod may have ``gpu_milli == 0`` (memory only).
    """

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_spec: frozenset[str] = frozenset()
    namespace: str = ""
    model: str = ""
    model_version: str = ""
    gpu_memory_mib: int = 0

    def __post_init__(self) -> None:
        if (self.cpu_milli < 0 or self.memory_mib < 0 or self.num_gpu < 0 or self.gpu_milli < 0
                or self.gpu_memory_mib < 0):
            raise ValueError(f"pod {self.name}: negative request")
        if self.num_gpu > MAX_GPUS_PER_NODE:
            raise ValueError(f"pod {self.name}: num_gpu {self.num_gpu} > {MAX_GPUS_PER_NODE}")
        if self.gpu_memory_mib:
            if self.num_gpu != 1:
                raise ValueError(f"pod {self.name}: a GPU-memory share needs num_gpu == 1")
            if self.gpu_milli > MILLI_PER_GPU:
                raise ValueError(f"pod {self.name}: gpu_milli {self.gpu_milli} above 1000")
        elif self.num_gpu > 0 and not 0 < self.gpu_milli <= MILLI_PER_GPU:
            raise ValueError(f"pod {self.name}: gpu_milli {self.gpu_milli} outside 1..1000")
        if self.num_gpu > 1 and self.gpu_milli != MILLI_PER_GPU:
            raise ValueError(f"pod {self.name}: a GPU share (gpu_milli < 1000) needs num_gpu == 1")

    @property
    def wants_gpu(self) -> bool:
        return self.num_gpu > 0

    @property
    def is_share(self) -> bool:
        """A fractional-GPU pod (shares one GPU with others)."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    def milli_on(self, gpu_memory_mib: int) -> int | None:
        """The share of one GPU this pod takes on a node whose GPUs have ``gpu_memory_mib``:
        ``gpu_milli``, or its GPU memory converted (rounded up), whichever is larger; None when
        a memory share cannot be placed there (GPU memory unknown, or smaller than asked)."""
        if not self.gpu_memory_mib:
            return self.gpu_milli
        if gpu_memory_mib <= 0 or self.gpu_memory_mib > gpu_memory_mib:
            return None
        return share_milli(self.gpu_milli, self.gpu_memory_mib, gpu_memory_mib)

    def on_gpu_memory(self, gpu_memory_mib: int) -> PodRequest | None:
        """This request as it is on a node whose GPUs have ``gpu_memory_mib`` (a memory share
        turned into milli-GPU, see :meth:`milli_on`); itself when it asks no GPU memory."""
        if not self.gpu_memory_mib:
            return self
        milli = self.milli_on(gpu_memory_mib)
        if milli is None:
            return None
        return replace(self, gpu_milli=milli, gpu_memory_mib=0)

    @property
    def shape(self) -> tuple[int, int, int, int, frozenset[str], int]:
        """Everything placement depends on, minus identity: pods of one shape score alike."""
        return (self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, self.gpu_spec,
                self.gpu_memory_mib)

    @property
    def clustering_tag(self) -> int:
        """Gandiva-style class: 0 for GPU shares, k for k whole GPUs, -1 for CPU-only."""
        if not self.wants_gpu:
            return -1
        return 0 if self.is_share else self.num_gpu


@dataclass(frozen=True, slots=True)
class Placement:
    """A pod placed on a node, with the GPU indices (on that node) it holds."""

    pod: PodRequest
    node: str
    gpus: tuple[int, ...]
