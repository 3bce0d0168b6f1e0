"""This node's GPUs and what a container is given of them: shared by both delivery paths.

The kubelet device plugin (:mod:`node.deviceplugin`) and the DRA driver (:mod:`node.dra`) hand
containers the same GPUs in the same way, so the pieces they share live here, once:

- :class:`Gpu` and :func:`read_inventory`: the GPUs as read through the shared NVML adapter;
- :class:`DeviceNodes`: which ``/dev/nvidia*`` nodes exist, found once at start;
- :func:`container_grant`: the environment, device nodes and mounts a container gets.

What a container gets:

- ``NVIDIA_VISIBLE_DEVICES=<UUIDs of exactly the chosen GPUs>`` (read by the NVIDIA container
  runtime), and the device nodes ``/dev/nvidia<index>`` of those GPUs plus the driver's control
  devices, each only where it exists on this node;
- for a share of one GPU (compute below 1000 milli, or a GPU-memory ask): ``GPUFRAG_GPU_MILLI``
  and ``GPUFRAG_GPU_MEMORY_LIMIT_MIB`` for the workload to honour (soft limits: the memory asked,
  else the milli share of the GPU's memory; the compute at least that memory's share, as
  placement counts it); with MPS also ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the share in
  percent, rounded up) and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=<MiB>M``: the container
  sees its one GPU as device 0), which CUDA enforces under an MPS control daemon, and with an
  MPS pipe directory that directory mounted and named in ``CUDA_MPS_PIPE_DIRECTORY``.

The ``/dev/nvidia<index>`` node uses NVML's index as the minor number, which holds on the usual
single-driver node; the shared NVML adapter does not read ``nvmlDeviceGetMinorNumber``.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpufrag.errors import BadInput
from gpufrag.nvml import NvmlReader
from scheduler.core.types import MILLI_PER_GPU, share_milli
from scheduler.kube.convert import milli_memory_mib

# The driver's control devices every CUDA container needs besides /dev/nvidiaN.
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of this node as the plugin advertises it."""

    index: int
    uuid: str
    product: str
    memory_total_mib: int


def read_inventory(reader: NvmlReader) -> tuple[Gpu, ...]:
    """Every GPU with its total memory; raises :class:`GpuReadError` when NVML fails."""
    gpus = []
    for identity in reader.inventory():
        memory = reader.read_memory(identity.index)
        gpus.append(Gpu(identity.index, identity.uuid, identity.product,
                        memory.memory_total_mib))
    return tuple(gpus)


class GrantSettings(Protocol):
    """The settings a grant reads (each plugin's frozen config has them)."""

    @property
    def mps(self) -> bool: ...  # set CUDA_MPS_* limits for shares (an MPS daemon runs)

    @property
    def mps_pipe_dir(self) -> str: ...  # host dir of the MPS pipes ("" = none)

    @property
    def dev_root(self) -> str: ...  # where the plugin sees the host's device nodes

    @property
    def control_devices(self) -> tuple[str, ...]: ...


def add_grant_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`GrantSettings` (but the control devices), the same words on both
    delivery paths: ``--mps``, ``--mps-pipe-dir``, ``--dev-root``."""
    parser.add_argument("--mps", action="store_true",
                        help="set CUDA_MPS_* limits for shares (an MPS control daemon runs)")
    parser.add_argument("--mps-pipe-dir", default="",
                        help="host directory of the MPS pipes, mounted into share containers")
    parser.add_argument("--dev-root", default="/dev",
                        help="where this daemon sees the host's /dev (default: %(default)s)")


def check_grant_settings(config: GrantSettings) -> None:
    """Raise :class:`BadInput` naming the field when the MPS settings do not fit together."""
    if config.mps_pipe_dir and not os.path.isabs(config.mps_pipe_dir):
        raise BadInput(f"{config.mps_pipe_dir!r} must be an absolute path", field="mps_pipe_dir")
    if config.mps_pipe_dir and not config.mps:
        raise BadInput("only applies with --mps", field="mps_pipe_dir")


@dataclass(frozen=True, slots=True)
class DeviceNodes:
    """The device nodes that exist on this node, found once at start."""

    by_index: Mapping[int, str]
    control: tuple[str, ...]
    missing: tuple[str, ...]

    @classmethod
    def find(cls, gpus: Sequence[Gpu], config: GrantSettings,
             exists: Callable[[str], bool] = os.path.exists) -> DeviceNodes:
        def seen(path: str) -> bool:
            return exists(os.path.join(config.dev_root, os.path.relpath(path, "/dev")))

        wanted = {gpu.index: f"/dev/nvidia{gpu.index}" for gpu in gpus}
        by_index = {i: path for i, path in wanted.items() if seen(path)}
        control = tuple(path for path in config.control_devices if seen(path))
        missing = tuple(sorted({*wanted.values(), *config.control_devices}
                               - {*by_index.values(), *control}))
        return cls(by_index, control, missing)


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    """What a container is given: environment, device nodes and bind mounts (host path =
    container path for both)."""

    envs: Mapping[str, str]
    device_paths: tuple[str, ...]
    mount_paths: tuple[str, ...]


def container_grant(gpus: Sequence[Gpu], *, milli: int, memory_mib: int, nodes: DeviceNodes,
                    config: GrantSettings) -> ContainerGrant:
    """The grant for a container given ``gpus`` (module docstring). ``milli``: the compute share
    asked of its one GPU (0 or a multiple of 1000: not a compute share); ``memory_mib``: the
    GPU memory asked (0: none), which makes it a memory share of its one GPU."""
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(gpu.uuid for gpu in gpus)}
    devices = (*(nodes.by_index[g.index] for g in gpus if g.index in nodes.by_index),
               *nodes.control)
    mounts: tuple[str, ...] = ()
    compute = milli % MILLI_PER_GPU
    if (compute or memory_mib) and len(gpus) == 1:
        gpu = gpus[0]
        if memory_mib:  # the share's compute is counted at least as its memory (placement's rule)
            limit_mib = memory_mib
            compute = share_milli(compute, memory_mib, gpu.memory_total_mib)
        else:
            limit_mib = milli_memory_mib(compute, gpu.memory_total_mib)
        envs["GPUFRAG_GPU_MILLI"] = str(compute)
        envs["GPUFRAG_GPU_MEMORY_LIMIT_MIB"] = str(limit_mib)
        if config.mps:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, math.ceil(compute / 10)))
            envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit_mib}M"
            if config.mps_pipe_dir:
                envs["CUDA_MPS_PIPE_DIRECTORY"] = config.mps_pipe_dir
                mounts = (config.mps_pipe_dir,)
    return ContainerGrant(envs, devices, mounts)
