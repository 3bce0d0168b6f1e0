"""The demo's scenario as plain data: node shapes, model Deployments, batch pods, node layout."""

from __future__ import annotations

from dataclasses import dataclass

MILLI_PER_GPU = 1000


@dataclass(frozen=True, slots=True)
class NodeShape:
    """A GPU node type: the GFD product label, NVML's name for the GPU, count and memory."""

    short: str
    product: str
    nvml_name: str
    gpus: int
    gpu_memory_mib: int


A100 = NodeShape("a100", "NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 8, 81_920)
V100 = NodeShape("v100", "Tesla-V100-SXM2-32GB", "Tesla V100-SXM2-32GB", 8, 32_768)
A10 = NodeShape("a10", "NVIDIA-A10", "NVIDIA A10", 4, 23_028)
T4 = NodeShape("t4", "Tesla-T4", "Tesla T4", 4, 15_360)
SHAPES: tuple[NodeShape, ...] = (A100, V100, A10, T4)


@dataclass(frozen=True, slots=True)
class ModelDeployment:
    """One model's Deployment: its GPU share, how many replicas the spreading scheduler placed
    (``legacy_replicas``), how many traffic later asks for (``replicas``), and the GPU memory one
    replica uses (``used_mib``, the recorded NVML figure)."""

    name: str
    model: str
    version: str
    gpu_milli: int
    legacy_replicas: int
    replicas: int
    used_mib: int
    products: tuple[str, ...] = ()  # acceptable GPU products (gpufrag.io/gpu-spec); () = any


# Shares are requested generously, as they are in practice (sized for the largest batch and
# the biggest GPU the model might land on), so most replicas leave much of their reservation idle.
DEPLOYMENTS: tuple[ModelDeployment, ...] = (
    ModelDeployment("chat", "llama-3-8b-instruct", "3.1", 500, 3, 4, 14_500,
                    (A100.product, V100.product)),
    ModelDeployment("embed", "bge-large-en", "1.5", 250, 5, 7, 1_400),
    ModelDeployment("rerank", "bge-reranker-base", "2", 300, 3, 4, 2_100),
    ModelDeployment("vision", "resnet50", "1", 200, 3, 4, 900),
)


@dataclass(frozen=True, slots=True)
class BatchPod:
    """A long-running bare pod on whole GPUs (training, a notebook): never moved by defrag."""

    name: str
    gpus: int
    used_fraction: float  # of each GPU's memory, the recorded NVML figure


BATCH_PODS: tuple[BatchPod, ...] = (
    BatchPod("finetune-a", 4, 0.92),
    BatchPod("train-a", 2, 0.88),
    BatchPod("train-b", 1, 0.90),
    BatchPod("notebook-a", 1, 0.35),
)


def node_layout(count: int) -> list[tuple[str, NodeShape]]:
    """``count`` nodes cycling through the products: demo-a100-0, demo-v100-0, ..."""
    seen: dict[str, int] = {}
    nodes = []
    for i in range(count):
        shape = SHAPES[i % len(SHAPES)]
        index = seen.get(shape.short, 0)
        seen[shape.short] = index + 1
        nodes.append((f"demo-{shape.short}-{index}", shape))
    return nodes
