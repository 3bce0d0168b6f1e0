"""devkit/chart.py on small bases: what becomes a value, what a template looks like, and that a
changed base leaves a written chart stale. Rendering with helm: tests/e2e/test_helm.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from devkit import chart
from devkit.chart import ChartError, Knob, Toggle

Doc = dict[str, object]


def configmap(name: str, data: dict[str, str], namespace: str = "gpufrag-system") -> Doc:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace}, "data": data}


def deployment(name: str = "web", image: str = "registry.k8s.io/pause:3.10") -> Doc:
    container = {"name": "main", "image": image, "args": ["serve", "--port=8000"],
                 "resources": {"requests": {"cpu": "100m"}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "gpufrag-system"},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [container]}}}}


def build(docs: list[Doc], knobs: tuple[Knob, ...] = (), toggles: tuple[Toggle, ...] = (),
          components: tuple[chart.Component, ...] = ()) -> dict[str, str]:
    return chart.build_chart(docs, "0.1.0", knobs=knobs, toggles=toggles,
                             components=components, lines=(), hooks=False)


def cluster_role(name: str) -> Doc:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": []}


def binding(kind: str, name: str, role_kind: str, role: str, namespace: str | None = None
            ) -> Doc:
    meta: dict[str, str] = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "gpufrag-agent",
                          "namespace": "gpufrag-system"}]}


CONFIG = "policy: fgd\nweight: 200\n"


def test_a_knob_inside_an_embedded_file_reads_the_value_and_defaults_to_the_base() -> None:
    knob = Knob("extender.weight", "ConfigMap", "cfg", "data/config.yaml", "w",
                pattern=r"weight: (\d+)")
    files = build([configmap("cfg", {"config.yaml": CONFIG})], (knob,))
    template = files["templates/configmap-cfg.yaml"]
    assert "  config.yaml: |\n    policy: fgd\n    weight: {{ .Values.extender.weight }}\n" \
        in template
    assert yaml.safe_load(files["values.yaml"])["extender"]["weight"] == 200
    schema = json.loads(files["values.schema.json"])
    # Bounded as kube-scheduler validates an extender's weight (positive).
    assert schema["properties"]["extender"]["properties"]["weight"] == {
        "type": "integer", "minimum": 1, "maximum": 100_000}
    assert schema["properties"]["extender"]["additionalProperties"] is False


def test_whole_fields_keep_their_type() -> None:
    knobs = (Knob("web.replicas", "Deployment", "web", "spec/replicas", "r"),
             Knob("web.resources", "Deployment", "web",
                  "spec/template/spec/containers[name=main]/resources", "res"),
             Knob("web.port", "Deployment", "web",
                  "spec/template/spec/containers[name=main]/args", "p", pattern=r"^--port=(\d+)$"))
    template = build([deployment()], knobs)["templates/deployment-web.yaml"]
    assert "  replicas: {{ .Values.web.replicas }}\n" in template
    assert "\n        resources: {{- toYaml .Values.web.resources | nindent 10 }}\n" in template
    assert '\n        - {{ print "--port=" .Values.web.port | quote }}\n' in template
    assert ('image: {{ include "gpufrag.image" (dict "image" .Values.images.pause "registry" '
            '.Values.global.imageRegistry) | quote }}') in template
    assert "namespace: {{ include \"gpufrag.namespace\" . | quote }}" in template


def test_namespace_inside_a_string_follows_the_value_and_look_alikes_do_not() -> None:
    files = build([configmap("cfg", {"a": "ns: gpufrag-system\nother: gpufrag-system-x\n"})])
    assert ('ns: {{ include "gpufrag.namespace" . }}\n    other: gpufrag-system-x\n'
            in files["templates/configmap-cfg.yaml"])


def test_a_literal_template_in_the_base_is_escaped() -> None:
    files = build([configmap("rules", {"one": "{{ $labels.pod }} is down",
                                       "many": "summary: {{ $value }}\nok: 1\n"})])
    template = files["templates/configmap-rules.yaml"]
    assert '{{ print "{{ $labels.pod }} is down" | quote }}' in template
    assert 'summary: {{ "{{" }} $value }}\n' in template


def test_a_knob_the_base_no_longer_has_fails_naming_it() -> None:
    knob = Knob("extender.weight", "ConfigMap", "cfg", "data/config.yaml", "w",
                pattern=r"weight: (\d+)")
    with pytest.raises(ChartError, match=r"knob extender\.weight .* matches 0 times"):
        build([configmap("cfg", {"config.yaml": "policy: fgd\n"})], (knob,))
    with pytest.raises(ChartError, match=r"knob extender\.weight: ConfigMap/cfg is not in"):
        build([configmap("other", {})], (knob,))


def test_a_toggle_wraps_the_objects_it_names() -> None:
    toggle = Toggle("example.enabled", "web", "the example")
    files = build([deployment(), configmap("cfg", {})], toggles=(toggle,))
    assert "{{- if .Values.example.enabled }}\n" in files["templates/deployment-web.yaml"]
    assert "{{- if" not in files["templates/configmap-cfg.yaml"]
    with pytest.raises(ChartError, match="no object named nothing"):
        build([deployment()], toggles=(Toggle("x.enabled", "nothing", "?"),))


def test_a_toggle_off_by_default_leaves_its_objects_out_until_asked() -> None:
    toggle = Toggle("example.enabled", "web", "the example", default=False)
    files = build([deployment()], toggles=(toggle,))
    assert "{{- if .Values.example.enabled }}\n" in files["templates/deployment-web.yaml"]
    assert yaml.safe_load(files["values.yaml"])["example"] == {"enabled": False}
    # The shipped example is one: a demo nobody asked for is not installed.
    (example,) = [t for t in chart.TOGGLES if t.value == "servingExample.enabled"]
    assert example.default is False and example.name_prefix == "resnet-serving"


def test_the_objects_go_to_the_release_namespace_and_no_namespace_is_made_unasked() -> None:
    """helm install -n NS --create-namespace makes NS before the chart's objects: by default the
    chart takes it and creates no Namespace; the one it creates on request is another, named."""
    namespace: Doc = {"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": "gpufrag-system"}}
    files = build([namespace, configmap("cfg", {})])
    assert yaml.safe_load(files["values.yaml"])["namespace"] == {"name": "", "create": False}
    assert ('{{- .Values.namespace.name | default .Release.Namespace -}}'
            in files["templates/_helpers.tpl"])
    template = files["templates/namespace-gpufrag-system.yaml"]
    assert template.split("\n")[1:3] == [
        "{{- if .Values.namespace.create }}",
        '{{- if eq (include "gpufrag.namespace" .) .Release.Namespace }}']
    assert "helm.sh/resource-policy: keep" in template
    schema = json.loads(files["values.schema.json"])["properties"]["namespace"]
    assert schema["allOf"] == [{
        "if": {"properties": {"create": {"const": True}}, "required": ["create"]},
        "then": {"properties": {"name": {"minLength": 1}}, "required": ["name"]}}]
    assert schema["properties"]["name"]["maxLength"] == 63


def test_two_repositories_with_one_values_key_are_refused() -> None:
    with pytest.raises(ChartError, match=r"share the values key images\.pause"):
        build([deployment("a", "registry.k8s.io/pause:3.10"),
               deployment("b", "docker.io/library/pause:3.10")])


def test_a_changed_base_leaves_the_written_chart_stale(tmp_path: Path) -> None:
    docs = [deployment(), configmap("cfg", {"config.yaml": CONFIG})]
    chart.write_chart(build(docs), tmp_path)
    assert chart.stale_files(build(docs), tmp_path) == []

    changed = copy.deepcopy(docs)
    changed[1]["data"] = {"config.yaml": "policy: bestfit\n"}
    assert chart.stale_files(build(changed), tmp_path) == ["templates/configmap-cfg.yaml"]
    assert chart.stale_files(build(docs[:1]), tmp_path) == ["templates/configmap-cfg.yaml"]
    assert chart.stale_files(build([*docs, configmap("new", {})]), tmp_path) == [
        "templates/configmap-new.yaml"]


def test_the_shipped_knobs_are_distinct_and_grouped() -> None:
    names = [k.value for k in chart.KNOBS if not k.again] + [t.value for t in chart.TOGGLES]
    assert len(names) == len(set(names))
    # A value read again is declared by an earlier knob.
    for i, knob in enumerate(chart.KNOBS):
        if knob.again:
            assert knob.value in {k.value for k in chart.KNOBS[:i] if not k.again}
    assert {n.split(".")[0] for n in names} <= set(chart.GROUP_HELP)


def test_names_one_per_cluster_are_release_scoped_and_so_are_their_references() -> None:
    files = build([
        cluster_role("gpufrag-agent"),
        binding("ClusterRoleBinding", "gpufrag-agent", "ClusterRole", "gpufrag-agent"),
        binding("ClusterRoleBinding", "gpufrag-as-scheduler", "ClusterRole",
                "system:kube-scheduler"),
        binding("RoleBinding", "gpufrag-auth-reader", "Role", "auth-reader", "kube-system"),
        binding("RoleBinding", "gpufrag-view", "ClusterRole", "gpufrag-agent", "gpufrag-system"),
    ])
    scoped = 'name: {{ print (include "gpufrag.fullname" .) "-agent" | quote }}'
    assert scoped in files["templates/clusterrole-gpufrag-agent.yaml"]
    # The binding's own name and its reference to the ClusterRole above.
    assert files["templates/clusterrolebinding-gpufrag-agent.yaml"].count(scoped) == 2
    upstream = files["templates/clusterrolebinding-gpufrag-as-scheduler.yaml"]
    assert '"-as-scheduler"' in upstream and "  name: system:kube-scheduler\n" in upstream
    # In kube-system: one per cluster too; its Role there is not the chart's.
    in_kube_system = files["templates/rolebinding-gpufrag-auth-reader.yaml"]
    assert '"-auth-reader"' in in_kube_system and "  name: auth-reader\n" in in_kube_system
    # In the release's namespace: the base's name, but the ClusterRole it binds is scoped.
    view = files["templates/rolebinding-gpufrag-view.yaml"]
    assert "  name: gpufrag-view\n" in view and scoped in view


def test_a_cluster_wide_name_outside_the_prefix_is_refused() -> None:
    with pytest.raises(ChartError, match=r"ClusterRole/viewer: .* must start with 'gpufrag'"):
        build([cluster_role("viewer")])


def test_every_object_gets_the_standard_labels_beside_its_own() -> None:
    files = build([configmap("cfg", {}), cluster_role("gpufrag-agent")])
    for name in ("templates/configmap-cfg.yaml", "templates/clusterrole-gpufrag-agent.yaml"):
        assert ('  labels: {{- include "gpufrag.labels" . | nindent 4 }}\n'
                "    app.kubernetes.io/name: gpufrag\n") in files[name]
    helpers = files["templates/_helpers.tpl"]
    assert all(f"{label}:" in helpers for label in chart.STANDARD_LABELS)


def test_pod_fields_the_base_leaves_out_are_written_only_when_set() -> None:
    web = deployment()
    web["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "web"}  # type: ignore[index]
    component = chart.Component("web", "Deployment", "web", "spec/template/spec")
    files = build([web], components=(component,))
    template = files["templates/deployment-web.yaml"]
    assert "      nodeSelector: {{- toYaml .Values.web.nodeSelector | nindent 8 }}\n" in template
    assert ("      {{- with .Values.web.affinity }}\n"
            "      affinity: {{- toYaml . | nindent 8 }}\n      {{- end }}\n") in template
    assert ("      {{- with .Values.web.priorityClassName }}\n"
            "      priorityClassName: {{ . | quote }}\n      {{- end }}\n") in template
    assert ("        {{- with .Values.global.imagePullPolicy }}\n"
            "        imagePullPolicy: {{ . | quote }}\n") in template
    values = yaml.safe_load(files["values.yaml"])
    assert values["web"] == {"nodeSelector": {"pool": "web"}, "tolerations": [], "affinity": {},
                             "priorityClassName": ""}
    assert values["global"] == {"imageRegistry": "", "imagePullPolicy": "",
                                "imagePullSecrets": []}


def test_the_shipped_components_are_the_charts_workloads() -> None:
    assert {c.value for c in chart.COMPONENTS} <= set(chart.GROUP_HELP)
    assert len({c.value for c in chart.COMPONENTS}) == len(chart.COMPONENTS)


def test_a_value_read_in_two_places_must_have_one_default() -> None:
    knobs = (Knob("app.name", "ConfigMap", "a", "data/name", "n"),
             Knob("app.name", "ConfigMap", "b", "data/name", "", again=True))
    files = build([configmap("a", {"name": "x"}), configmap("b", {"name": "x"})], knobs)
    assert "name: {{ .Values.app.name | quote }}" in files["templates/configmap-b.yaml"]
    with pytest.raises(ChartError, match=r"knob app\.name \(ConfigMap/b data/name\): the base "
                                         r"has 'y' there"):
        build([configmap("a", {"name": "x"}), configmap("b", {"name": "y"})], knobs)


def podmonitor(name: str, server_name: str = "") -> Doc:
    endpoint: dict[str, object] = {"port": "https", "scheme": "https"}
    if server_name:
        endpoint["tlsConfig"] = {"serverName": server_name}
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": {"name": name, "namespace": "gpufrag-system"},
            "spec": {"podMetricsEndpoints": [endpoint]}}


MONITORING = chart.Part("monitoring.enabled", "components/mon", "m", labels="monitoring.labels")
WEBHOOK = chart.Part("rightsizing.enabled", "components/hook", "w")


def test_a_part_that_joins_two_parts_renders_only_where_both_are_on() -> None:
    joint = chart.Part("monitoring.enabled", "components/joint", "", labels="monitoring.labels",
                       also=("rightsizing.enabled",))
    files = chart.build_chart([], "0.1.0", knobs=(), toggles=(), components=(), lines=(),
                              hooks=False, parts={MONITORING: [podmonitor("a")],
                                                  WEBHOOK: [deployment("hook")],
                                                  joint: [podmonitor("hook")]})
    joined = files["templates/podmonitor-hook.yaml"]
    assert joined.count("{{- if") == 1
    assert "{{- if and .Values.monitoring.enabled .Values.rightsizing.enabled }}\n" in joined
    assert "{{- with .Values.monitoring.labels }}" in joined
    assert "{{- if .Values.monitoring.enabled }}\n" in files["templates/podmonitor-a.yaml"]
    # It declares no value of its own: each stays one value, off by default.
    values = yaml.safe_load(files["values.yaml"])
    assert values["monitoring"] == {"enabled": False, "labels": {}}
    assert values["rightsizing"] == {"enabled": False}
    with pytest.raises(ChartError, match=r"part components/joint: needs rightsizing\.enabled"):
        chart.build_chart([], "0.1.0", knobs=(), toggles=(), components=(), lines=(),
                          hooks=False, parts={MONITORING: [], joint: []})


def test_the_namespace_in_a_services_dns_name_follows_the_value() -> None:
    files = build([podmonitor("hook", "gpufrag-admission.gpufrag-system.svc"),
                   configmap("cfg", {"a": "x.gpufrag-system.example", "b": "gpufrag-system.svc"})])
    assert ('serverName: {{ print "gpufrag-admission." (include "gpufrag.namespace" .) ".svc" '
            '| quote }}') in files["templates/podmonitor-hook.yaml"]
    # Not a Service's name: another domain, or no Service before it.
    template = files["templates/configmap-cfg.yaml"]
    assert "a: x.gpufrag-system.example\n" in template
    assert 'b: {{ print (include "gpufrag.namespace" .) ".svc" | quote }}' in template
