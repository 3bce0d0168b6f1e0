"""The NodeNames list paid once per set of names: a body in kube-scheduler's form (NodeNames
last) parses to what the whole body parses to, the list is kept by its set of names (any
order), and the rows of its names are kept too until a node that was unknown may have
arrived."""

from __future__ import annotations

import orjson
import pytest

from scheduler.extender.scoring import UNKNOWN
from scheduler.extender.wire import NameLists, WireError, parse_extender_args
from tests.builders import node, pod
from tests.scheduler.extender.helpers import k8s_pod, post, serve

POD = k8s_pod(pod("p"))


def go_body(names: list[str], pod_obj: object = POD) -> bytes:
    """ExtenderArgs as kube-scheduler writes them (Go's field order, no spaces)."""
    return orjson.dumps({"Pod": pod_obj, "Nodes": None, "NodeNames": names})


def test_a_go_body_parses_as_the_whole_and_its_list_is_kept() -> None:
    lists = NameLists()
    body = go_body(["n0", "n1"])
    first = parse_extender_args(body, lists)
    assert (first.pod, first.names, first.nodes) == (POD, ["n0", "n1"], None)
    assert first.name_set == frozenset((b"n0", b"n1"))
    # kube-scheduler's parallel filter sends the same nodes in another order: the same list.
    again = parse_extender_args(go_body(["n1", "n0"], k8s_pod(pod("q"))), lists)
    assert again.names is first.names and again.name_set is first.name_set
    assert again.pod["metadata"]["name"] == "q"


@pytest.mark.parametrize("body", [
    b'{"NodeNames":["n0"],"Pod":{"metadata":{"name":"p"}}}',           # not last
    b'{"Pod":{"metadata":{"name":"p"}}, "NodeNames": ["n0"]}',          # spaces
    b'{"Pod":{"a":",\\"NodeNames\\":[1]}"},"NodeNames":["n0"]}',         # the key in a string
    b'{"Pod":{"metadata":{}},"NodeNames":["n0"],"NodeNames":["n1"]}',   # repeated key
    b'{"Pod":{},"NodeNames":["n0","n0"]}',                              # a name twice
    b'{"Pod":{},"NodeNames":["n\\u0030","n1"]}',                       # an escape
    b'{"Pod":{},"NodeNames":[]}',
])
def test_other_forms_parse_as_before(body: bytes) -> None:
    plain = parse_extender_args(body)
    kept = parse_extender_args(body, NameLists())
    assert (kept.pod, kept.names, kept.nodes) == (plain.pod, plain.names, plain.nodes)


@pytest.mark.parametrize(("body", "message"), [
    (b'{"Pod":null,"Nodes":null,"NodeNames":["n0"]}', "Pod is missing or null"),
    (b'{"Pod":[],"Nodes":null,"NodeNames":["n0"]}', "Pod must be a v1.Pod object, got list"),
    (b'{"Pod":{},"Nodes":null,"NodeNames":[1,]}', "not valid JSON"),
    (b'{"Pod":{},"Nodes":null,"NodeNames":["a",1,"b"]}', None),
])
def test_bad_bodies_in_the_go_form_are_refused_as_before(body: bytes,
                                                         message: str | None) -> None:
    if message is None:  # wrong entries are refused where the names are looked up
        assert parse_extender_args(body, NameLists()).names == ["a", 1, "b"]
        return
    with pytest.raises(WireError, match=message):
        parse_extender_args(body, NameLists())


def test_the_oldest_list_goes_first() -> None:
    lists = NameLists(size=2)
    for names in (["a"], ["b"], ["c"]):
        parse_extender_args(go_body(names), lists)
    assert lists.get(frozenset((b"a",))) is None
    assert lists.get(frozenset((b"c",))) == (frozenset((b"c",)), ["c"])


def test_rows_of_a_list_follow_a_node_that_arrives() -> None:
    runtime = serve([node("n0")], [POD])
    client = runtime.app.test_client()
    body = go_body(["n0", "n1"])
    _, reply = post(client, "/prioritize", body)
    assert reply == [{"Host": "n0", "Score": 10}, {"Host": "n1", "Score": 0}]
    extender = runtime.extender
    (rows, all_known, _), = extender.placement._rows_by_list.values()
    assert rows.tolist() == [0, UNKNOWN] and not all_known
    runtime.cache.state.add_node(node("n1"))  # as the watch would
    _, reply = post(client, "/prioritize", body)
    assert {h["Host"] for h in reply if h["Score"] > 0} == {"n0", "n1"}
