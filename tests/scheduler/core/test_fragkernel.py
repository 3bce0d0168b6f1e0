"""Every compiled fragmentation kernel gives the numpy form's bits, so the engine never changes a
decision (an engine that is not installed is skipped, with the reason); the C kernel refuses
bad buffers with a message instead of reading out of bounds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from scheduler.core import fragkernel
from scheduler.core.fragmentation import (
    fragmentation_after_share,
    fragmentation_after_whole,
    fragmentation_in_spec_order,
    fragmentation_of,
)
from tests import skips
from tests.builders import workload

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def pin_engine() -> Iterator[Callable[[str], None]]:
    """``fragkernel.use``, with the engine in use before the test put back after it."""
    previous = fragkernel.engine()
    yield fragkernel.use
    fragkernel.use(previous)


def _installed(engine: str) -> fragkernel.Kernel:
    kernel = fragkernel.kernel(engine)
    if kernel is None:
        # The C engine is built at install where a compiler is (checked below); numba is locked.
        skips.skip(skips.NO_C_COMPILER if engine == "c" else skips.NOT_INSTALLED,
                   f"the {engine} engine")
    return kernel


@pytest.mark.parametrize("engine", fragkernel.ENGINES)
@pytest.mark.parametrize("seed", range(5))
def test_every_kernel_is_bit_equal_to_the_numpy_form(engine: str, seed: int,
                                                    pin_engine: Callable[[str], None]) -> None:
    _installed(engine)
    pin_engine(engine)
    rng = np.random.default_rng(seed)
    rows = 60
    free = rng.integers(0, 1001, size=(rows, 8)).astype(np.int64)
    free[rng.random((rows, 8)) < 0.4] = 1000
    free[:, 6:][rng.random((rows, 2)) < 0.5] = 0  # nodes with fewer GPUs
    cpu = rng.integers(0, 96_000, rows).astype(np.int64)
    product = rng.integers(0, 3, rows).astype(np.int64)
    target = workload((4000, 1, 500, 0.25), (8000, 1, 1000, 0.25), (16000, 2, 1000, 0.2),
                      (2000, 0, 0, 0.1), (1000, 1, 250, 0.1), (64_000, 8, 1000, 0.1),
                      gpu_spec=(frozenset(), frozenset({"A"}), frozenset(), frozenset(),
                                frozenset({"B", "C"}), frozenset()))
    allowed = np.array([[True, True, True], [True, False, False], [True, True, True],
                        [True, True, True], [False, True, True], [True, True, True]])
    fast = fragmentation_of(free, cpu, product, target, allowed)
    slow = fragmentation_in_spec_order(free, cpu, product, target, allowed)
    assert np.array_equal(fast, slow)
    assert fragmentation_of(free[:0], cpu[:0], product[:0], target, allowed).shape == (0,)


@pytest.mark.parametrize("seed", range(4))
def test_the_fused_before_and_after_gives_the_composed_forms_bits(
        seed: int, pin_engine: Callable[[str], None]) -> None:
    """The C engine's one-call "F before and after a pod" (share on each GPU, whole GPUs) is
    bit-equal to the same figures composed from rows in numpy, so FGD's scores and decisions
    do not depend on which path computed them."""
    _installed("c")
    rng = np.random.default_rng(seed)
    rows = 40
    free = rng.integers(0, 1001, size=(rows, 8)).astype(np.int64)
    free[rng.random((rows, 8)) < 0.4] = 1000
    free[:, 6:][rng.random((rows, 2)) < 0.5] = 0
    cpu = rng.integers(0, 96_000, rows).astype(np.int64)
    product = rng.integers(0, 2, rows).astype(np.int64)
    target = workload((4000, 1, 500, 0.4), (8000, 2, 1000, 0.3), (2000, 0, 0, 0.1),
                      (1000, 1, 250, 0.2),
                      gpu_spec=(frozenset(), frozenset({"A"}), frozenset(), frozenset()))
    allowed = np.array([[True, True], [True, False], [True, True], [True, True]])
    results = {}
    for engine in ("c", "numpy"):
        pin_engine(engine)
        results[engine] = (
            fragmentation_after_share(free, cpu, product, target, allowed, 350, 4000),
            *(fragmentation_after_whole(free, cpu, product, target, allowed, n, 1000, 8000)
              for n in (0, 1, 3)))
    for fused, composed in zip(results["c"], results["numpy"], strict=True):
        for a, b in zip(fused, composed, strict=True):
            assert a.dtype == b.dtype == np.float64
            assert np.array_equal(a, b)


def test_the_fused_call_refuses_an_output_of_the_wrong_shape(
        pin_engine: Callable[[str], None]) -> None:
    _installed("c")
    pin_engine("c")
    fused = fragkernel.compiled_before_after()
    assert fused is not None
    arguments = _arguments()
    *inputs, _ = arguments.values()
    with pytest.raises(ValueError, match=re.escape("out has 2 columns, 9 expected")):
        fused(*inputs, 250, 0, -1, 1000, np.empty((4, 2)))
    with pytest.raises(ValueError, match=re.escape("out: 2 dimensions expected, got 1")):
        fused(*inputs, 1000, 0, 1, 1000, np.empty(4))
    out = np.empty((4, 2))
    fused(*inputs, 1000, 0, 1, 1000, out)
    assert out.tolist() == [[8000.0, 7000.0]] * 4


def test_the_c_kernel_is_built_where_a_compiler_and_the_headers_exist() -> None:
    """The C engine is optional at install, so nothing else would notice it missing: where this
    machine could build it, the test command's install must have."""
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if shutil.which("cc") is None or not headers.exists():
        skips.skip(skips.NO_C_COMPILER, "the numba engine is used")
    assert fragkernel.kernel("c") is not None, "pip install -e . did not build _fragkernel"


def test_the_c_kernel_is_the_default_and_numba_is_not_imported() -> None:
    """What makes a first replay fast: the C engine wins, and numba is never imported."""
    _installed("c")
    probe = ("import sys; from scheduler.core import fragkernel; "
             "print(fragkernel.engine(), 'numba' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFRAG_KERNEL", "GPUFRAG_NO_JIT")}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=120, check=True)
    assert done.stdout.split() == ["c", "False"], done.stdout + done.stderr


def _arguments(rows: int = 4) -> dict[str, object]:
    target = workload((4000, 1, 500, 0.5), (8000, 1, 1000, 0.5),
                      gpu_spec=(frozenset({"A"}), frozenset()))
    thresholds, threshold_of, cpu_milli, num_gpu, gpu_milli, popularity = target._kernel_specs
    return {"free": np.full((rows, 8), 1000, np.int64), "cpu_left": np.zeros(rows, np.int64),
            "product": np.zeros(rows, np.int64), "thresholds": thresholds,
            "threshold_of": threshold_of, "cpu_milli": cpu_milli, "num_gpu": num_gpu,
            "gpu_milli": gpu_milli, "popularity": popularity,
            "allowed": np.ones((2, 1), np.bool_), "constrained": True,
            "out": np.empty(rows)}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("free", np.full((4, 8), 1000, np.int32), "free: items must be int64"),
    ("free", np.full((4, 16), 1000, np.int64)[:, ::2], "free: not a C-contiguous array"),
    ("free", np.full(32, 1000, np.int64), "free: 2 dimensions expected, got 1"),
    ("cpu_left", np.zeros(3, np.int64), "cpu_left has 3 entries, free has 4"),
    ("product", np.array([0, 0, 1, 0], np.int64), "product[2] = 1 outside 0..0"),
    ("product", np.array([0, -1, 0, 0], np.int64), "product[1] = -1 outside 0..0"),
    ("threshold_of", np.array([0, 7], np.int64), "threshold_of[1] = 7 outside 0..1"),
    ("popularity", np.ones(2, np.float32), "popularity: items must be float64"),
    ("allowed", np.ones((3, 1), np.bool_), "allowed has 3 entries, cpu_milli has 2"),
    ("out", np.empty(4)[::-1], "out: not a C-contiguous writable array"),
    ("out", np.empty(3), "out has 3 entries, free has 4"),
])
def test_the_c_kernel_refuses_bad_buffers_naming_them(field: str, value: object,
                                                       message: str) -> None:
    kernel = _installed("c")
    arguments = _arguments()
    arguments[field] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        kernel(*arguments.values())


def test_the_c_kernel_answers_valid_buffers() -> None:
    kernel = _installed("c")
    arguments = _arguments()
    kernel(*arguments.values())
    out = arguments["out"]
    assert isinstance(out, np.ndarray)
    # All eight GPUs free, no CPU left: every spec lacks CPU, so all 8000 milli is fragment.
    assert out.tolist() == [8000.0] * 4


def test_an_unknown_engine_in_the_environment_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Read at first use, deep in a replay (here in a worker process): still reported as the
    command's bad input, not a traceback."""
    env = {**os.environ, "GPUFRAG_KERNEL": "cuda"}
    env.pop("GPUFRAG_NO_JIT", None)
    done = subprocess.run([sys.executable, "-m", "gpufrag.cli", "whatif", "--synthetic-nodes",
                           "20", "--policies", "fgd,bestfit", "--jobs", "2", "--no-plots",
                           "--out", str(tmp_path)], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "gpufrag whatif: GPUFRAG_KERNEL='cuda': choose c, numba or numpy"), done.stderr
    assert "Traceback" not in done.stderr


def test_an_engine_asked_for_by_name_that_is_not_installed_is_refused_at_start(
        tmp_path: Path) -> None:
    """Fail safe: GPUFRAG_KERNEL=numba where numba cannot be imported does not quietly run
    another engine (slower: a filter past kube-scheduler's timeout); the command says so."""
    blocker = tmp_path / "no_numba"
    blocker.mkdir()
    (blocker / "numba.py").write_text("raise ImportError('numba is not installed here')\n")
    env = {**os.environ, "GPUFRAG_KERNEL": "numba",
           "PYTHONPATH": os.pathsep.join([str(blocker), str(REPO)])}
    env.pop("GPUFRAG_NO_JIT", None)
    done = subprocess.run([sys.executable, "-m", "gpufrag.cli", "whatif", "--synthetic-nodes",
                           "20", "--policies", "fgd", "--no-plots", "--out", str(tmp_path)],
                          cwd=REPO, env=env, text=True, capture_output=True, timeout=120,
                          check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "gpufrag whatif: GPUFRAG_KERNEL='numba': that engine is not installed here; "
        "installed: c"), done.stderr
    assert "Traceback" not in done.stderr
