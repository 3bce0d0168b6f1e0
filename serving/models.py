"""Built-in models: ResNet-shaped ONNX graphs generated locally from seeded numpy weights.

Why generate instead of download: the runtime must start (and be benchmarked) on machines that
reach no model hub, and a serving benchmark needs the *shape* of the compute (ResNet-50's
bottleneck stack), not trained weights. The graph is written with the ``onnx`` helper API:

- ``builtin:resnet50`` — ResNet-50 v1.5: 7x7/2 stem, 3x3/2 max pool, bottleneck stages
  [3, 4, 6, 3] with widths 64/128/256/512 (x4 expansion, stride on the 3x3), global average
  pool, fully connected 2048 -> 1000. Input ``input`` float32 [N, 3, 224, 224], output
  ``logits`` float32 [N, 1000]. About 25.5 M parameters (~100 MB on disk).
- ``builtin:resnet-medium`` — ResNet-18: the same 7x7/2 stem and max pool, *basic* blocks
  (two 3x3 convolutions) in stages [2, 2, 2, 2] with widths 64/128/256/512, fully connected
  512 -> 1000, on input [N, 3, 64, 64]. About 11.7 M parameters, ~0.15 GFLOPs per image: a
  model whose compute dominates the per-request HTTP cost on a CPU (tens to a few hundred
  images/s on two cores), so CPU benchmarks measure the batcher rather than the web stack.
- ``builtin:resnet-small`` — the ResNet-50 structure at toy scale for tests: 3x3 stem,
  bottleneck stages [1, 1, 1, 1] with widths 8/16/32/64, input [N, 3, 32, 32], output
  ``logits`` [N, 10]. Its compute (~0.3 ms per image) is *less* than a request's HTTP cost.

BatchNormalization is folded into the convolutions (a Conv with bias), as inference exports
do; the FLOPs and memory traffic are those of the deployed graph. Weights are He-initialised
with the last convolution of each residual branch scaled down, so activations stay finite
through 16 blocks and outputs are meaningful numbers rather than inf/NaN.

Files are cached under a directory, named by model and a digest of the generator's parameters,
and written atomically (temp file + rename) so concurrent starts never read half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError  # type: ignore[import-untyped, unused-ignore]
from onnx import TensorProto, helper, numpy_helper

from gpufrag.errors import BadInput

BUILTIN_PREFIX = "builtin:"
GENERATOR_VERSION = 1  # bump when the graph layout changes, so cached files are regenerated
OPSET = 17


@dataclass(frozen=True)
class ResNetSpec:
    """Everything that determines a generated ResNet graph (and so its cache key)."""

    name: str
    image_size: int
    stem_channels: int
    stem_kernel: int
    stem_stride: int
    stem_max_pool: bool
    stage_blocks: tuple[int, ...]
    stage_widths: tuple[int, ...]
    expansion: int
    num_classes: int
    seed: int = 0
    block: str = "bottleneck"  # or "basic" (ResNet-18/34: two 3x3 convolutions, no expansion)

    def digest(self) -> str:
        payload = json.dumps({"v": GENERATOR_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


BUILTIN_MODELS: dict[str, ResNetSpec] = {
    "resnet50": ResNetSpec(
        name="resnet50", image_size=224, stem_channels=64, stem_kernel=7, stem_stride=2,
        stem_max_pool=True, stage_blocks=(3, 4, 6, 3), stage_widths=(64, 128, 256, 512),
        expansion=4, num_classes=1000,
    ),
    "resnet-medium": ResNetSpec(
        name="resnet-medium", image_size=64, stem_channels=64, stem_kernel=7, stem_stride=2,
        stem_max_pool=True, stage_blocks=(2, 2, 2, 2), stage_widths=(64, 128, 256, 512),
        expansion=1, num_classes=1000, block="basic",
    ),
    "resnet-small": ResNetSpec(
        name="resnet-small", image_size=32, stem_channels=16, stem_kernel=3, stem_stride=1,
        stem_max_pool=False, stage_blocks=(1, 1, 1, 1), stage_widths=(8, 16, 32, 64),
        expansion=4, num_classes=10,
    ),
}


class _GraphBuilder:
    """Accumulates nodes and initializers; names are generated so blocks compose simply."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def _name(self, kind: str) -> str:
        self._count += 1
        return f"{kind}_{self._count}"

    def conv(self, x: str, c_in: int, c_out: int, kernel: int, stride: int, *, relu: bool,
             gain: float = 1.0) -> str:
        name = self._name("conv")
        fan_in = c_in * kernel * kernel
        w = self.rng.standard_normal((c_out, c_in, kernel, kernel), dtype=np.float32)
        w *= np.float32(gain * np.sqrt(2.0 / fan_in))
        b = np.zeros(c_out, dtype=np.float32)
        self.initializers += [numpy_helper.from_array(w, f"{name}.weight"),
                              numpy_helper.from_array(b, f"{name}.bias")]
        pad = kernel // 2
        self.nodes.append(helper.make_node(
            "Conv", [x, f"{name}.weight", f"{name}.bias"], [name], name=name,
            kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4,
        ))
        return self.relu(name) if relu else name

    def relu(self, x: str) -> str:
        name = self._name("relu")
        self.nodes.append(helper.make_node("Relu", [x], [name], name=name))
        return name

    def add(self, a: str, b: str) -> str:
        name = self._name("add")
        self.nodes.append(helper.make_node("Add", [a, b], [name], name=name))
        return name

    def max_pool(self, x: str) -> str:
        name = self._name("maxpool")
        self.nodes.append(helper.make_node("MaxPool", [x], [name], name=name, kernel_shape=[3, 3],
                                           strides=[2, 2], pads=[1, 1, 1, 1]))
        return name

    def bottleneck(self, x: str, c_in: int, width: int, expansion: int, stride: int) -> str:
        c_out = width * expansion
        y = self.conv(x, c_in, width, 1, 1, relu=True)
        y = self.conv(y, width, width, 3, stride, relu=True)
        y = self.conv(y, width, c_out, 1, 1, relu=False, gain=0.2)
        return self.residual(x, y, c_in, c_out, stride)

    def basic(self, x: str, c_in: int, width: int, stride: int) -> str:
        y = self.conv(x, c_in, width, 3, stride, relu=True)
        y = self.conv(y, width, width, 3, 1, relu=False, gain=0.2)
        return self.residual(x, y, c_in, width, stride)

    def residual(self, x: str, y: str, c_in: int, c_out: int, stride: int) -> str:
        """relu(y + shortcut): the identity, or a strided 1x1 projection when the shape
        changes (shared by the bottleneck and basic blocks)."""
        shortcut = x
        if stride != 1 or c_in != c_out:
            shortcut = self.conv(x, c_in, c_out, 1, stride, relu=False)
        return self.relu(self.add(y, shortcut))

    def head(self, x: str, c_in: int, num_classes: int, output: str) -> None:
        pooled, flat = self._name("gap"), self._name("flatten")
        self.nodes.append(helper.make_node("GlobalAveragePool", [x], [pooled], name=pooled))
        self.nodes.append(helper.make_node("Flatten", [pooled], [flat], name=flat, axis=1))
        w = self.rng.standard_normal((num_classes, c_in), dtype=np.float32)
        w *= np.float32(np.sqrt(1.0 / c_in))
        b = np.zeros(num_classes, dtype=np.float32)
        self.initializers += [numpy_helper.from_array(w, "fc.weight"),
                              numpy_helper.from_array(b, "fc.bias")]
        self.nodes.append(helper.make_node("Gemm", [flat, "fc.weight", "fc.bias"], [output],
                                           name="fc", transB=1))


def build_resnet(spec: ResNetSpec) -> onnx.ModelProto:
    """The ONNX graph for ``spec``: input ``input`` [N,3,H,W] -> output ``logits`` [N,classes]."""
    g = _GraphBuilder(spec.seed)
    x = g.conv("input", 3, spec.stem_channels, spec.stem_kernel, spec.stem_stride, relu=True)
    if spec.stem_max_pool:
        x = g.max_pool(x)
    c_in = spec.stem_channels
    for stage, (blocks, width) in enumerate(zip(spec.stage_blocks, spec.stage_widths,
                                                strict=True)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            if spec.block == "basic":
                x = g.basic(x, c_in, width, stride)
                c_in = width
            else:
                x = g.bottleneck(x, c_in, width, spec.expansion, stride)
                c_in = width * spec.expansion
    g.head(x, c_in, spec.num_classes, "logits")
    size = spec.image_size
    graph = helper.make_graph(
        g.nodes, spec.name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", spec.num_classes])],
        initializer=g.initializers,
    )
    model = helper.make_model(graph, producer_name="gpufrag.serving.models",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by every onnxruntime since 1.10
    onnx.checker.check_model(model)
    return model


def builtin_path(name: str, cache_dir: Path) -> Path:
    """Where ``builtin:<name>`` lives in ``cache_dir`` (generated there if missing)."""
    return _builtin(name, cache_dir).path


@dataclass(frozen=True)
class ModelFile:
    """The ONNX file to load, and what the model cache had: ``cached`` is True when a built-in
    model was already generated there (warm), False when it was generated now (cold), None
    for a file given by path (the cache plays no part)."""

    path: Path
    cached: bool | None


def _builtin(name: str, cache_dir: Path) -> ModelFile:
    spec = _spec(name)
    path = cache_dir / f"{spec.name}-{spec.digest()}.onnx"
    cached = path.exists()
    if not cached:
        cache_dir.mkdir(parents=True, exist_ok=True)
        model = build_resnet(spec)
        fd, tmp = tempfile.mkstemp(prefix=f".{spec.name}-", suffix=".tmp", dir=cache_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(model.SerializeToString())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return ModelFile(path, cached)


def _spec(name: str) -> ResNetSpec:
    try:
        return BUILTIN_MODELS[name]
    except KeyError:
        known = ", ".join(f"{BUILTIN_PREFIX}{n}" for n in BUILTIN_MODELS)
        raise BadInput(f"unknown built-in model {BUILTIN_PREFIX}{name}; known: {known}",
                       field="--model") from None


def model_name(ref: str) -> str:
    """The v2 model name for ``PATH`` or ``builtin:NAME``, checking the reference (cheap: a
    stat, no generation, no load), so a typo fails before the server starts listening."""
    if ref.startswith(BUILTIN_PREFIX):
        return _spec(ref[len(BUILTIN_PREFIX):]).name
    path = Path(ref)
    if path.is_dir():
        raise BadInput(f"model file {ref!r} is a directory; give the .onnx file in it",
                       field="--model")
    if not path.is_file():
        raise BadInput(f"model file {ref!r} does not exist (or use {BUILTIN_PREFIX}NAME; "
                       f"known: {', '.join(BUILTIN_MODELS)})", field="--model")
    if path.stat().st_size == 0:
        raise BadInput(f"model file {ref!r} is empty (0 bytes), not an ONNX model",
                       field="--model")
    return path.stem


def check_model_file(ref: str) -> None:
    """Fail fast, in one line, on a ``--model`` file that is not an ONNX model (truncated,
    corrupt, some other protobuf), before the server listens and logs: otherwise the error
    comes from ONNX Runtime after start-up, once the pod has been reported live.

    Parses the protobuf without external data (~10 ms for ResNet-50's 100 MB) and asks only
    for a graph with inputs and outputs, not ``onnx.checker``'s full check, which rejects
    models ONNX Runtime runs (newer IR versions, contrib operators). Built-in models are
    generated here and need no check. (``DecodeError`` comes from protobuf, which onnx is
    built on; protobuf ships no type stubs, ``types-protobuf`` adds them where installed: hence
    the ignore on its import, allowed to be unused.)
    """
    model_name(ref)
    if ref.startswith(BUILTIN_PREFIX):
        return
    try:
        model = onnx.load_model(ref, load_external_data=False)
    except DecodeError:
        raise BadInput(f"model file {ref!r} is not an ONNX model: it does not parse as one "
                       "(truncated, corrupt, or another kind of file?)", field="--model") from None
    except OSError as exc:
        raise BadInput(f"model file {ref!r} cannot be read: {exc.strerror or exc}",
                       field="--model") from None
    if not model.HasField("graph"):
        raise BadInput(f"model file {ref!r} is not an ONNX model: it parses, but has no graph "
                       "(another kind of protobuf?)", field="--model")
    if not model.graph.input or not model.graph.output:
        raise BadInput(f"model file {ref!r} has a graph with {len(model.graph.input)} inputs "
                       f"and {len(model.graph.output)} outputs; a servable model needs at "
                       "least one of each", field="--model")


def materialize(ref: str, cache_dir: Path) -> Path:
    """The ONNX file for ``ref``, generating a built-in model into ``cache_dir`` if needed."""
    return materialize_model(ref, cache_dir).path


def materialize_model(ref: str, cache_dir: Path) -> ModelFile:
    """:func:`materialize`, also saying whether the cache already had the model (the server
    exports that as the ``cache`` label of its load time)."""
    model_name(ref)
    if ref.startswith(BUILTIN_PREFIX):
        return _builtin(ref[len(BUILTIN_PREFIX):], cache_dir)
    return ModelFile(Path(ref), None)
