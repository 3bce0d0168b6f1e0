"""A pod's GPU asks turned into ResourceClaims: the templates, their names, the patch."""

from __future__ import annotations

from typing import Any

import pytest

from defrag.admission.jsonpatch import applied
from defrag.admission.toclaims import (
    DEVICE_CLASS,
    Shape,
    convert,
    same_spec,
    template_for,
    template_spec,
)
from gpufrag.conventions import DEFAULT_NAMES as NAMES
from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from scheduler.kube.claims import DEVICE_CLASSES, asked_gpus


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": list(containers), **spec}}


def container(name: str = "main", *, limits: dict[str, str] | None = None,
              requests: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = dict(extra)
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": "x", "resources": resources}


def asked(template_name: str, converted: Any) -> tuple[int, int, int]:
    """What the template asks, read by the extender's own claim reader."""
    (template,) = [t for t in converted.templates if t.name == template_name]
    (ask,) = asked_gpus(template.spec, device_classes=DEVICE_CLASSES)
    return ask.count, ask.milli, ask.memory_mib


@pytest.mark.parametrize(("resources", "shape", "prefix"), [
    ({NAMES.gpu_milli: "250"}, (1, 250, 0), "gpufrag-250m-"),
    ({NAMES.gpu_memory: "10240"}, (1, 1, 10240), "gpufrag-1m-10240mi-"),
    ({NAMES.gpu_milli: "300", NAMES.gpu_memory: "10240"}, (1, 300, 10240),
     "gpufrag-300m-10240mi-"),
    ({NAMES.gpu: "1"}, (1, 1000, 0), "gpufrag-1gpu-"),
    ({NAMES.gpu: "2"}, (2, 1000, 0), "gpufrag-2gpu-"),
    ({NAMES.gpu_milli: "2000"}, (2, 1000, 0), "gpufrag-2gpu-"),
])
def test_each_ask_becomes_a_claim_of_its_shape(resources: dict[str, str],
                                               shape: tuple[int, int, int], prefix: str) -> None:
    original = pod(container(limits=resources, requests={**resources, "cpu": "1"}))
    converted = convert(original, NAMES)
    (template,) = converted.templates
    assert template.name.startswith(prefix) and len(template.name) == len(prefix) + 10
    assert asked(template.name, converted) == shape
    out = applied(original, converted.patch)
    assert out["spec"]["resourceClaims"] == [
        {"name": "gpufrag-gpu-0", "resourceClaimTemplateName": template.name}]
    res = out["spec"]["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "1"} and res["limits"] == {}
    assert res["claims"] == [{"name": "gpufrag-gpu-0"}]
    assert converted.containers == (("main", template.name),)


def test_the_template_is_what_docs_and_the_e2e_templates_write() -> None:
    assert template_spec(Shape(1, 300, 10240)) == {"spec": {"devices": {"requests": [{
        "name": "gpu", "exactly": {
            "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"milli": "300", "memory": "10240Mi"}}}}]}}}
    whole = template_spec(Shape(2))["spec"]["devices"]["requests"][0]["exactly"]
    assert "capacity" not in whole and whole["count"] == 2


def test_names_follow_the_spec_and_nothing_else() -> None:
    assert template_for(Shape(1, 250)) == template_for(Shape(1, 250))
    names = {template_for(s).name for s in (Shape(1, 250), Shape(1, 251), Shape(1, 250, 1),
                                            Shape(1), Shape(2))}
    assert len(names) == 5


def test_a_pod_without_gpu_asks_is_left_alone() -> None:
    converted = convert(pod(container(requests={"cpu": "1"})), NAMES)
    assert converted.patch == [] and converted.templates == ()


def test_each_container_gets_its_claim_and_one_shape_one_template() -> None:
    share = {NAMES.gpu_milli: "250"}
    original = pod(container("a", limits=share), container("b", requests={"cpu": "1"}),
                   container("c", limits=share),
                   initContainers=[container("init", limits={NAMES.gpu: "1"})])
    converted = convert(original, NAMES)
    assert len(converted.templates) == 2
    out = applied(original, converted.patch)
    entries = {e["name"]: e["resourceClaimTemplateName"] for e in out["spec"]["resourceClaims"]}
    assert set(entries) == {"gpufrag-gpu-0", "gpufrag-gpu-2", "gpufrag-init-gpu-0"}
    assert entries["gpufrag-gpu-0"] == entries["gpufrag-gpu-2"]
    assert "claims" not in out["spec"]["containers"][1]["resources"]
    assert out["spec"]["initContainers"][0]["resources"]["claims"] == [
        {"name": "gpufrag-init-gpu-0"}]


def test_claims_the_pod_has_are_kept_beside_the_new_ones() -> None:
    mine = {"name": "mine", "resourceClaimTemplateName": "other"}
    original = pod(container(limits={NAMES.gpu_milli: "250"}, claims=[{"name": "mine"}]),
                   resourceClaims=[mine])
    out = applied(original, convert(original, NAMES).patch)
    assert [e["name"] for e in out["spec"]["resourceClaims"]] == ["mine", "gpufrag-gpu-0"]
    assert out["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "mine"}, {"name": "gpufrag-gpu-0"}]


@pytest.mark.parametrize(("resources", "spec", "names", "words"), [
    ({NAMES.gpu_milli: "1500"}, {}, NAMES, "a share is part of one GPU"),
    ({NAMES.gpu: "2", NAMES.gpu_memory: "100"}, {}, NAMES, "a share is part of one GPU"),
    ({NAMES.gpu: "2", NAMES.gpu_milli: "1000"}, {}, NAMES, "ask one of them"),
    ({NAMES.gpu: "17"}, {}, NAMES, "a node has at most 16"),
    ({NAMES.gpu_milli: "lots"}, {}, NAMES, "gpu-milli"),
    ({"nvidia.com/gpucores": "30", "nvidia.com/gpu": "1"}, {},
     KubeNames(gpu_cores="nvidia.com/gpucores"), "not percent"),
    ({NAMES.gpu_milli: "250"}, {"resourceClaims": [{"name": "gpufrag-gpu-0",
                                                    "resourceClaimTemplateName": "t"}]},
     NAMES, "already has a claim named 'gpufrag-gpu-0'"),
])
def test_asks_the_driver_cannot_serve_are_refused_naming_them(
        resources: dict[str, str], spec: dict[str, Any], names: KubeNames, words: str) -> None:
    with pytest.raises(BadInput, match=words):
        convert(pod(container(limits=resources), **spec), names)


def test_a_template_as_the_api_server_returns_it_is_the_same_spec() -> None:
    wanted = template_spec(Shape(1, 300, 10240))
    stored = {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1,
        "capacity": {"requests": {"milli": "300", "memory": "10Gi"}}}}]}}}
    assert same_spec(stored, wanted)
    defaulted = template_spec(Shape(1, 250))
    del defaulted["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"]
    del defaulted["spec"]["devices"]["requests"][0]["exactly"]["count"]
    assert same_spec(defaulted, template_spec(Shape(1, 250)))


@pytest.mark.parametrize("change", [
    lambda e: e.update(selectors=[{"cel": {"expression": 'device.attributes["x"].index == 0'}}]),
    lambda e: e.update(count=2),
    lambda e: e["capacity"]["requests"].update(milli="900"),
    lambda e: e.update(deviceClassName="other.example.com"),
])
def test_a_template_steered_any_way_is_another_spec(change: Any) -> None:
    wanted = template_spec(Shape(1, 250))
    found = template_spec(Shape(1, 250))
    change(found["spec"]["devices"]["requests"][0]["exactly"])
    assert not same_spec(found, wanted)
    labelled = {**template_spec(Shape(1, 250)), "metadata": {"labels": {"a": "b"}}}
    assert not same_spec(labelled, wanted)
