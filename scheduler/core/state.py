"""ClusterState: the cluster as numpy arrays, one row per node.

Policies score every candidate node at once, so the per-node quantities they read (CPU and
memory left, each GPU's free share, GPU product, the Gandiva tags present) are columns of
arrays rather than attributes of node objects. Node rows never move once assigned; a removed
node is marked inactive and its row is reused if a node of the same name comes back, so pod
placements can keep row indices. Every change to a row bumps that row's ``version`` so score
caches know exactly which rows to recompute.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from scheduler.core.types import MAX_GPUS_PER_NODE, MILLI_PER_GPU, NodeSpec, Placement, PodRequest

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

ModelKey = tuple[str, str]  # (model, version)


def pod_key(pod: PodRequest) -> str:
    return f"{pod.namespace}/{pod.name}" if pod.namespace else pod.name


class PlacementError(ValueError):
    """A placement that would exceed a capacity: a bug in the caller, never a verdict."""


class ClusterState:
    """Nodes, their free resources and the pods placed on them."""

    def __init__(self, nodes: Iterable[NodeSpec] = ()) -> None:
        node_list = list(nodes)
        capacity = max(16, len(node_list))
        width = max([1, *(n.gpu_count for n in node_list)])
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.labels: list[Mapping[str, str]] = []
        self.products: list[str] = []
        self.product_index: dict[str, int] = {}
        self._alloc(capacity, width)
        self.pods: dict[str, Placement] = {}
        self.pods_on_node: list[set[str]] = []
        # Model-version replicas per node, and when a replica last left a node (warm window).
        self.replicas: dict[ModelKey, Counter[int]] = {}
        self.model_last_seen: dict[ModelKey, dict[int, float]] = {}
        self._tie_rank: IntArray | None = None
        for spec in node_list:
            self.add_node(spec)

    # ------------------------------------------------------------------ storage
    def _alloc(self, capacity: int, width: int) -> None:
        self.cpu_cap = np.zeros(capacity, np.int64)
        self.mem_cap = np.zeros(capacity, np.int64)
        self.cpu_left = np.zeros(capacity, np.int64)
        self.mem_left = np.zeros(capacity, np.int64)
        self.gpu_count = np.zeros(capacity, np.int64)
        self.gpu_memory_mib = np.zeros(capacity, np.int64)
        self.gpu_free = np.zeros((capacity, width), np.int64)
        self.product = np.full(capacity, -1, np.int64)
        self.active = np.zeros(capacity, np.bool_)
        self.version = np.zeros(capacity, np.int64)
        # tag_counts[n, 0] = GPU-share pods on n, tag_counts[n, k] = k-GPU pods on n.
        self.tag_counts = np.zeros((capacity, MAX_GPUS_PER_NODE + 1), np.int64)
        # Per-row GPU summaries that make the feasibility test one comparison per row:
        # the largest free share on one GPU, and how many GPUs are fully free.
        self.gpu_max_free = np.zeros(capacity, np.int64)
        self.gpu_full_count = np.zeros(capacity, np.int64)

    _ARRAYS = ("cpu_cap", "mem_cap", "cpu_left", "mem_left", "gpu_count", "gpu_memory_mib",
               "gpu_free", "product", "active", "version", "tag_counts",
               "gpu_max_free", "gpu_full_count")

    def _grow(self, rows: int, width: int) -> None:
        old = {name: getattr(self, name) for name in self._ARRAYS}
        self._alloc(rows, width)
        for name, arr in old.items():
            getattr(self, name)[tuple(slice(0, s) for s in arr.shape)] = arr

    @property
    def size(self) -> int:
        """Rows in use (active or not); arrays are longer, so slice with ``[: state.size]``."""
        return len(self.names)

    @property
    def gpu_width(self) -> int:
        return int(self.gpu_free.shape[1])

    # ------------------------------------------------------------------ nodes
    def product_code(self, product: str) -> int:
        code = self.product_index.get(product)
        if code is None:
            code = len(self.products)
            self.products.append(product)
            self.product_index[product] = code
        return code

    def add_node(self, spec: NodeSpec) -> int:
        """Add a node, or update its capacity if the name is known; returns its row."""
        row = self.index.get(spec.name)
        if row is None:
            row = len(self.names)
            if row >= self.cpu_cap.shape[0] or spec.gpu_count > self.gpu_width:
                self._grow(max(row + 1, 2 * self.cpu_cap.shape[0]),
                           max(self.gpu_width, spec.gpu_count))
            self.names.append(spec.name)
            self.index[spec.name] = row
            self.labels.append(spec.labels)
            self.pods_on_node.append(set())
            self._tie_rank = None
        elif spec.gpu_count > self.gpu_width:
            self._grow(self.cpu_cap.shape[0], spec.gpu_count)
        self.labels[row] = spec.labels
        self.cpu_cap[row] = spec.cpu_milli
        self.mem_cap[row] = spec.memory_mib
        self.gpu_count[row] = spec.gpu_count
        self.gpu_memory_mib[row] = spec.gpu_memory_mib
        self.product[row] = self.product_code(spec.gpu_product)
        self.active[row] = True
        self._recompute_row(row)
        return row

    def remove_node(self, name: str) -> list[Placement]:
        """Mark a node gone; returns the placements it held (they are dropped too)."""
        row = self.index[name]
        dropped = [self.remove_pod(key) for key in list(self.pods_on_node[row])]
        self.active[row] = False
        self.version[row] += 1
        return dropped

    def node_spec(self, row: int) -> NodeSpec:
        return NodeSpec(
            name=self.names[row],
            cpu_milli=int(self.cpu_cap[row]),
            memory_mib=int(self.mem_cap[row]),
            gpu_count=int(self.gpu_count[row]),
            gpu_product=self.products[int(self.product[row])],
            gpu_memory_mib=int(self.gpu_memory_mib[row]),
            labels=self.labels[row],
        )

    def _recompute_row(self, row: int) -> None:
        """Rebuild a row's free resources from its capacity and the pods it holds."""
        self.cpu_left[row] = self.cpu_cap[row]
        self.mem_left[row] = self.mem_cap[row]
        self.gpu_free[row, :] = 0
        self.gpu_free[row, : self.gpu_count[row]] = MILLI_PER_GPU
        self.tag_counts[row, :] = 0
        for key in self.pods_on_node[row]:
            p = self.pods[key]
            self.cpu_left[row] -= p.pod.cpu_milli
            self.mem_left[row] -= p.pod.memory_mib
            for g in p.gpus:
                self.gpu_free[row, g] -= p.pod.gpu_milli
            if p.pod.wants_gpu:
                self.tag_counts[row, p.pod.clustering_tag] += 1
        self._row_changed(row)

    def _row_changed(self, row: int) -> None:
        free = self.gpu_free[row]
        self.gpu_max_free[row] = free.max()
        self.gpu_full_count[row] = np.count_nonzero(free == MILLI_PER_GPU)
        self.version[row] += 1

    # ------------------------------------------------------------------ pods
    def place(self, pod: PodRequest, node: int | str, gpus: tuple[int, ...],
              *, check: bool = True) -> Placement:
        """Account a pod on a node and GPUs. ``check=False`` trusts the caller (the live
        cluster is the truth even if it over-commits; the simulator checks)."""
        row = self.index[node] if isinstance(node, str) else node
        key = pod_key(pod)
        if pod.gpu_memory_mib:
            # Accounted as the milli-GPU share it is on this node's GPUs. On a node whose GPU
            # memory is unknown (or smaller than asked) the live cluster still runs the pod:
            # count the whole GPU, never less than it may use.
            resolved = pod.on_gpu_memory(int(self.gpu_memory_mib[row]))
            if resolved is None and check:
                raise PlacementError(f"pod {key}: {pod.gpu_memory_mib} MiB of GPU memory does "
                                     f"not fit the GPUs of {self.names[row]}")
            pod = resolved or dataclasses.replace(pod, gpu_milli=MILLI_PER_GPU,
                                                  gpu_memory_mib=0)
        if key in self.pods:
            raise PlacementError(f"pod {key} is already placed on {self.pods[key].node}")
        if len(gpus) != pod.num_gpu:
            raise PlacementError(f"pod {key} needs {pod.num_gpu} GPUs, got {gpus}")
        if check:
            self._check_fits(pod, row, gpus)
        self.cpu_left[row] -= pod.cpu_milli
        self.mem_left[row] -= pod.memory_mib
        for g in gpus:
            self.gpu_free[row, g] -= pod.gpu_milli
        if pod.wants_gpu:
            self.tag_counts[row, pod.clustering_tag] += 1
        self._row_changed(row)
        placement = Placement(pod=pod, node=self.names[row], gpus=gpus)
        self.pods[key] = placement
        self.pods_on_node[row].add(key)
        if pod.model:
            self.replicas.setdefault((pod.model, pod.model_version), Counter())[row] += 1
        return placement

    def _check_fits(self, pod: PodRequest, row: int, gpus: tuple[int, ...]) -> None:
        name = self.names[row]
        if not self.active[row]:
            raise PlacementError(f"node {name} is not active")
        if pod.cpu_milli > self.cpu_left[row] or pod.memory_mib > self.mem_left[row]:
            raise PlacementError(f"pod {pod.name} exceeds CPU or memory left on {name}")
        if len(set(gpus)) != len(gpus):
            raise PlacementError(f"pod {pod.name}: duplicate GPU indices {gpus}")
        for g in gpus:
            if not 0 <= g < self.gpu_count[row] or self.gpu_free[row, g] < pod.gpu_milli:
                raise PlacementError(f"pod {pod.name}: GPU {g} on {name} cannot hold "
                                     f"{pod.gpu_milli} milli")

    def remove_pod(self, key: str, *, now: float | None = None) -> Placement:
        """Release a pod's resources; ``now`` records when its model version left the node."""
        placement = self.pods.pop(key)
        row = self.index[placement.node]
        pod = placement.pod
        self.pods_on_node[row].discard(key)
        self.cpu_left[row] += pod.cpu_milli
        self.mem_left[row] += pod.memory_mib
        for g in placement.gpus:
            self.gpu_free[row, g] += pod.gpu_milli
        if pod.wants_gpu:
            self.tag_counts[row, pod.clustering_tag] -= 1
        self._row_changed(row)
        if pod.model:
            mk = (pod.model, pod.model_version)
            counts = self.replicas[mk]
            counts[row] -= 1
            if counts[row] <= 0:
                del counts[row]
            if now is not None:
                self.model_last_seen.setdefault(mk, {})[row] = now
        return placement

    # ------------------------------------------------------------------ views
    def active_rows(self) -> IntArray:
        return np.flatnonzero(self.active[: self.size]).astype(np.int64)

    def gpu_free_total(self, rows: IntArray | None = None) -> IntArray:
        free = self.gpu_free[: self.size] if rows is None else self.gpu_free[rows]
        total: IntArray = free.sum(axis=1)
        return total

    @property
    def total_gpu_milli(self) -> int:
        n = self.size
        return int(self.gpu_count[:n][self.active[:n]].sum()) * MILLI_PER_GPU

    @property
    def allocated_gpu_milli(self) -> int:
        rows = self.active_rows()
        return self.total_gpu_milli - int(self.gpu_free[rows].sum())

    @property
    def max_cpu_milli(self) -> int:
        """The largest node's CPU: the normaliser of the dotprod and bestfit baselines."""
        return max(1, int(self.cpu_cap[: self.size].max(initial=0)))

    @property
    def max_gpu_milli(self) -> int:
        return max(1, int(self.gpu_count[: self.size].max(initial=0)) * MILLI_PER_GPU)

    def set_tie_order(self, rank: IntArray) -> None:
        """Fix the order that breaks score ties (lower rank wins); one per simulator seed."""
        if rank.shape[0] != self.size:
            raise ValueError(f"tie order has {rank.shape[0]} entries, state has {self.size} nodes")
        self._tie_rank = rank.astype(np.int64)

    @property
    def tie_rank(self) -> IntArray:
        """Default tie order: node name, stable across restarts and replicas of the extender."""
        if self._tie_rank is None or self._tie_rank.shape[0] != self.size:
            order = sorted(range(self.size), key=self.names.__getitem__)
            rank = np.empty(self.size, np.int64)
            rank[order] = np.arange(self.size)
            self._tie_rank = rank
        return self._tie_rank
