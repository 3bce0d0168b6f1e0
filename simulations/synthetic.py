"""A synthetic cluster and workload with the shape of the openb trace, for runs with no trace.

Seeded and self-contained, so ``gpufrag whatif`` works on a fresh machine and gives the same
table for the same seed. The mixes below follow the openb default trace (node types by share of
nodes; pod classes by share of pods; per-class CPU and GPU-share values among the trace's most
common): about 13% CPU-only pods, 38% GPU shares, 48% one whole GPU and 1% multi-GPU pods, on
nodes that are mostly 8-GPU G2 and 2-GPU T4 machines. Memory is ~3.5 MiB per milli-CPU, as in
the trace.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from scheduler.core.types import NodeSpec, PodRequest

# (weight, cpu_milli, memory_mib, gpus, product)
NODE_TYPES: tuple[tuple[float, int, int, int, str], ...] = (
    (0.452, 96_000, 393_216, 8, "G2"),
    (0.319, 104_000, 524_288, 2, "T4"),
    (0.088, 16_000, 122_880, 2, "P100"),
    (0.032, 128_000, 786_432, 8, "G3"),
    (0.023, 32_000, 131_072, 4, "V100M16"),
    (0.018, 64_000, 262_144, 2, "P100"),
    (0.017, 96_000, 786_432, 8, "V100M32"),
    (0.016, 8_000, 32_768, 1, "V100M16"),
    (0.014, 96_000, 393_216, 4, "T4"),
    (0.021, 48_000, 376_832, 4, "V100M32"),
)

SHARE_MILLI = ((810, 0.33), (470, 0.23), (320, 0.10), (650, 0.08), (230, 0.05), (460, 0.04),
               (590, 0.03), (160, 0.03), (550, 0.03), (220, 0.03), (370, 0.02), (110, 0.03))
SHARE_CPU = ((3152, 0.38), (11908, 0.21), (4000, 0.17), (8000, 0.16), (4152, 0.05), (6000, 0.03))
WHOLE_CPU = ((11300, 0.32), (11400, 0.22), (3152, 0.17), (12000, 0.12), (18708, 0.09),
             (9810, 0.08))
MULTI = (((8, 88_000), 0.3), ((8, 64_200), 0.3), ((4, 32_200), 0.15), ((2, 16_200), 0.15),
         ((8, 120_000), 0.05), ((2, 6_000), 0.05))
CPU_ONLY = ((12500, 0.34), (32000, 0.27), (8000, 0.17), (15400, 0.11), (16500, 0.09),
            (16000, 0.02))
CLASS_WEIGHTS = {"cpu": 0.13, "share": 0.38, "whole": 0.48, "multi": 0.01}
MIB_PER_MILLI_CPU = 3.5
# Fraction of GPU pods that carry a product constraint (openb default: none; gpuspec33: 1/3).
CONSTRAINED = 0.05


T = TypeVar("T")


def _pick(rng: np.random.Generator, table: tuple[tuple[T, float], ...]) -> T:
    weights = np.array([w for _, w in table])
    return table[int(rng.choice(len(table), p=weights / weights.sum()))][0]


def synthetic_nodes(count: int = 300, seed: int = 0) -> list[NodeSpec]:
    """``count`` nodes drawn from the openb node-type mix."""
    if count < 1:
        raise ValueError(f"node count must be >= 1, got {count}")
    rng = np.random.default_rng(seed)
    weights = np.array([t[0] for t in NODE_TYPES])
    kinds = rng.choice(len(NODE_TYPES), size=count, p=weights / weights.sum())
    return [
        NodeSpec(name=f"synth-node-{i:04d}", cpu_milli=NODE_TYPES[k][1],
                 memory_mib=NODE_TYPES[k][2], gpu_count=NODE_TYPES[k][3],
                 gpu_product=NODE_TYPES[k][4])
        for i, k in enumerate(kinds)
    ]


def synthetic_pods(count: int = 2000, seed: int = 0,
                   products: tuple[str, ...] = ("G2", "T4", "P100", "G3", "V100M16", "V100M32"),
                   ) -> list[PodRequest]:
    """``count`` pods drawn from the openb pod-class mix."""
    if count < 1:
        raise ValueError(f"pod count must be >= 1, got {count}")
    rng = np.random.default_rng(seed + 1)
    classes = tuple(CLASS_WEIGHTS.items())
    pods: list[PodRequest] = []
    for i in range(count):
        kind = _pick(rng, classes)
        num_gpu, gpu_milli = 0, 0
        if kind == "cpu":
            cpu = _pick(rng, CPU_ONLY)
        elif kind == "share":
            cpu, num_gpu, gpu_milli = _pick(rng, SHARE_CPU), 1, _pick(rng, SHARE_MILLI)
        elif kind == "whole":
            cpu, num_gpu, gpu_milli = _pick(rng, WHOLE_CPU), 1, 1000
        else:
            (num_gpu, cpu), gpu_milli = _pick(rng, MULTI), 1000
        spec: frozenset[str] = frozenset()
        if num_gpu and rng.random() < CONSTRAINED:
            spec = frozenset([products[int(rng.integers(len(products)))]])
        pods.append(PodRequest(name=f"synth-pod-{i:05d}", cpu_milli=cpu,
                               memory_mib=int(cpu * MIB_PER_MILLI_CPU), num_gpu=num_gpu,
                               gpu_milli=gpu_milli, gpu_spec=spec))
    return pods
