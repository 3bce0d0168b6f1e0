"""Bad input answers 400 (413 for size) with ``{"Error": ...}`` in the verb's shape — never a
500 or a traceback — and a fuzz run of generated bodies through every verb holds to that."""

from __future__ import annotations

import io
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.extender.runtime import Runtime
from tests.scheduler.extender.helpers import json_paths, make_config, post, serve
from tests.scheduler.extender.test_contract import FILTER_KEYS, NODES, PENDING, pod_json

NAMES = ["gpu-a", "gpu-b", "cpu-1"]


@pytest.fixture
def runtime() -> Runtime:
    """A fresh extender per test: a fuzzed bind places pods, and another test must not find
    them placed."""
    return serve(NODES, [PENDING], config=make_config(server={"max_body_bytes": 64 * 1024}))


BAD_ARGS: list[tuple[str, Any, str]] = [
    ("empty body", b"", "empty request body"),
    ("truncated JSON", b'{"Pod": {', "not valid JSON"),
    ("not an object", b"[1, 2]", "must be a JSON object, got list"),
    ("no Pod", {"NodeNames": NAMES}, "Pod is missing"),
    ("Pod is a string", {"Pod": "infer", "NodeNames": NAMES}, "Pod must be a v1.Pod object"),
    ("NodeNames is a string", {"Pod": PENDING, "NodeNames": "gpu-a"},
     "NodeNames must be a list of strings"),
    ("NodeNames holds a number", {"Pod": PENDING, "NodeNames": ["gpu-a", 7]}, "NodeNames[1]"),
    ("neither Nodes nor NodeNames", {"Pod": PENDING}, "one of NodeNames"),
    ("Nodes is a list", {"Pod": PENDING, "Nodes": []}, "Nodes must be a v1.NodeList"),
    ("Nodes item without a name", {"Pod": PENDING, "Nodes": {"items": [{"metadata": {}}]}},
     "Nodes.items[0].metadata.name"),
    ("Pod without a name", {"Pod": {"metadata": {}}, "NodeNames": NAMES}, "metadata.name"),
    ("unreadable quantity",
     {"Pod": {**PENDING, "spec": {"containers": [
         {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "lots"}}}]}},
      "NodeNames": NAMES},
     "spec.containers[0].resources.requests.nvidia.com/gpu"),
    ("half a GPU as whole GPUs", {"Pod": pod_json("p", gpus="0.5"), "NodeNames": NAMES},
     "not a whole number of GPUs"),
]


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize(("case", "body", "message"), BAD_ARGS, ids=[c[0] for c in BAD_ARGS])
def test_bad_extender_args_answer_400(runtime: Runtime, verb: str, case: str, body: Any,
                                      message: str) -> None:
    status, reply = post(runtime.app.test_client(), f"/{verb}", body)
    assert status == 400
    assert message in reply["Error"]
    if verb == "filter":
        assert set(reply) == FILTER_KEYS and reply["NodeNames"] is None
    else:
        assert set(reply) == {"Error"}


@pytest.mark.parametrize(("body", "message"), [
    (b"null", "must be a JSON object"),
    ({"PodNamespace": "serving", "Node": "gpu-a"}, "PodName must be a non-empty string"),
    ({"PodName": "p", "PodNamespace": 3, "Node": "gpu-a"}, "PodNamespace"),
    ({"PodName": "p", "PodNamespace": "serving", "PodUID": 5, "Node": "gpu-a"}, "PodUID"),
    ({"PodName": "p", "PodNamespace": "serving"}, "Node must be a non-empty string"),
])
def test_bad_binding_args_answer_400(runtime: Runtime, body: Any, message: str) -> None:
    status, reply = post(runtime.app.test_client(), "/bind", body)
    assert status == 400
    assert set(reply) == {"Error"} and message in reply["Error"]


# Bodies no JSON encoder should write but some can be talked into (allow_nan, bignums), and
# nesting past orjson's limits: the message says what the rule is and where it was broken.
_POD = orjson.dumps(PENDING).decode()
NOT_JSON: list[tuple[str, str, str]] = [
    ("NaN", '{"Pod": ' + _POD + ', "NodeNames": ["gpu-a"], "X": NaN}',
     "NaN is not a JSON number (JSON has no NaN or infinities)"),
    ("Infinity", '{"Pod": ' + _POD + ', "NodeNames": [Infinity]}',
     "Infinity is not a JSON number"),
    ("-Infinity", '{"Pod": {"spec": {"priority": -Infinity}}, "NodeNames": []}',
     "-Infinity is not a JSON number"),
    ("1e400", '{"Pod": ' + _POD + ', "NodeNames": ["gpu-a"], "X": 1e400}',
     "a number beyond the range of a double (such as 1e400) cannot be read"),
    ("a 400-digit integer", '{"Pod": ' + _POD + ', "X": ' + "9" * 400 + "}",
     "a number beyond the range of a double"),
    ("nested 2,000 deep", '{"Pod": ' + _POD + ', "X": ' + "[" * 2000 + "]" * 2000 + "}",
     "JSON nested more than 1024 levels deep is refused"),
]


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
@pytest.mark.parametrize(("case", "body", "message"), NOT_JSON, ids=[c[0] for c in NOT_JSON])
def test_bodies_that_are_not_json_answer_400(runtime: Runtime, verb: str, case: str, body: str,
                                             message: str) -> None:
    status, reply = post(runtime.app.test_client(), f"/{verb}", body.encode())
    assert status == 400
    assert reply["Error"].startswith("request body is not valid JSON: ")
    assert " at line 1 column " in reply["Error"] and message in reply["Error"]


@pytest.mark.parametrize("depth", [200, 300, 1000])
def test_a_node_object_too_deep_to_send_back_answers_400(runtime: Runtime, depth: int) -> None:
    # Nodes mode answers with the very Node objects sent; orjson reads 1,024 levels of nesting
    # but writes only 254.
    deep = b"[" * depth + b"]" * depth
    items = b",".join(orjson.dumps(node)[:-1] + b',"x":' + deep + b"}" for node in NODES)
    body = b'{"Pod":' + orjson.dumps(PENDING) + b',"Nodes":{"items":[' + items + b"]}}"
    status, reply = post(runtime.app.test_client(), "/filter", body)
    if depth < 254:
        assert status == 200 and reply["Error"] == ""
    else:
        assert status == 400
        assert reply["Error"].startswith("Nodes.items[0] cannot be sent back in Nodes.items: ")
        assert "nested more than 254 levels deep" in reply["Error"]


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
def test_oversized_body_answers_413(runtime: Runtime, verb: str) -> None:
    body = orjson.dumps({"Pod": PENDING, "NodeNames": [f"node-{i:06d}" for i in range(10_000)]})
    status, reply = post(runtime.app.test_client(), f"/{verb}", body)
    assert status == 413
    assert "larger than the limit of 65536 bytes (server.max_body_bytes)" in reply["Error"]


def _chunked_post(runtime: Runtime, path: str, body: bytes) -> tuple[int, Any]:
    """A POST whose length is not announced (as a chunked one reaches the app from the server)."""
    response = runtime.app.test_client().post(
        path, input_stream=io.BytesIO(body), content_type="application/json",
        headers={"Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True, "CONTENT_LENGTH": ""})
    return response.status_code, orjson.loads(response.data)


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
def test_a_chunked_body_over_the_limit_answers_413_too(runtime: Runtime, verb: str) -> None:
    limit = 64 * 1024
    body = orjson.dumps({"Pod": PENDING, "NodeNames": ["gpu-a"]})
    exactly = body[:-1] + b" " * (limit - len(body)) + b"}"
    assert len(exactly) == limit
    status, reply = _chunked_post(runtime, f"/{verb}", exactly)
    assert status in (200, 400) and "larger than the limit" not in str(reply)
    status, reply = _chunked_post(runtime, f"/{verb}", exactly + b" ")
    assert status == 413
    assert reply["Error"] == (f"request body is larger than the limit of {limit} bytes "
                              "(server.max_body_bytes)")


def test_wrong_method_and_unknown_path_answer_json(runtime: Runtime) -> None:
    client = runtime.app.test_client()
    for response in (client.get("/filter"), client.post("/nope", data=b"{}")):
        assert response.status_code in (404, 405)
        assert "Error" in orjson.loads(response.data)


def test_bind_refusals_come_back_in_error(runtime: Runtime) -> None:
    client = runtime.app.test_client()
    cases = [
        ({"PodName": "ghost", "PodNamespace": "serving", "Node": "gpu-a"}, "not found"),
        ({"PodName": "infer-7d9f-abcde", "PodNamespace": "serving", "Node": "gpu-zz"},
         "node gpu-zz is not known"),
        ({"PodName": "infer-7d9f-abcde", "PodNamespace": "serving", "Node": "cpu-1"},
         "does not fit node cpu-1 now: needs 1 GPUs, node has 0"),
    ]
    for body, message in cases:
        status, reply = post(client, "/bind", body)
        assert status == 200
        assert message in reply["Error"]


# ------------------------------------------------------------------------------------- fuzz

# Cheap odd values stand in for "any other JSON" almost everywhere: drawing deep recursive JSON
# costs more than the request itself, and a type the parser does not expect is what matters.
ODD = st.sampled_from([None, True, 0, -1, 2**40, 1.5, "", "x", [], [1], {}, {"a": 1}])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6)
QUANTITY = st.sampled_from(["1", "2", "0", "500m", "1.5", "-1", "lots", "1e3", "2Gi", "0.5",
                            "16", "100", "999", "1000", "2500", "1Ki", "", "1e400", "NaN", "+3",
                            3, 2500, -2, 0.25, float("nan"), None, [], {}])
RESOURCE = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "gpufrag.io/gpu-milli", "x"])
REQUESTS = st.dictionaries(RESOURCE, QUANTITY, max_size=3) | ODD
CONTAINER = st.fixed_dictionaries({"name": st.just("c")}, optional={
    "resources": st.fixed_dictionaries({}, optional={"requests": REQUESTS, "limits": REQUESTS})
    | ODD}) | ODD
META = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["p", "infer-7d9f-abcde", ""]) | ODD,
    "namespace": st.sampled_from(["serving", ""]) | ODD,
    "labels": st.dictionaries(st.sampled_from(["gpufrag.io/model", "gpufrag.io/model-version"]),
                              st.sampled_from(["m", "v1", ""]), max_size=2) | ODD,
    "annotations": st.dictionaries(st.sampled_from(["gpufrag.io/gpu-spec", "a"]),
                                   st.sampled_from(["A100|T4", "", "|", "x"]), max_size=2) | ODD,
    "ownerReferences": st.lists(st.fixed_dictionaries({"uid": st.sampled_from(["u", ""]),
                                                       "controller": st.booleans()}),
                                max_size=2) | ODD,
}) | ODD
POD = st.fixed_dictionaries({}, optional={
    "metadata": META,
    "spec": st.fixed_dictionaries({}, optional={
        "containers": st.lists(CONTAINER, max_size=3) | ODD,
        "initContainers": st.lists(CONTAINER, max_size=2) | ODD,
        "overhead": REQUESTS}) | ODD,
}) | JSON
NODE_NAMES = st.lists(st.sampled_from([*NAMES, "gpu-new", "", 3, None]), max_size=5) | ODD
NODES_ARG = st.fixed_dictionaries({}, optional={
    "items": st.lists(st.sampled_from([*NODES, {}, {"metadata": {"name": 3}}, "n"]),
                      max_size=4) | ODD}) | ODD
ARGS = st.fixed_dictionaries({}, optional={"Pod": POD, "NodeNames": NODE_NAMES,
                                           "Nodes": NODES_ARG}) | JSON
BINDING = st.fixed_dictionaries({}, optional={
    "PodName": st.sampled_from(["infer-7d9f-abcde", "ghost", ""]) | ODD,
    "PodNamespace": st.sampled_from(["serving", ""]) | ODD,
    "PodUID": st.sampled_from(["uid-infer-7d9f-abcde", "other"]) | ODD,
    "Node": st.sampled_from([*NAMES, "gpu-new"]) | ODD}) | JSON
RAW = st.binary(max_size=64) | st.text(max_size=40).map(str.encode)


def _check(verb: str, status: int, reply: Any, body: Any) -> None:
    assert status in (200, 400), (status, reply)
    if verb == "filter":
        assert set(reply) == FILTER_KEYS
        if status == 200:
            asked = (body.get("NodeNames") if body.get("NodeNames") is not None else
                     [n["metadata"]["name"] for n in body["Nodes"].get("items") or []])
            returned = reply["NodeNames"] if reply["NodeNames"] is not None else [
                n["metadata"]["name"] for n in reply["Nodes"]["items"]]
            assert set(returned) <= set(asked)
            assert set(reply["FailedNodes"]) | set(reply["FailedAndUnresolvableNodes"]) <= set(
                asked)
    elif verb == "prioritize" and status == 200:
        assert all(0 <= h["Score"] <= 10 for h in reply)
    else:
        assert isinstance(reply, dict) and set(reply) == {"Error"}


def _fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


# About 2,500 requests in all: each generated body goes through every verb it is meant for.
@_fuzz(500)
@given(body=ARGS)
def test_fuzz_filter_and_prioritize(runtime: Runtime, body: Any) -> None:
    client = runtime.app.test_client()
    data = orjson.dumps(body)
    for verb in ("filter", "prioritize"):
        status, reply = post(client, f"/{verb}", data)
        _check(verb, status, reply, body)


@_fuzz(400)
@given(body=BINDING)
def test_fuzz_bind(runtime: Runtime, body: Any) -> None:
    status, reply = post(runtime.app.test_client(), "/bind", orjson.dumps(body))
    _check("bind", status, reply, body)


@_fuzz(300)
@given(raw=RAW)
def test_fuzz_raw_bytes(runtime: Runtime, raw: bytes) -> None:
    client = runtime.app.test_client()
    for verb in ("filter", "prioritize", "bind"):
        response = client.post(f"/{verb}", data=raw)
        assert response.status_code in (200, 400), response.data
        reply = orjson.loads(response.data)
        if response.status_code == 400:
            assert reply["Error"]


# A valid body with one value, anywhere in it, replaced by something it must not hold: numbers
# JSON has not got, numbers no double holds, nesting past orjson's limits, and the wrong type.
# Each request must be answered 200 or 400 in its verb's shape, never 500.
ODD_RAW = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"1e-400", b"9" * 400,
           b"18446744073709551616", b"-9223372036854775809", b"[" * 300 + b"]" * 300,
           b'{"a":' * 300 + b"1" + b"}" * 300, b"[" * 1100 + b"]" * 1100, b"null", b"true",
           b"0", b"-1", b"1.5", b'""', b'"x"', b'"1e400"', b'"NaN"', b'"-5"', b"[]", b"{}",
           b'[1, "x", null]', b'{"a": 1}', b'"' + b"9" * 40 + b'"']
MUTATION_BASES: list[tuple[tuple[str, ...], Any]] = [
    (("filter", "prioritize"), {"Pod": PENDING, "NodeNames": NAMES}),
    (("filter", "prioritize"), {"Pod": PENDING, "Nodes": {"items": NODES}}),
    (("bind",), {"PodName": "infer-7d9f-abcde", "PodNamespace": "serving",
                 "PodUID": "uid-infer-7d9f-abcde", "Node": "gpu-a"}),
]


def _encode(value: Any, where: tuple[Any, ...], odd: bytes, here: tuple[Any, ...] = ()) -> bytes:
    """``value`` as JSON, with the raw bytes ``odd`` in place of the value at ``where``."""
    if here == where:
        return odd
    if isinstance(value, dict):
        return b"{" + b",".join(orjson.dumps(k) + b":" + _encode(v, where, odd, (*here, k))
                                for k, v in value.items()) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(_encode(v, where, odd, (*here, i))
                                for i, v in enumerate(value)) + b"]"
    return orjson.dumps(value)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[tuple[str, ...], bytes]:
    verbs, base = draw(st.sampled_from(MUTATION_BASES))
    where = draw(st.sampled_from(json_paths(base)))
    return verbs, _encode(base, where, draw(st.sampled_from(ODD_RAW)))


@_fuzz(400)
@given(case=mutated())
def test_fuzz_one_odd_value_anywhere(runtime: Runtime, case: tuple[tuple[str, ...], bytes]) -> None:
    verbs, body = case
    client = runtime.app.test_client()
    for verb in verbs:
        status, reply = post(client, f"/{verb}", body)
        assert status in (200, 400), (verb, status, reply, body[:300])
        if verb == "filter":
            assert set(reply) == FILTER_KEYS
        elif status == 400 or verb == "bind":
            assert isinstance(reply, dict) and set(reply) == {"Error"}
        if status == 400:
            assert reply["Error"]
