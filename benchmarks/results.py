"""The one format of a benchmark's results, and the one place its verdict is computed.

A figure typed into prose by hand drifts from what was measured; so every benchmark writes what
it measured here (``benchmarks/results/<benchmark>.json``) together with what makes the figure
mean something: the commit (and whether the tree had local changes), the machine, the load
average at the start and at the end, the time and the arguments. The docs are rendered from
these files (``benchmarks.render``), never typed.

The verdict is computed from every figure that carries a target, not from the one a sentence
quotes: a benchmark is met only when each of them is met, and one missed sub-figure makes the
whole benchmark missed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from gpufrag.dataroot import ENV as DATA_ROOT_ENV
from gpufrag.dataroot import data_root

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = RESULTS_DIR.parent.parent

Comparison = Literal["<=", ">=", "<", ">"]
Verdict = Literal["met", "missed", "no target"]
Provenance = Literal["measured", "transcribed"]

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda value, bound: value <= bound,
    ">=": lambda value, bound: value >= bound,
    "<": lambda value, bound: value < bound,
    ">": lambda value, bound: value > bound,
}


@dataclass(frozen=True)
class Target:
    """What a figure must be: ``value <comparison> bound``, in the figure's unit."""

    comparison: Comparison
    bound: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "bound", float(self.bound))  # 0 and 0.0 are written alike
        if self.comparison not in _COMPARE:
            raise ValueError(f"target comparison must be one of {sorted(_COMPARE)}, "
                             f"got {self.comparison!r}")

    def met_by(self, value: float) -> bool:
        return bool(_COMPARE[self.comparison](value, self.bound))


@dataclass(frozen=True)
class Figure:
    """One measured number. ``name`` says what was measured (and at which size), ``unit`` what
    it counts; a figure without a target is context (a baseline, a breakdown), never judged."""

    name: str
    value: float
    unit: str
    target: Target | None = None

    def __post_init__(self) -> None:
        # A plain float whatever the benchmark computed it with (numpy scalars are not JSON).
        object.__setattr__(self, "value", float(self.value))

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met_by(self.value)


def verdict_of(figures: Sequence[Figure]) -> Verdict:
    """Met only when every figure with a target meets it; any missed one misses the whole."""
    judged = [f.met for f in figures if f.met is not None]
    if not judged:
        return "no target"
    return "met" if all(judged) else "missed"


@dataclass(frozen=True)
class Machine:
    cores: int
    cpu_model: str
    memory_mib: int

    @classmethod
    def this_one(cls) -> Machine:
        return cls(cores=os.cpu_count() or 0, cpu_model=_cpu_model(),
                   memory_mib=_memory_mib())


@dataclass(frozen=True)
class Commit:
    """The commit the benchmark ran from; ``dirty`` when tracked files (other than results and
    their rendered docs) differed from it, so the figure may not be that commit's."""

    sha: str
    dirty: bool

    @classmethod
    def of_checkout(cls, root: Path = REPO_ROOT) -> Commit:
        def git(*args: str) -> str:
            try:
                done = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                      text=True, check=False, timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                return ""
            return done.stdout.strip() if done.returncode == 0 else ""

        sha = git("rev-parse", "HEAD") or "unknown"
        changes = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      ":(exclude)benchmarks/results", ":(exclude)docs/benchmarks.md")
        return cls(sha=sha, dirty=bool(changes))


@dataclass(frozen=True)
class Start:
    """What is taken when a benchmark starts: the UTC time, the load average then, and the
    commit (the code that runs is the code at the start, whatever changes meanwhile)."""

    utc: str
    load_average: float
    commit: Commit

    @classmethod
    def now(cls) -> Start:
        return cls(utc=_utc_now(), load_average=_load_average(), commit=Commit.of_checkout())


@dataclass(frozen=True)
class Results:
    """One run of one benchmark, as written to ``benchmarks/results/<benchmark>.json``.

    ``provenance`` is ``measured`` for a file a benchmark wrote; ``transcribed`` marks figures
    copied from an earlier document (``source`` names it), rendered as such, never as re-run."""

    benchmark: str
    commit: Commit
    machine: Machine
    started_utc: str
    load_average_start: float
    load_average_end: float
    arguments: Mapping[str, object]
    figures: tuple[Figure, ...]
    provenance: Provenance = "measured"
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def verdict(self) -> Verdict:
        return verdict_of(self.figures)

    def to_json(self) -> str:
        """Stable text: keys sorted, one per line, figures in the benchmark's order, so a new
        run reads as a small diff."""
        record: dict[str, object] = {
            "benchmark": self.benchmark,
            "commit": {"sha": self.commit.sha, "dirty": self.commit.dirty},
            "machine": {"cores": self.machine.cores, "cpu_model": self.machine.cpu_model,
                        "memory_mib": self.machine.memory_mib},
            "started_utc": self.started_utc,
            "load_average": {"start": self.load_average_start, "end": self.load_average_end},
            "arguments": dict(self.arguments),
            "figures": [_figure_record(f) for f in self.figures],
            "verdict": self.verdict,
            "provenance": self.provenance,
        }
        if self.source:
            record["source"] = self.source
        if self.notes:
            record["notes"] = list(self.notes)
        return json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Results:
        """Read a results file; the stored verdict must be the one its figures compute, so a
        hand edit of either cannot pass unnoticed."""
        raw = json.loads(text)
        figures = tuple(
            Figure(name=f["name"], value=float(f["value"]), unit=f["unit"],
                   target=None if f.get("target") is None else Target(
                       comparison=f["target"]["comparison"], bound=float(f["target"]["bound"])))
            for f in raw["figures"])
        results = cls(
            benchmark=raw["benchmark"],
            commit=Commit(sha=raw["commit"]["sha"], dirty=bool(raw["commit"]["dirty"])),
            machine=Machine(cores=int(raw["machine"]["cores"]),
                            cpu_model=raw["machine"]["cpu_model"],
                            memory_mib=int(raw["machine"]["memory_mib"])),
            started_utc=raw["started_utc"],
            load_average_start=float(raw["load_average"]["start"]),
            load_average_end=float(raw["load_average"]["end"]),
            arguments=raw["arguments"], figures=figures,
            provenance=cast(Provenance, raw.get("provenance", "measured")),
            source=raw.get("source", ""), notes=tuple(raw.get("notes", ())))
        if raw.get("verdict") != results.verdict:
            raise ValueError(f"{results.benchmark}: the file says {raw.get('verdict')!r} but its "
                             f"figures make it {results.verdict!r}")
        return results


def _figure_record(figure: Figure) -> dict[str, object]:
    record: dict[str, object] = {"name": figure.name, "value": figure.value, "unit": figure.unit}
    if figure.target is not None:
        record["target"] = {"comparison": figure.target.comparison,
                            "bound": figure.target.bound}
        record["met"] = figure.met
    return record


def default_path(benchmark: str) -> Path:
    return RESULTS_DIR / f"{benchmark}.json"


def load_all(folder: Path = RESULTS_DIR) -> dict[str, Results]:
    """Every results file in ``folder``, by benchmark name."""
    found: dict[str, Results] = {}
    for path in sorted(folder.glob("*.json")):
        results = Results.from_json(path.read_text(encoding="utf-8"))
        if results.benchmark != path.stem:
            raise ValueError(f"{path.name} holds the results of {results.benchmark!r}")
        found[results.benchmark] = results
    return found


def add_arguments(parser: argparse.ArgumentParser, benchmark: str) -> None:
    """``--results PATH`` (default ``benchmarks/results/<benchmark>.json``) and ``--no-results``
    for exploratory runs; every benchmark takes both."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--results", type=Path, default=default_path(benchmark), metavar="PATH",
                       help="where to write this run's figures as JSON (default: %(default)s)")
    group.add_argument("--no-results", action="store_true",
                       help="print the figures only; write no results file")


def record(args: argparse.Namespace, benchmark: str, start: Start,
           figures: Sequence[Figure], notes: Sequence[str] = ()) -> Results:
    """Build this run's record and, unless ``--no-results``, write it; print where it went
    and the computed verdict, so the printed output and the file never disagree."""
    arguments = {k: _plain(v) for k, v in sorted(vars(args).items())
                 if k not in ("results", "no_results")}
    results = Results(benchmark=benchmark, commit=start.commit,
                      machine=Machine.this_one(), started_utc=start.utc,
                      load_average_start=start.load_average,
                      load_average_end=_load_average(), arguments=arguments,
                      figures=tuple(figures), notes=tuple(notes))
    print(f"verdict (every figure with a target): {results.verdict}")
    if not args.no_results:
        path = Path(args.results)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(results.to_json(), encoding="utf-8")
        print(f"results: {path}", file=sys.stderr)
    return results


def _plain(value: object) -> object:
    """An argument as JSON. Paths are written relative to the data root or the repository, so
    a results file never names the machine it ran on."""
    if isinstance(value, (Path, str)) and os.path.isabs(value):
        path = Path(value).absolute()
        for root, name in ((data_root(), "$" + DATA_ROOT_ENV), (REPO_ROOT, ".")):
            if path.is_relative_to(root):
                return str(Path(name) / path.relative_to(root))
        return path.name
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()


def _load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # no load average on this platform
        return -1.0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_mib() -> int:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0
