"""Read the Alibaba openb trace format (cluster-trace-gpu-v2023) into core types.

Nodes: ``sn, cpu_milli, memory_mib, gpu, model``. Pods: ``name, cpu_milli, memory_mib, num_gpu,
gpu_milli, gpu_spec, ...`` (extra columns ignored). Every problem is reported as ``BadInput``
naming the file, the row (1-based, header = row 1) and the field, so a user can fix the file.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from gpufrag.errors import BadInput
from scheduler.core.types import MAX_GPUS_PER_NODE, MILLI_PER_GPU, NodeSpec, PodRequest

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    source = str(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror or exc}", source=source) from None
    with handle:
        try:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise BadInput(f"missing column(s) {', '.join(missing)}; header is {header}",
                               source=source, row=1)
            for number, row in enumerate(reader, start=2):
                if None in row or any(row.get(c) is None for c in required):
                    raise BadInput(f"expected {len(header)} fields", source=source, row=number)
                yield number, row
        except csv.Error as exc:
            raise BadInput(f"malformed CSV: {exc}", source=source, row=reader.line_num) from None
        except UnicodeDecodeError as exc:
            raise BadInput(f"not UTF-8 text: {exc.reason}", source=source) from None


def _int(row: dict[str, str], field: str, source: str, number: int, *, low: int = 0,
         high: int | None = None) -> int:
    text = row[field].strip()
    if not text:
        raise BadInput("missing number", source=source, row=number, field=field)
    try:
        value = int(float(text)) if "." in text or "e" in text.lower() else int(text)
    except ValueError:
        raise BadInput(f"not a number: {text!r}", source=source, row=number, field=field) from None
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise BadInput(f"{value} outside {bound}", source=source, row=number, field=field)
    return value


def load_nodes(path: str | Path) -> list[NodeSpec]:
    path = Path(path)
    source = str(path)
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for number, row in _rows(path, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name:
            raise BadInput("empty node name", source=source, row=number, field="sn")
        if name in seen:
            raise BadInput(f"duplicate node name {name!r}", source=source, row=number, field="sn")
        seen.add(name)
        gpus = _int(row, "gpu", source, number, high=MAX_GPUS_PER_NODE)
        product = row["model"].strip()
        if gpus and not product:
            raise BadInput("GPU node without a GPU model", source=source, row=number,
                           field="model")
        nodes.append(NodeSpec(
            name=name,
            cpu_milli=_int(row, "cpu_milli", source, number),
            memory_mib=_int(row, "memory_mib", source, number),
            gpu_count=gpus,
            gpu_product=product if gpus else "",
        ))
    if not nodes:
        raise BadInput("no nodes", source=source)
    return nodes


def load_pods(path: str | Path, known_products: set[str] | None = None) -> list[PodRequest]:
    """Pods of a trace; ``known_products`` (the cluster's) turns unknown ``gpu_spec`` entries
    into errors instead of pods that silently never fit."""
    path = Path(path)
    source = str(path)
    pods: list[PodRequest] = []
    for number, row in _rows(path, POD_COLUMNS):
        name = row["name"].strip() or f"pod-{number}"
        num_gpu = _int(row, "num_gpu", source, number, high=MAX_GPUS_PER_NODE)
        gpu_milli = _int(row, "gpu_milli", source, number, high=MILLI_PER_GPU)
        if num_gpu == 0:
            gpu_milli = 0
        elif gpu_milli == 0:
            raise BadInput("a GPU pod needs gpu_milli > 0", source=source, row=number,
                           field="gpu_milli")
        elif num_gpu > 1 and gpu_milli != MILLI_PER_GPU:
            raise BadInput(f"{gpu_milli} milli per GPU with {num_gpu} GPUs; shares need "
                           "num_gpu == 1", source=source, row=number, field="gpu_milli")
        spec_text = (row.get("gpu_spec") or "").strip()
        spec = frozenset(s.strip() for s in spec_text.split("|") if s.strip())
        if known_products is not None and num_gpu:
            unknown = sorted(spec - known_products)
            if unknown:
                raise BadInput(f"unknown GPU product(s) {'|'.join(unknown)}; the cluster has "
                               f"{'|'.join(sorted(known_products))}", source=source, row=number,
                               field="gpu_spec")
        pods.append(PodRequest(
            name=name,
            cpu_milli=_int(row, "cpu_milli", source, number),
            memory_mib=_int(row, "memory_mib", source, number),
            num_gpu=num_gpu,
            gpu_milli=gpu_milli,
            gpu_spec=spec if num_gpu else frozenset(),
        ))
    if not pods:
        raise BadInput("no pods", source=source)
    return pods
