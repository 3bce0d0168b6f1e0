"""MIG partitions made and destroyed for claims: the node's half of KEP-4815.

kube-scheduler allocated a claim a placement (``gpu-0-mig-3g-40gb-4``: a 3g.40gb instance
at memory slice 4 of GPU 0; :mod:`node.dra.slices`), and the counters it consumed promise
that no other claim holds those slices. Preparing it makes the GPU instance at that
placement and a compute instance spanning it (:class:`gpufrag.mig_instances.MigInstances`), and
the container is given the MIG device's UUID (``NVIDIA_VISIBLE_DEVICES=MIG-...``), with its
GPU's device nodes, through the same grant as a whole GPU. Unpreparing destroys them.

What was made is recorded per claim (a JSON file in the driver's own directory, next to its
socket, which is on the host and outlives the driver's pod): GPU index, GPU instance id,
compute instance id and UUID of each partition. The GPU instance id is written as soon as the
instance exists, before its compute instance is made, so a prepare the kubelet repeats (after
a timeout, or a restart of the driver) uses the instance it made before instead of making a
second one, and an unprepare knows what to destroy even when the claim is gone from the API.
An unprepare with no record has nothing to destroy.

One lock serialises the NVML work: the kubelet may send two claims at once, and two instances
made at once on one GPU would race for NVML's ids.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from structlog.typing import FilteringBoundLogger

from gpufrag.mig_instances import MigInstances, MigShape, MigWriteError
from node.dra.cdi import SpecDir
from node.dra.claims import AllocatedDevice, AllocatedPartition, ClaimProblem
from node.gpus import Gpu
from scheduler.core.types import MILLI_PER_GPU

RECORD_KIND = "gpufrag.io/partitions"  # the record files' name prefix (SpecDir's naming)


class Partitions:
    """Makes, records and destroys the MIG instances of claims (module docstring)."""

    def __init__(self, instances: MigInstances | None, records: SpecDir, *,
                 log: FilteringBoundLogger) -> None:
        self._instances = instances
        self._records = records
        self._log = log
        self._lock = threading.Lock()

    def prepare(self, claim_uid: str, partitions: Sequence[AllocatedPartition]
                ) -> tuple[AllocatedDevice, ...]:
        """Each partition's MIG instance, made where it is not there yet, as the device the
        grant hands out; :class:`ClaimProblem` when NVML refuses."""
        if not partitions:
            return ()
        if self._instances is None:
            raise ClaimProblem("the claim holds MIG partitions, and this driver has no NVML "
                               "to make MIG instances with")
        out = []
        with self._lock:
            record = self.read(claim_uid)
            for part in partitions:
                known = record.get(part.device) or {}
                profile = part.profile
                shape = MigShape(profile.compute, profile.memory_mib, part.start,
                                 profile.slices)

                def made(gi_id: int, device: str = part.device, gpu: int = part.gpu.index
                         ) -> None:
                    record[device] = {"gpu": gpu, "gpu_instance_id": gi_id}
                    self._write(claim_uid, record)

                try:
                    mig = self._instances.ensure(part.gpu.index, shape,
                                                 gpu_instance_id=known.get("gpu_instance_id"),
                                                 on_created=made)
                except MigWriteError as exc:
                    raise ClaimProblem(f"device {part.device!r}: {exc}") from None
                record[part.device] = {"gpu": mig.gpu_index,
                                       "gpu_instance_id": mig.gpu_instance_id,
                                       "compute_instance_id": mig.compute_instance_id,
                                       "uuid": mig.uuid}
                self._write(claim_uid, record)
                self._log.info("mig_instance_ready", claim_uid=claim_uid, device=part.device,
                               uuid=mig.uuid, gpu_instance_id=mig.gpu_instance_id)
                out.append(AllocatedDevice(
                    part.request, part.pool, part.device,
                    Gpu(part.gpu.index, mig.uuid, part.gpu.product, profile.memory_mib),
                    MILLI_PER_GPU, 0, None))
        return tuple(out)

    def unprepare(self, claim_uid: str) -> int:
        """Destroy the claim's MIG instances and forget them; how many were destroyed.
        :class:`MigWriteError` when NVML refuses one (the record stays, for the retry)."""
        with self._lock:
            record = self.read(claim_uid)
            if not record:
                return 0
            if self._instances is None:
                raise MigWriteError("the claim has MIG instances, and this driver has no NVML "
                                    "to destroy them with")
            destroyed = 0
            for device, made in sorted(record.items()):
                if self._instances.destroy(int(made["gpu"]), int(made["gpu_instance_id"]),
                                           int(made.get("compute_instance_id", 0))):
                    destroyed += 1
                self._log.info("mig_instance_destroyed", claim_uid=claim_uid, device=device)
            self._records.remove(claim_uid)
            return destroyed

    def read(self, claim_uid: str) -> dict[str, Mapping[str, Any]]:
        """The claim's record: device name -> what was made for it (empty: none);
        :class:`ClaimProblem` naming the file when it is not one this driver wrote."""
        path = self._records.file_path(claim_uid)
        try:
            with open(path) as found:
                partitions = json.load(found)["partitions"]
            if not isinstance(partitions, dict) or not all(
                    isinstance(made, dict) and isinstance(made.get("gpu"), int)
                    and isinstance(made.get("gpu_instance_id"), int)
                    for made in partitions.values()):
                raise ValueError("a partition without its GPU or GPU instance id")
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError) as exc:
            raise ClaimProblem(f"the MIG record {path!r} is unreadable ({exc}); the "
                               f"instances it named must be destroyed by hand") from None
        return partitions

    def _write(self, claim_uid: str, record: Mapping[str, Mapping[str, Any]]) -> None:
        os.makedirs(self._records.path, exist_ok=True)  # (an OSError is the claim's error)
        self._records.write(claim_uid, {"partitions": dict(record)})
