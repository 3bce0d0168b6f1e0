"""Replay a few hundred pods through the extender (prioritize over HTTP, or the deciding filter,
then bind) and through the core's ``choose`` on the same state: the one node the extender gives
10, or the one its filter answers with, is the core's node, and bind takes the core's GPUs.
From the openb trace when the data root has it (tests/data.py), else from the synthetic generator
of the same shape (under the strict switch, CI's, a missing trace fails instead)."""

from __future__ import annotations

import orjson
import pytest

from scheduler.core import ClusterState, NodeSpec, PodRequest, ScoreCache, TargetWorkload, choose
from scheduler.kube.convert import node_to_k8s, pod_to_k8s
from scheduler.policies import make_policy
from simulations.openb import load_nodes, load_pods
from simulations.synthetic import synthetic_nodes, synthetic_pods
from tests.data import trace_or_none
from tests.scheduler.extender.helpers import RecordingBinder, k8s_pod, post, serve

PODS = 300


def trace() -> tuple[list[NodeSpec], list[PodRequest]]:
    nodes_csv = trace_or_none("openb", "openb_node_list_gpu_node.csv")
    pods_csv = trace_or_none("openb", "openb_pod_list_default.csv")
    if nodes_csv is not None and pods_csv is not None:
        nodes, pods = load_nodes(nodes_csv)[::24], load_pods(pods_csv)
    else:
        nodes, pods = synthetic_nodes(50, seed=3), synthetic_pods(3 * PODS, seed=3)
    gpu_pods = [p for p in pods if p.wants_gpu][:PODS]
    return nodes, [PodRequest(**{**_fields(p), "namespace": "default"}) for p in gpu_pods]


def _fields(p: PodRequest) -> dict[str, object]:
    return {f: getattr(p, f) for f in p.__slots__}


@pytest.mark.parametrize("verb", ["prioritize", "filter"])
def test_extender_picks_the_core_node_and_gpus_for_every_pod(verb: str) -> None:
    nodes, pods = trace()
    binder = RecordingBinder()
    runtime = serve(nodes, [k8s_pod(p) for p in pods], binder=binder)
    client = runtime.app.test_client()
    names = [n.name for n in nodes]
    node_objs = [node_to_k8s(n) for n in nodes]

    state = ClusterState(nodes)
    policy = make_policy("fgd", workload=TargetWorkload.from_pods(pods))
    cache = ScoreCache(policy)
    placed = 0
    for i, pod in enumerate(pods):
        decision = choose(state, policy, pod, cache=cache)
        # Every tenth request in Nodes mode (nodeCacheCapable: false), the rest NodeNames.
        args = ({"Pod": pod_to_k8s(pod), "Nodes": {"items": node_objs}} if i % 10 == 0 else
                {"Pod": pod_to_k8s(pod), "NodeNames": names})
        status, reply = post(client, f"/{verb}", orjson.dumps(args))
        assert status == 200
        if verb == "prioritize":
            tens = [h["Host"] for h in reply if h["Score"] == 10]
        else:  # the decision alone, in the form asked
            tens = (reply["NodeNames"] if "NodeNames" in args else
                    [n["metadata"]["name"] for n in reply["Nodes"]["items"]])
        if decision is None:
            assert tens == [], f"pod {i} fits nowhere, yet the extender ranks {tens}"
            continue
        assert tens == [decision.node], f"pod {i} ({pod.shape})"
        status, reply = post(client, "/bind", {"PodName": pod.name, "PodNamespace": "default",
                                               "PodUID": "", "Node": decision.node})
        assert reply == {"Error": ""}
        assert binder.calls[-1].gpus == decision.gpus, f"pod {i} ({pod.shape})"
        state.place(pod, decision.row, decision.gpus)
        placed += 1
    # ~50 nodes for 300 pods: the replay runs the cluster full (openb: 283 placed, 95% of the
    # GPUs allocated), so the later decisions are the hard, fragmented ones.
    assert PODS // 2 <= placed < PODS
    assert runtime.cache.counts()["pods_assumed"] == placed
