"""Read the Alibaba openb trace format (cluster-trace-gpu-v2023) into core types.

Nodes: ``sn, cpu_milli, memory_mib, gpu, model``. Pods: ``name, cpu_milli, memory_mib, num_gpu,
gpu_milli[, gpu_spec, ...]`` (other columns, in any order, are ignored: the multigpu traces have
only the first five, the others add qos and times). Every problem is reported as ``BadInput``
naming the file, the row (the line number an editor shows: header = row 1) and the field, so a
user can fix the file; no other exception escapes a loader, whatever the bytes.

What is accepted, and why:

- **Text**: UTF-8, with or without a byte-order mark (spreadsheet exports add one), LF or CRLF
  line ends; blank lines are skipped. Other encodings are refused at the row they break, rather
  than guessed.
- **Bounded memory**: lines are read with a length limit (``MAX_LINE_BYTES``; a quoted field that
  spans lines counts towards the same limit for its whole record) and a file holds at most
  ``MAX_ROWS`` rows, so a gigabyte without a newline or a runaway file fails fast instead of
  being read into memory. The real traces have rows of ~120 bytes and ~8,000 pods.
- **Numbers**: plain decimal text (``1000``, ``1000.0`` and ``1e3`` are the same number), whole,
  and within ``0..MAX_AMOUNT`` (GPU counts ``0..MAX_GPUS_PER_NODE``, ``gpu_milli`` ``0..1000``).
  ``nan``, ``inf``, ``10^30``, ``1_000`` and non-ASCII digits are not numbers here; ``1e400`` or
  anything past int64 is out of range, never a float overflow. A fractional amount is refused
  rather than truncated, so nothing the file asks for is silently changed.
- **Fractional ``num_gpu``** (``0.9``) is an error, not a share: openb writes a GPU share as
  ``num_gpu = 1`` with ``gpu_milli < 1000`` (``gpu_milli`` is per GPU, demand = num_gpu x
  gpu_milli / 1000), so ``num_gpu`` is always a count. Reading 0.9 as 900 milli would be a guess
  that conflicts with the ``gpu_milli`` column on the same row (0.9 x 470?), and reading it as 0
  (what ``int()`` did) turned a GPU pod into a CPU pod. The message says how to write the share.
  For the same reason ``num_gpu = 0`` with ``gpu_milli > 0`` is an error, not a CPU pod.
- **Names**: node names must be present and unique; pod names unique too (an empty pod name
  becomes ``pod-<row>``), because the cluster state keys placements by name and a duplicate
  would otherwise surface as a placement fault in the middle of a replay.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import BinaryIO

from gpufrag.errors import BadInput
from scheduler.core.types import MAX_GPUS_PER_NODE, MILLI_PER_GPU, NodeSpec, PodRequest

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")

# 64 KiB per line (or per record, for quoted fields spanning lines): 500x the real traces' rows.
MAX_LINE_BYTES = 65_536
# 1,000,000 rows: 100x the largest openb trace, and what a replay can still hold in memory.
MAX_ROWS = 1_000_000
# 10^12 milli-CPU or MiB per node or pod: far beyond any machine, yet sums over millions of nodes
# still fit the int64 arrays of ClusterState and stay exact in the float64 policy scores.
MAX_AMOUNT = 10**12

_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BOM = "\ufeff"


def _clip(text: str, limit: int = 40) -> str:
    """``text`` fit for a one-line message: shortened (a 60 KB field must not become the
    error) and with control characters escaped (a quoted field may hold a newline)."""
    short = text if len(text) <= limit else text[:limit] + "..."
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in short)


class _BoundedLines:
    """A binary file's lines, decoded as UTF-8, each at most ``MAX_LINE_BYTES``.

    ``csv`` takes any iterator of lines; this one never holds more than one bounded line, so a
    file without newlines costs 64 KiB, not its size. It also counts lines, so errors can name
    the row where the record that broke starts. The caller sets ``record_bytes = 0`` after each
    record, which bounds records made of many short quoted lines as well.
    """

    def __init__(self, handle: BinaryIO, source: str) -> None:
        self.handle = handle
        self.source = source
        self.lines = 0
        self.start = 1
        self.record_bytes = 0

    def __iter__(self) -> _BoundedLines:
        return self

    def __next__(self) -> str:
        if self.record_bytes == 0:
            self.start = self.lines + 1
        raw = self.handle.readline(MAX_LINE_BYTES + 1)
        if not raw:
            raise StopIteration
        self.lines += 1
        self.record_bytes += len(raw)
        if len(raw) > MAX_LINE_BYTES or self.record_bytes > MAX_LINE_BYTES:
            raise BadInput(f"row longer than {MAX_LINE_BYTES} bytes (openb rows are ~120); is "
                           "this a CSV trace?", source=self.source, row=self.start)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInput(f"not UTF-8 text ({exc.reason} at byte {exc.start} of the line); "
                           "save the file as UTF-8", source=self.source, row=self.lines) from None
        nul = raw.find(b"\x00")  # (after decoding: UTF-16 is "not UTF-8", not "a NUL")
        if nul >= 0:
            # csv reads a NUL as part of a field, so a name would silently hold one; a trace
            # with NULs is a binary file or a corrupt copy.
            raise BadInput(f"NUL byte at byte {nul} of the line; is this a "
                           "text CSV trace?", source=self.source, row=self.lines)
        if self.lines == 1 and line.startswith(_BOM):
            line = line[len(_BOM):]
        return line


def read_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """``(row number, {column: text})`` for each non-blank row, after checking the header:
    the one bounded CSV reader of the traces (openb here, the GenAI samples in
    :mod:`simulations.defrag_whatif`)."""
    source = str(path)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror or exc}", source=source) from None
    with handle:
        lines = _BoundedLines(handle, source)
        try:
            reader = csv.reader(lines)
            header_row = next(reader, None)
            if not header_row:  # no line at all, or a blank first line
                raise BadInput(f"no header; expected one naming {','.join(required)}",
                               source=source, row=1)
            header = [name.strip() for name in header_row]
            doubled = sorted(name for name, n in Counter(header).items() if n > 1)
            if doubled:
                raise BadInput(f"column(s) {_clip(', '.join(doubled))} appear more than once",
                               source=source, row=1)
            missing = [c for c in required if c not in header]
            if missing:
                shown = _clip(",".join(header), 120)
                raise BadInput(f"missing column(s) {', '.join(missing)}; header is {shown}",
                               source=source, row=1)
            rows = 0
            lines.record_bytes = 0
            for record in reader:
                number = lines.start
                lines.record_bytes = 0
                if not record:
                    continue
                rows += 1
                if rows > MAX_ROWS:
                    raise BadInput(f"more than {MAX_ROWS} rows; split the trace", source=source,
                                   row=number)
                if len(record) != len(header):
                    raise BadInput(f"expected {len(header)} fields, got {len(record)}",
                                   source=source, row=number)
                yield number, dict(zip(header, record, strict=True))
        except csv.Error as exc:
            reason = str(exc)
            if "new-line character seen in unquoted field" in reason:
                # csv's own text speaks of opening modes; the fix is in the file, not the code.
                reason = "a line ends in a lone CR (classic Mac); save it with LF or CRLF ends"
            raise BadInput(f"malformed CSV: {reason}", source=source, row=lines.start) from None
        except OSError as exc:
            raise BadInput(f"cannot read: {exc.strerror or exc}", source=source) from None


def amount(row: dict[str, str], field: str, source: str, number: int,
           high: int) -> Decimal:
    """The number in ``row[field]``, exact and in ``0..high``; anything else is ``BadInput``.

    Parsed as a decimal and range-checked before anything becomes an ``int``: ``float()``
    overflows on ``1e400`` and accepts ``nan``, and ``int()`` of ``1e999999`` would build a
    million-digit number.
    """
    text = row[field].strip()
    if not text:
        raise BadInput("missing number", source=source, row=number, field=field)
    if _NUMBER.fullmatch(text) is None:
        raise BadInput(f"not a number: '{_clip(text)}'", source=source, row=number, field=field)
    try:
        value = Decimal(text)
    except InvalidOperation:  # an exponent beyond what Decimal holds (|exponent| > 10^18)
        raise BadInput(f"{_clip(text)}: exponent out of range", source=source, row=number,
                       field=field) from None
    if not 0 <= value <= high:
        raise BadInput(f"{_clip(text)} outside 0..{high}", source=source, row=number, field=field)
    return value


def _whole(row: dict[str, str], field: str, source: str, number: int, *,
           high: int = MAX_AMOUNT) -> int:
    """``row[field]`` as a whole number in ``0..high``; a fraction is refused, not truncated."""
    value = amount(row, field, source, number, high)
    if value != value.to_integral_value():
        raise BadInput(f"{_clip(row[field].strip())} is not a whole number", source=source,
                       row=number, field=field)
    return int(value)


def load_nodes(path: str | Path) -> list[NodeSpec]:
    """The nodes of an openb node list, in file order."""
    path = Path(path)
    source = str(path)
    nodes: list[NodeSpec] = []
    first_row: dict[str, int] = {}
    for number, row in read_rows(path, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name:
            raise BadInput("empty node name", source=source, row=number, field="sn")
        if name in first_row:
            raise BadInput(f"duplicate node name '{_clip(name)}' (first on row "
                           f"{first_row[name]})", source=source, row=number, field="sn")
        first_row[name] = number
        gpus = _whole(row, "gpu", source, number, high=MAX_GPUS_PER_NODE)
        product = row["model"].strip()
        if gpus and not product:
            raise BadInput("GPU node without a GPU model", source=source, row=number,
                           field="model")
        if "|" in product:
            raise BadInput(f"GPU model '{_clip(product)}' contains '|', the gpu_spec separator",
                           source=source, row=number, field="model")
        cpu_milli = _whole(row, "cpu_milli", source, number)
        memory_mib = _whole(row, "memory_mib", source, number)
        try:
            nodes.append(NodeSpec(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib,
                                  gpu_count=gpus, gpu_product=product if gpus else ""))
        except ValueError as exc:  # checked above; kept so a new core rule still reads as input
            raise BadInput(str(exc), source=source, row=number) from None
    if not nodes:
        raise BadInput("no nodes (header only)", source=source, row=2)
    return nodes


def _num_gpu(row: dict[str, str], source: str, number: int) -> int:
    """``num_gpu`` as a count; a fraction gets a message saying how openb writes a share."""
    value = amount(row, "num_gpu", source, number, MAX_GPUS_PER_NODE)
    if value == value.to_integral_value():
        return int(value)
    hint = "num_gpu 1 with gpu_milli below 1000"
    share = value.scaleb(3)  # in milli; value < 17, so this is exact for any sensible text
    if share < MILLI_PER_GPU and share == share.to_integral_value():
        hint += f" (here num_gpu 1, gpu_milli {int(share)})"
    raise BadInput(f"{_clip(row['num_gpu'].strip())} is not a whole GPU count; openb writes a "
                   f"GPU share as {hint}", source=source, row=number, field="num_gpu")


def load_pods(path: str | Path, known_products: set[str] | None = None) -> list[PodRequest]:
    """Pods of a trace; ``known_products`` (the cluster's) turns unknown ``gpu_spec`` entries
    into errors instead of pods that silently never fit. A CPU-only pod's ``gpu_spec`` is
    ignored: it constrains a GPU the pod does not ask for."""
    path = Path(path)
    source = str(path)
    pods: list[PodRequest] = []
    first_row: dict[str, int] = {}
    for number, row in read_rows(path, POD_COLUMNS):
        name = row["name"].strip() or f"pod-{number}"
        if name in first_row:
            raise BadInput(f"duplicate pod name '{_clip(name)}' (first on row {first_row[name]})",
                           source=source, row=number, field="name")
        first_row[name] = number
        num_gpu = _num_gpu(row, source, number)
        gpu_milli = _whole(row, "gpu_milli", source, number, high=MILLI_PER_GPU)
        if num_gpu == 0 and gpu_milli:
            raise BadInput(f"gpu_milli {gpu_milli} with num_gpu 0; a GPU share is num_gpu 1 "
                           "(CPU-only pods have gpu_milli 0)", source=source, row=number,
                           field="gpu_milli")
        if num_gpu and gpu_milli == 0:
            raise BadInput("a GPU pod needs gpu_milli > 0", source=source, row=number,
                           field="gpu_milli")
        if num_gpu > 1 and gpu_milli != MILLI_PER_GPU:
            raise BadInput(f"{gpu_milli} milli per GPU with {num_gpu} GPUs; shares need "
                           "num_gpu == 1", source=source, row=number, field="gpu_milli")
        spec_text = (row.get("gpu_spec") or "").strip()
        spec = frozenset(s.strip() for s in spec_text.split("|") if s.strip())
        if known_products is not None and num_gpu:
            unknown = sorted(spec - known_products)
            if unknown:
                raise BadInput(f"unknown GPU product(s) {_clip('|'.join(unknown))}; the cluster "
                               f"has {_clip('|'.join(sorted(known_products)), 120)}",
                               source=source, row=number, field="gpu_spec")
        cpu_milli = _whole(row, "cpu_milli", source, number)
        memory_mib = _whole(row, "memory_mib", source, number)
        try:
            pods.append(PodRequest(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib,
                                   num_gpu=num_gpu, gpu_milli=gpu_milli,
                                   gpu_spec=spec if num_gpu else frozenset()))
        except ValueError as exc:  # checked above; kept so a new core rule still reads as input
            raise BadInput(str(exc), source=source, row=number) from None
    if not pods:
        raise BadInput("no pods (header only)", source=source, row=2)
    return pods


def gpu_spec_texts(path: str | Path) -> dict[str, str]:
    """Each GPU pod's ``gpu_spec`` as the file writes it (``V100M16|V100M32|V100M32``), by pod
    name: the KSS-compatible target workload keys specs by this text, as the authors'
    simulator does, where :func:`load_pods` keeps the set. Read after :func:`load_pods` has
    validated the file."""
    texts: dict[str, str] = {}
    for number, row in read_rows(Path(path), POD_COLUMNS):
        text = (row.get("gpu_spec") or "").strip()
        if text and row["num_gpu"].strip() not in ("0", "0.0"):
            texts[row["name"].strip() or f"pod-{number}"] = text
    return texts
