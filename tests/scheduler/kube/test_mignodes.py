"""scheduler.kube.mignodes: MIG nodes from GPU feature discovery's labels and the allocatable
counts NVIDIA's device plugin publishes, or from the agent's reading; which instances are in
use; the cache feeding it."""

from __future__ import annotations

from gpufrag.conventions import MANAGED_RESOURCES, MIG_RESOURCES
from scheduler.core.mig import MIG_MODELS, MigInstance, taken_mask
from scheduler.kube.cache import ClusterCache
from scheduler.kube.convert import mig_profile_of
from scheduler.kube.mignodes import (
    AgentMig,
    layout_of,
    mig_node_from_k8s,
    mig_node_to_k8s,
    mig_resources,
)
from scheduler.kube.mignodes import mig_pod_to_k8s as mig_pod

H100 = MIG_MODELS["H100-80GB"]
PRODUCT = "NVIDIA-H100-80GB-HBM3"


def test_a_node_from_labels_and_counts() -> None:
    obj = mig_node_to_k8s("m0", PRODUCT, 81_559, 2, {"3g.40gb": 2, "4g.40gb": 2},
                          config="all-balanced", whole_gpus=1)
    spec = mig_node_from_k8s(obj)
    assert spec is not None
    assert (spec.model, spec.gpus, spec.config, dict(spec.allocatable)) == (
        H100, 2, "all-balanced", {"3g.40gb": 2, "4g.40gb": 2})  # 3 GPUs, one not in MIG mode
    assert [(i.gpu, i.profile, i.start) for i in spec.packed] == [
        (0, "4g.40gb", 0), (0, "3g.40gb", 4), (1, "4g.40gb", 0), (1, "3g.40gb", 4)]
    assert not spec.unplaced and spec.agent is None


def test_nodes_without_mig_instances_are_not_mig_nodes() -> None:
    obj = mig_node_to_k8s("m0", PRODUCT, 81_559, 2, {})
    assert mig_node_from_k8s(obj) is None
    obj["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "0"
    assert mig_node_from_k8s(obj) is None
    assert mig_node_from_k8s({"metadata": {"name": "x"}}) is None


def test_without_a_gpu_count_the_fewest_gpus_that_hold_the_counts() -> None:
    obj = mig_node_to_k8s("m0", PRODUCT, 81_559, 3, {"7g.80gb": 3})
    del obj["metadata"]["labels"]["nvidia.com/gpu.count"]
    spec = mig_node_from_k8s(obj)
    assert spec is not None and spec.gpus == 3 and not spec.unplaced


def test_a_product_the_table_lacks_is_counted_but_has_no_model() -> None:
    spec = mig_node_from_k8s(mig_node_to_k8s("m0", "NVIDIA-H100-NVL", 95_830, 1,
                                             {"1g.12gb": 7}))
    assert spec is not None and spec.model is None and spec.allocatable == {"1g.12gb": 7}


def test_the_agent_reading_gives_positions_while_fresh() -> None:
    agent = AgentMig((MigInstance(0, "3g.40gb", 0, False), MigInstance(0, "3g.40gb", 4, True)),
                     fresh_until=100.0)
    obj = mig_node_to_k8s("m0", PRODUCT, 81_559, 1, {"3g.40gb": 2})
    obj["metadata"]["annotations"] = {"gpufrag.io/gpu-usage": "{...}"}
    spec = mig_node_from_k8s(obj, reader=lambda text: agent)
    assert spec is not None and spec.agent is agent
    fresh = layout_of(spec, {}, now=50.0)
    assert fresh.source == "agent" and fresh.free == {"3g.40gb": 1}
    assert [i.start for i in fresh.instances if i.in_use] == [4]  # the agent's, not the first
    # A pod placed since the reading holds the other one.
    assert layout_of(spec, {"3g.40gb": 2}, now=50.0).free == {"3g.40gb": 0}
    stale = layout_of(spec, {"3g.40gb": 1}, now=150.0)
    assert stale.source == "labels" and [i.start for i in stale.instances if i.in_use] == [0]


def test_the_cache_counts_bound_and_assumed_mig_pods_in_use() -> None:
    cache = ClusterCache()
    cache.apply_node(mig_node_to_k8s("m0", PRODUCT, 81_559, 2, {"3g.40gb": 2, "1g.10gb": 7}))
    cache.apply_pod(mig_pod("a", {"3g.40gb": 1}, node="m0"))
    cache.apply_pod(mig_pod("b", {"1g.10gb": 2}))
    layout = cache.mig.layout(cache.state, "m0", 0.0)
    assert layout is not None
    assert layout.in_use == {"3g.40gb": 1} and layout.free == {"3g.40gb": 1, "1g.10gb": 7}
    # the pending pod counts once assumed there, never against itself
    request = cache.pods["default/b"].request
    cache.assume(request, cache.state.index["m0"], ())
    after = cache.mig.layout(cache.state, "m0", 0.0)
    assert after is not None and after.free["1g.10gb"] == 5
    itself = cache.mig.layout(cache.state, "m0", 0.0, exclude="default/b")
    assert itself is not None and itself.free["1g.10gb"] == 7
    masks = {i.gpu: 0 for i in after.instances}
    used = [(i.gpu, i.profile, i.start) for i in after.instances if i.in_use]
    for gpu in masks:
        taken_mask(H100, [(p, s) for g, p, s in used if g == gpu])  # legal, apart
    # the whole-GPU target workload leaves MIG pods out; the MIG one counts them
    assert cache.workload_pods() == []
    assert cache.mig.profile_counts() == {"3g.40gb": 1, "1g.10gb": 2}
    cache.delete_pod("default/a")
    gone = cache.mig.layout(cache.state, "m0", 0.0)
    assert gone is not None and gone.free["3g.40gb"] == 2
    cache.delete_node("m0")
    assert cache.mig.layout(cache.state, "m0", 0.0) is None


def test_a_node_losing_its_mig_instances_is_no_longer_a_mig_node() -> None:
    cache = ClusterCache()
    cache.apply_node(mig_node_to_k8s("m0", PRODUCT, 81_559, 1, {"7g.80gb": 1}))
    assert "m0" in cache.mig.nodes
    cache.apply_node(mig_node_to_k8s("m0", PRODUCT, 81_559, 1, {}))
    assert "m0" not in cache.mig.nodes


def test_a_heartbeat_is_not_read_again() -> None:
    reads: list[str] = []

    def reader(text: str) -> AgentMig | None:
        reads.append(text)
        return None

    cache = ClusterCache(mig_reader=reader)
    obj = mig_node_to_k8s("m0", PRODUCT, 81_559, 1, {"7g.80gb": 1})
    obj["metadata"]["annotations"] = {"gpufrag.io/gpu-usage": "one"}
    cache.apply_node(obj)
    cache.apply_node(obj)
    assert reads == ["one"]
    obj["metadata"]["annotations"]["gpufrag.io/gpu-usage"] = "two"
    cache.apply_node(obj)
    assert reads == ["one", "two"]


def test_the_resources_a_scheduler_configuration_must_manage_are_every_profile_s() -> None:
    resources = mig_resources()
    assert len(resources) == len(set(resources)) == 17  # the four families share 7 names
    assert {"nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-7g.141gb"} <= \
        set(resources)
    assert all(mig_profile_of(r) for r in resources)
    # The shipped scheduler configurations manage exactly these (counted by kube-scheduler too).
    assert resources == MIG_RESOURCES
    assert {r for r, ignored in MANAGED_RESOURCES.items() if r.startswith("nvidia.com/mig-")
            and not ignored} == set(resources)
