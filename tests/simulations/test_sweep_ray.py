"""A sweep on a real local Ray cluster (a head and two worker nodes) gives the local results.

Ray is an optional extra (``pip install 'gpufrag[ray]'``; the dev extra installs it, so CI runs
this test). Without Ray installed the test is skipped and says why (in CI, a failure:
tests/skips.py).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simulations import sweep
from simulations.events import EventConfig
from tests import skips

ray: Any = skips.importorskip("ray", skips.NOT_INSTALLED,
                              "Ray: pip install 'gpufrag[ray]'; the dev extra includes it")
Cluster: Any = skips.importorskip("ray.cluster_utils", skips.NOT_INSTALLED, "Ray").Cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    # The head takes no tasks; each worker node has one CPU: runs go to the two workers.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def test_ray_sweep_merges_to_the_local_results(ray_cluster: Any, tmp_path: Path) -> None:
    inputs = sweep.load_inputs(nodes_path=None, pods_path=None, genai="synthetic",
                               synthetic_node_count=12, load=None, start_s=None, hours=2,
                               workload_seed=0, coverage=0.95)
    base = EventConfig(hours=2, serving_models=2, serving_peak_rps=600)
    configs = sweep.expand({"policy": ["fgd", "bestfit"], "seed": [1, 2]}, base)
    local = sweep.sweep(inputs, configs, tmp_path / "local", jobs=1, stream=io.StringIO())
    on_ray = sweep.sweep(inputs, configs, tmp_path / "ray", ray_address=ray_cluster.address,
                         stream=io.StringIO())
    assert on_ray.ran == 4
    assert sweep.same_results(sweep.collect([tmp_path / "ray"]), local.records)
    assert not ray.is_initialized()  # the sweep disconnects from a cluster it connected to
    ray.init(address=ray_cluster.address, log_to_driver=False)
    workers = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]
    assert len(workers) == 2
