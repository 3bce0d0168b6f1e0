"""The compiled fragmentation kernel gives the numpy form's bits, so the engine never changes a
decision (skipped, with the reason, where numba is not installed)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core import fragkernel
from scheduler.core.fragmentation import fragmentation_in_spec_order, fragmentation_of
from tests.builders import workload


@pytest.mark.skipif(fragkernel.compiled() is None,
                    reason="the compiled kernel is off: no numba, or GPUFRAG_NO_JIT is set")
@pytest.mark.parametrize("seed", range(5))
def test_kernel_is_bit_equal_to_the_numpy_form(seed: int) -> None:
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
