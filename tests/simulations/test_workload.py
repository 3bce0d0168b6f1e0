"""simulations.workload: the copies a replay adds are named so no two pods share a name."""

from __future__ import annotations

from simulations.workload import copy_named
from tests.builders import pod


def test_a_copy_takes_the_suffix_and_the_next_free_number_on_a_clash() -> None:
    taken = {"p0", "p0-r1", "p0-r1.1"}
    first = copy_named(pod("p0", gpu_milli=500), "r1", taken)
    assert (first.name, first.gpu_milli) == ("p0-r1.2", 500)  # the rest of the pod is kept
    second = copy_named(pod("p0"), "c3", taken)
    assert second.name == "p0-c3"
    assert {"p0-r1.2", "p0-c3"} <= taken
