"""Which MIG instances sit on each node and who holds them: the snapshot's MIG picture.

A pod holding a MIG instance asks no GPU of the placement state (its request reads as CPU and
memory: :func:`scheduler.kube.convert.pod_from_k8s`), so the ``ClusterState`` cannot say where
it runs. Two readings can, and both feed the one representation here (:class:`NodeMig`, each
instance a :class:`~scheduler.core.mig.MigInstance` with its holders):

- **DRA** (``claims``): the partitions a bound pod's claims were allocated on its node
  (:func:`scheduler.kube.claims.listed_pod_partitions`, the one reader), and the GPUs the
  driver's ResourceSlices publish partitions for (:func:`~scheduler.kube.claims.slice_mig_gpus`):
  such a node is shown with its MIG GPUs even while nothing is allocated there;
- **the node agent's fresh reading** (``agent``): every instance NVML lists on a GPU in MIG
  mode, with the pods whose processes run there (the device plugin's static MIG, and a DRA
  instance once its pod runs).

Pure: the snapshot builder passes what it read. An instance both name is one entry, its
holders merged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from defrag.controller.model import MIG_FROM_AGENT, MIG_FROM_CLAIMS, HeldInstance, NodeMig
from gpufrag.gpu_usage import NodeGpuUsage
from scheduler.core.mig import MigInstance
from scheduler.kube.claims import MigPartition, SliceMigGpu

_Key = tuple[int, int, str]  # GPU, start, profile


def mig_in_use(dynamic: Mapping[str, Mapping[int, SliceMigGpu]],
               held: Mapping[str, Sequence[tuple[str, MigPartition]]],
               readings: Mapping[str, NodeGpuUsage],
               key_by_uid: Mapping[str, str]) -> dict[str, NodeMig]:
    """Each node with a GPU in MIG mode and its instances (module docstring). ``dynamic``:
    the DRA driver's MIG GPUs by node and index (read from its slices); ``held``: node ->
    (pod key, partition) of its bound pods' claims; ``readings``: the agent's fresh
    readings; ``key_by_uid``: the pods' keys (a reading names pods by UID; one not listed
    keeps it)."""
    nodes = sorted({*dynamic, *held,
                    *(n for n, r in readings.items() if any(g.mig_mode for g in r.gpus))})
    found: dict[str, NodeMig] = {}
    for node in nodes:
        gpus = {index: gpu.product for index, gpu in dynamic.get(node, {}).items()}
        pods: dict[_Key, set[str]] = {}
        sources: dict[_Key, set[str]] = {}
        for key, partition in held.get(node, ()):
            spot = (partition.index, partition.start, partition.profile)
            pods.setdefault(spot, set()).add(key)
            sources.setdefault(spot, set()).add(MIG_FROM_CLAIMS)
            gpus.setdefault(partition.index, "")
        reading = readings.get(node)
        for gpu in reading.gpus if reading is not None else ():
            if not gpu.mig_mode:
                continue
            gpus[gpu.index] = gpus.get(gpu.index) or gpu.product
            for instance in gpu.mig:
                spot = (gpu.index, instance.start, instance.profile)
                pods.setdefault(spot, set()).update(key_by_uid.get(uid, uid)
                                                    for uid in instance.pods)
                sources.setdefault(spot, set()).add(MIG_FROM_AGENT)
        instances = tuple(
            HeldInstance(MigInstance(index, profile, start, bool(pods[(index, start, profile)])),
                         tuple(sorted(pods[(index, start, profile)])),
                         tuple(sorted(sources[(index, start, profile)])))
            for index, start, profile in sorted(pods))
        found[node] = NodeMig(dict(sorted(gpus.items())), instances, node in dynamic)
    return found
