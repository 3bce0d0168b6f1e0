"""A pod's GPU asks turned into ResourceClaims: the templates, their names, the patch."""

from __future__ import annotations

from typing import Any

import pytest

from defrag.admission.jsonpatch import applied
from defrag.admission.toclaims import (
    DEVICE_CLASS,
    Conversion,
    Shape,
    convert,
    same_spec,
    template_for,
    template_spec,
)
from gpufrag.conventions import DEFAULT_NAMES as NAMES
from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from scheduler.core.mig import most_per_gpu
from scheduler.core.types import MAX_GPUS_PER_NODE
from scheduler.kube.claims import DEVICE_CLASSES, asked_gpus, mig_class_name
from scheduler.kube.mignodes import mig_resource


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


def moved_into_one_claim(resources: dict[str, str], prefix: str) -> Conversion:
    """The conversion of a one-container pod asking ``resources`` (and a CPU), checked to
    move them all into one claim of one template named ``<prefix><hash>``."""
    original = pod(container(limits=resources, requests={**resources, "cpu": "1"}))
    converted = convert(original, NAMES)
    (template,) = converted.templates
    assert template.name.startswith(prefix) and len(template.name) == len(prefix) + 10
    out = applied(original, converted.patch)
    assert out["spec"]["resourceClaims"] == [
        {"name": "gpufrag-gpu-0", "resourceClaimTemplateName": template.name}]
    res = out["spec"]["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "1"} and res["limits"] == {}
    assert res["claims"] == [{"name": "gpufrag-gpu-0"}]
    assert converted.containers == (("main", template.name),)
    return converted


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
    converted = moved_into_one_claim(resources, prefix)
    assert asked(converted.templates[0].name, converted) == shape


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
                                            Shape(1), Shape(2), Shape(1, profile="3g.40gb"),
                                            Shape(2, profile="3g.40gb"),
                                            Shape(1, profile="3g.20gb"))}
    assert len(names) == 8


@pytest.mark.parametrize(("profile", "count", "prefix"), [
    ("3g.40gb", "1", "gpufrag-1mig-3g-40gb-"),
    ("1g.10gb", "3", "gpufrag-3mig-1g-10gb-"),
    ("7g.141gb", "2", "gpufrag-2mig-7g-141gb-"),
])
def test_a_mig_ask_becomes_an_exact_count_of_the_profiles_class(profile: str, count: str,
                                                                prefix: str) -> None:
    (template,) = moved_into_one_claim({mig_resource(profile): count}, prefix).templates
    assert template.shape == Shape(int(count), profile=profile)
    assert template.spec == {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": mig_class_name(profile), "allocationMode": "ExactCount",
        "count": int(count)}}]}}}
    # Not a GPU or a share: the extender's reader of our GPU classes passes it over.
    assert asked_gpus(template.spec, device_classes=DEVICE_CLASSES) == ()


def test_mig_and_gpu_asks_in_separate_containers_each_get_their_claim() -> None:
    mig = {mig_resource("1g.10gb"): "1"}
    original = pod(container("a", limits=mig), container("b", limits={NAMES.gpu_milli: "250"}),
                   initContainers=[container("init", limits=mig)])
    converted = convert(original, NAMES)
    entries = {c: t for c, t in converted.containers}
    assert entries["a"] == entries["init"] == template_for(Shape(1, profile="1g.10gb")).name
    assert entries["b"] == template_for(Shape(1, 250)).name
    assert len(converted.templates) == 2
    out = applied(original, converted.patch)
    assert out["spec"]["initContainers"][0]["resources"] == {
        "limits": {}, "claims": [{"name": "gpufrag-init-gpu-0"}]}


def test_a_mig_ask_of_zero_is_no_ask() -> None:
    converted = convert(pod(container(limits={mig_resource("3g.40gb"): "0"})), NAMES)
    assert converted.patch == [] and converted.templates == ()


def test_the_bound_on_a_count_is_what_a_node_of_the_table_holds() -> None:
    most = MAX_GPUS_PER_NODE * most_per_gpu("1g.10gb")
    convert(pod(container(limits={mig_resource("1g.10gb"): str(most)})), NAMES)
    with pytest.raises(BadInput, match=f"asks {most + 1} nvidia.com/mig-1g.10gb; a node holds "
                                       f"at most {most}"):
        convert(pod(container(limits={mig_resource("1g.10gb"): str(most + 1)})), NAMES)


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
    ({"nvidia.com/mig-5g.99gb": "1"}, {}, NAMES,
     "asks nvidia.com/mig-5g.99gb: '5g.99gb' is not a MIG profile of any GPU gpufrag knows"
     ".*partitions of 1g.5gb, .*, 7g.141gb$"),
    ({"nvidia.com/mig-1g.10gb+me": "1"}, {}, NAMES, "'1g.10gb\\+me' is not a MIG profile"),
    ({mig_resource("3g.40gb"): "1", NAMES.gpu_milli: "250"}, {}, NAMES,
     "asks nvidia.com/mig-3g.40gb and gpufrag.io/gpu-milli: a container gets either MIG "
     "partitions or whole GPUs / a share of a GPU, not both"),
    ({mig_resource("3g.40gb"): "1", NAMES.gpu: "1"}, {}, NAMES,
     "asks nvidia.com/mig-3g.40gb and nvidia.com/gpu: "),
    ({mig_resource("3g.40gb"): "1", NAMES.gpu_memory: "1024"}, {}, NAMES,
     "asks nvidia.com/mig-3g.40gb and gpufrag.io/gpu-memory-mib: "),
    ({mig_resource("3g.40gb"): "1", mig_resource("1g.10gb"): "2"}, {}, NAMES,
     "several MIG profiles \\(nvidia.com/mig-1g.10gb, nvidia.com/mig-3g.40gb\\)"),
    ({mig_resource("3g.40gb"): "1.5"}, {}, NAMES, "not a whole number of MIG partitions"),
    ({mig_resource("3g.40gb"): "33"}, {}, NAMES,
     "asks 33 nvidia.com/mig-3g.40gb; a node holds at most 32 \\(16 GPUs of 2 each\\)"),
    ({mig_resource("3g.40gb"): "many"}, {}, NAMES, "mig-3g.40gb"),
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
