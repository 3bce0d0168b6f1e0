"""The example's autoscaling as shipped: the HPA scales on the seed's three triggers, each a
recording rule (tested under promtool in test_rules.py) handed over by prometheus-adapter; the
pre-warm CronJobs raise minReplicas ahead of the peak and restore it after; the model cache is
on the node, where the serving runtime looks for it; the grace period covers the shutdown.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml

from serving.cache import MODEL_CACHE_ENV
from serving.config import ServerConfig
from tests.manifests.conftest import MANIFESTS

BASE = MANIFESTS / "base"
AUTOSCALING_GROUP = "gpufrag-serving-autoscaling"
PREWARM = "resnet-serving-prewarm"
# adapter metric -> (recording rule, HPA AverageValue target): queue depth above 50 per pod;
# GPU utilisation averaged over 5 minutes above 80% for 2 minutes; p99 above 200 ms for 1 min.
TRIGGERS = {
    "gpufrag_serving_queue_depth":
        ("namespace_pod:gpufrag_serving_queue_depth:max", "50"),
    "gpufrag_serving_gpu_utilization_avg5m_sustained_2m":
        ("namespace_pod:gpufrag_serving_gpu_utilization_ratio:avg5m_min2m", "800m"),
    "gpufrag_serving_request_p99_seconds_sustained_1m":
        ("namespace_pod:gpufrag_serving_request_duration_seconds:p99_rate1m_min1m", "200m"),
}


def example() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((BASE / "serving-example.yaml").read_text()) if d]


def one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in example() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_the_base_ships_the_example_and_the_adapter_rules() -> None:
    resources = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    assert {"serving-example.yaml", "prometheus-adapter-rules.yaml"} <= set(resources)


def test_the_hpa_scales_on_the_three_recorded_triggers(rule_groups: list[dict[str, Any]]
                                                       ) -> None:
    hpa = one("HorizontalPodAutoscaler", "resnet-serving")
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"]
               for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert targets == {metric: target for metric, (_, target) in TRIGGERS.items()}
    # "Above the threshold" exactly: no 10% tolerance before scaling out.
    assert hpa["spec"]["behavior"]["scaleUp"]["tolerance"] == "0"

    (adapter,) = yaml.safe_load_all((BASE / "prometheus-adapter-rules.yaml").read_text())
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    series = {}
    for rule in rules:
        match = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rule["seriesQuery"])
        assert match, rule["seriesQuery"]
        series[rule["name"]["as"]] = match.group(1)
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"},
                                                  "pod": {"resource": "pod"}}
    assert series == {metric: record for metric, (record, _) in TRIGGERS.items()}

    (group,) = [g for g in rule_groups if g["name"] == AUTOSCALING_GROUP]
    recorded = {r["record"] for r in group["rules"]}
    assert {record for record, _ in TRIGGERS.values()} <= recorded
    assert group["interval"] == "15s"  # the HPA's sync period


def _patch(cronjob: dict[str, Any]) -> dict[str, Any]:
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:3] == ["patch", "horizontalpodautoscaler", "resnet-serving"], args
    (patch,) = [a.split("=", 1)[1] for a in args if a.startswith("--patch=")]
    loaded: dict[str, Any] = yaml.safe_load(patch)
    return loaded


def _minutes_of_day(schedule: str) -> int:
    minute, hour, *_ = shlex.split(schedule)
    return int(hour) * 60 + int(minute)


def test_prewarm_raises_min_replicas_before_the_peak_and_restores_it_after() -> None:
    start, end = one("CronJob", PREWARM), one("CronJob", f"{PREWARM}-end")
    hpa = one("HorizontalPodAutoscaler", "resnet-serving")["spec"]
    raised = _patch(start)["spec"]["minReplicas"]
    assert hpa["minReplicas"] < raised <= hpa["maxReplicas"]
    assert _patch(end) == {"spec": {"minReplicas": hpa["minReplicas"]}}
    assert start["spec"]["timeZone"] == end["spec"]["timeZone"]
    assert _minutes_of_day(start["spec"]["schedule"]) < _minutes_of_day(end["spec"]["schedule"])
    assert shlex.split(start["spec"]["schedule"])[2:] == shlex.split(end["spec"]["schedule"])[2:]
    for job in (start, end):
        assert job["spec"]["concurrencyPolicy"] == "Forbid"
        pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == PREWARM
        # Fully qualified, in step with the control plane (kube-scheduler's tag in the base).
        assert pod["containers"][0]["image"] == f"registry.k8s.io/kubectl:{_kube_version()}"


def _kube_version() -> str:
    images = yaml.safe_load((BASE / "kustomization.yaml").read_text())["images"]
    (tag,) = [i["newTag"] for i in images if i["name"] == "kube-scheduler"]
    return str(tag)


def test_prewarm_may_get_and_patch_that_one_hpa_and_nothing_else() -> None:
    role = one("Role", PREWARM)
    assert role["rules"] == [{"apiGroups": ["autoscaling"],
                              "resources": ["horizontalpodautoscalers"],
                              "resourceNames": ["resnet-serving"], "verbs": ["get", "patch"]}]
    binding = one("RoleBinding", PREWARM)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": PREWARM}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PREWARM,
                                    "namespace": "gpufrag-system"}]


@pytest.fixture
def serving_pod() -> dict[str, Any]:
    pod: dict[str, Any] = one("Deployment", "resnet-serving")["spec"]["template"]["spec"]
    return pod


def test_the_model_cache_is_on_the_node_where_serve_looks(serving_pod: dict[str, Any]) -> None:
    (server,) = serving_pod["containers"]
    env = {e["name"]: e["value"] for e in server["env"]}
    cache_dir = env[MODEL_CACHE_ENV]
    assert not any(a.startswith(("--model-cache", "--engine-cache")) for a in server["args"])
    (mount,) = [m for m in server["volumeMounts"] if m["mountPath"] == cache_dir]
    (volume,) = [v for v in serving_pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"  # outlives the pod, not emptyDir
    assert not mount.get("readOnly", False)


def test_the_cache_is_handed_to_the_servers_user(serving_pod: dict[str, Any]) -> None:
    (server,) = serving_pod["containers"]
    (owner,) = serving_pod["initContainers"]
    user = f"{serving_pod['securityContext']['runAsUser']}:" \
           f"{serving_pod['securityContext']['runAsGroup']}"
    cache_dir = {e["name"]: e["value"] for e in server["env"]}[MODEL_CACHE_ENV]
    assert f"chown {user} {cache_dir}" in " ".join(owner["args"])
    assert owner["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert owner["securityContext"]["allowPrivilegeEscalation"] is False
    assert [m["mountPath"] for m in owner["volumeMounts"]] == [cache_dir]


def test_the_grace_period_covers_the_prestop_sleep_and_the_servers_drain(
        serving_pod: dict[str, Any]) -> None:
    """The kubelet's preStop sleep waits out the endpoint's removal (so the server's own delay
    is off), then the server drains for at most --shutdown-timeout-s: the grace period must
    cover both, or the kubelet kills the server mid-drain. The drain under load, as shipped,
    is pinned on a real node (tests/e2e/node/test_serve_pod.py)."""
    (server,) = serving_pod["containers"]
    sleep_s = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    args = dict(a.removeprefix("--").split("=", 1) for a in server["args"] if "=" in a)
    assert float(args["drain-delay-s"]) == 0
    shutdown_s = float(args.get("shutdown-timeout-s", ServerConfig.shutdown_timeout_s))
    assert serving_pod["terminationGracePeriodSeconds"] >= sleep_s + shutdown_s + 5, (
        sleep_s, shutdown_s)
