"""The kube-scheduler extender v1 wire types, as JSON.

The Go types (``k8s.io/kube-scheduler/extender/v1``) carry no JSON tags, so every key is the Go
field name in PascalCase:

- ExtenderArgs: ``{"Pod": v1.Pod, "Nodes": v1.NodeList | null, "NodeNames": [string] | null}``
  — ``NodeNames`` when the extender is configured ``nodeCacheCapable: true``, ``Nodes``
  otherwise.
- ExtenderFilterResult: ``{"Nodes", "NodeNames", "FailedNodes": {node: reason},
  "FailedAndUnresolvableNodes": {node: reason}, "Error": ""}``, answered in the form asked.
- HostPriorityList: ``[{"Host": name, "Score": 0..10}]``.
- ExtenderBindingArgs: ``{"PodName", "PodNamespace", "PodUID", "Node"}`` ->
  ExtenderBindingResult ``{"Error": ""}``.

Parsing checks types and says what is wrong (``WireError`` -> HTTP 400); it never interprets
the Pod — that is ``scheduler.kube.convert``'s job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from scheduler.core.state import IntArray
from scheduler.extender.scoring import MAX_PRIORITY, UNKNOWN, FilterVerdicts, Priorities

Obj = Mapping[str, Any]


class WireError(ValueError):
    """A request body that is not what the protocol says; the message names the field."""


NameSet = frozenset[bytes]


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: Obj
    names: list[str]
    nodes: list[Obj] | None  # the NodeList items in Nodes mode; None in NodeNames mode
    # The NodeNames as a set of their UTF-8 bytes, when they came last in the body as
    # kube-scheduler writes them (None otherwise): the key under which the list and its rows
    # are kept (see NameLists). The same object for every request with the same set.
    name_set: NameSet | None = None


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


# What orjson's terse messages mean for the inputs a fuzzer (or a Go client with a bug) sends.
_NOT_JSON_NUMBERS = ("-Infinity", "NaN", "Infinity")
_JSON_HINTS = {
    "number is infinity when parsed as double":
        "a number beyond the range of a double (such as 1e400) cannot be read",
    "depth limit exceeded": "JSON nested more than 1024 levels deep is refused",
}
# orjson refuses to encode objects nested deeper than this; Nodes mode sends Nodes.items back.
MAX_ECHO_DEPTH = 254


def json_error(e: orjson.JSONDecodeError) -> str:
    """Why a body is not JSON, with where (line, column) and, for the usual suspects (NaN and
    Infinity, which Go's and Python's encoders can be talked into writing, numbers too large
    for a double, deep nesting), what the rule is: orjson's own words do not say."""
    doc = e.doc if isinstance(e.doc, str) else ""
    hint = _JSON_HINTS.get(e.msg, "")
    for token in _NOT_JSON_NUMBERS:
        # orjson stops at the "I" of "-Infinity", after the sign.
        if doc.startswith(token, e.pos) or doc.startswith(token, max(e.pos - 1, 0)):
            hint = f"{token} is not a JSON number (JSON has no NaN or infinities)"
            break
    where = f"line {e.lineno} column {e.colno}"
    return f"{e.msg} at {where}" + (f": {hint}" if hint else "")


def _object(body: bytes) -> dict[str, Any]:
    if not body:
        raise WireError("empty request body; expected a JSON object")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise WireError(f"request body is not valid JSON: {json_error(e)}") from None
    if not isinstance(value, dict):
        raise WireError(f"request body must be a JSON object, got {type(value).__name__}")
    return value


def _node_items(nodes: Any) -> tuple[list[Obj], list[str]]:
    if not isinstance(nodes, dict):
        raise WireError(f"Nodes must be a v1.NodeList object, got {type(nodes).__name__}")
    items = nodes.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise WireError(f"Nodes.items must be a list, got {type(items).__name__}")
    names = []
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise WireError(f"Nodes.items[{i}].metadata.name must be a non-empty string")
        names.append(name)
    return items, names


# kube-scheduler (Go's encoding/json, fields in struct order, no spaces) ends its
# ExtenderArgs with the node names: {"Pod":{...},"Nodes":null,"NodeNames":["n1",...]}.
_NAMES_TAIL = b',"NodeNames":['
# Node-name sets kept: one per set kube-scheduler sends (the feasible nodes after its own
# filters), at most this many.
MAX_NAME_LISTS = 8


class NameLists:
    """Parsed NodeNames lists by the set of names they hold, the most recent
    :data:`MAX_NAME_LISTS`.

    Every filter and prioritize call carries the feasible nodes, and at 5,000 nodes parsing
    them and looking each name up was most of a request's cost. kube-scheduler filters nodes
    in parallel, so the same nodes come in a different order from one cycle to the next: the
    key is the set of the names' raw bytes (split from the body at C speed), which every
    ordering of the same nodes shares, so the parse (and, in the extender, the name lookup) is
    paid once per set. A list handed out is in the order of the first request with its set:
    the verbs answer about nodes by name, and kube-scheduler reads the answers by name, so
    the order does not matter. The lists are shared: callers must not change them."""

    def __init__(self, size: int = MAX_NAME_LISTS) -> None:
        self.size = size
        self._lists: dict[NameSet, tuple[NameSet, list[Any]]] = {}
        self._lock = threading.Lock()

    def get(self, names: NameSet) -> tuple[NameSet, list[Any]] | None:
        """The kept key object (the same one each time: dict lookups by it are O(1)) and
        list for this set, or None."""
        with self._lock:
            return self._lists.get(names)

    def put(self, names: NameSet, parsed: list[Any]) -> tuple[NameSet, list[Any]]:
        with self._lock:
            if names not in self._lists and len(self._lists) >= self.size:
                del self._lists[next(iter(self._lists))]  # the oldest
            kept = self._lists.setdefault(names, (names, parsed))
            return kept


def _split_names(body: bytes, lists: NameLists
                 ) -> tuple[dict[str, Any], list[Any], NameSet | None] | None:
    """The body as (the rest of its object, its NodeNames, their set) when NodeNames is its
    last member and its names need no unescaping, else None (the caller parses it whole).

    ``,"NodeNames":[`` cannot occur inside a JSON string (a quote there is escaped), so its
    last occurrence, with the body ending in ``]}``, splits the object in two: the members
    before it (closed with ``}``) and the array. Without a backslash in the array, and with
    no quote but the ones that delimit its strings, splitting at ``","`` gives each string's
    bytes exactly; the first time a set is seen the array is parsed by orjson all the same
    (which refuses whatever JSON would), so what is kept is what parsing the body would give."""
    at = body.rfind(_NAMES_TAIL)
    if at <= 0 or not body.endswith(b"]}"):
        return None
    inner = body[at + len(_NAMES_TAIL):-2]
    if b"\\" in inner:
        return None
    try:
        head = orjson.loads(body[:at] + b"}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(head, dict) or "NodeNames" in head:
        return None
    if not inner:
        return head, [], None
    if len(inner) < 2 or inner[0] != 0x22 or inner[-1] != 0x22:  # '"'
        return None
    parts = inner[1:-1].split(b'","')
    if inner.count(b'"') != 2 * len(parts):
        return None  # a quote inside a name: not a plain list of strings
    key = frozenset(parts)
    if len(key) != len(parts):
        return None  # a name listed twice: parsed as sent
    kept = lists.get(key)
    if kept is None:
        try:
            parsed = orjson.loads(body[at + len(_NAMES_TAIL) - 1:-1])
        except orjson.JSONDecodeError:
            return None
        if not isinstance(parsed, list) or len(parsed) != len(parts):
            return None
        kept = lists.put(key, parsed)
    return head, kept[1], kept[0]


def parse_extender_args(body: bytes, lists: NameLists | None = None) -> ExtenderArgs:
    """ExtenderArgs for filter and prioritize; with ``lists``, a NodeNames list seen before
    is not parsed again (see :class:`NameLists`)."""
    split = _split_names(body, lists) if lists is not None and body else None
    if split is not None:
        args, names, name_set = split
        pod = args.get("Pod")
        if pod is None:
            raise WireError("Pod is missing or null")
        if not isinstance(pod, dict):
            raise WireError(f"Pod must be a v1.Pod object, got {type(pod).__name__}")
        return ExtenderArgs(pod, names, None, name_set)
    args = _object(body)
    pod = args.get("Pod")
    if pod is None:
        raise WireError("Pod is missing or null")
    if not isinstance(pod, dict):
        raise WireError(f"Pod must be a v1.Pod object, got {type(pod).__name__}")
    given = args.get("NodeNames")
    if given is not None:
        if not isinstance(given, list):
            raise WireError(f"NodeNames must be a list of strings, got {type(given).__name__}")
        # The entries are checked where they are looked up (Extender._rows): a per-name check
        # here would cost as much as the lookup itself on every request.
        return ExtenderArgs(pod, given, None)
    nodes = args.get("Nodes")
    if nodes is None:
        raise WireError("one of NodeNames (nodeCacheCapable: true) or Nodes must be given")
    items, names = _node_items(nodes)
    return ExtenderArgs(pod, names, items)


def _string(args: Obj, key: str, *, required: bool) -> str:
    value = args.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise WireError(f"{key} must be a non-empty string, got {value!r}")
    return value


def parse_binding_args(body: bytes) -> BindingArgs:
    """ExtenderBindingArgs for bind."""
    args = _object(body)
    return BindingArgs(pod_name=_string(args, "PodName", required=True),
                       pod_namespace=_string(args, "PodNamespace", required=True),
                       pod_uid=_string(args, "PodUID", required=False),
                       node=_string(args, "Node", required=True))


@dataclass(frozen=True, slots=True)
class NodeVictims:
    """One node's candidate victims: pod keys (``namespace/name``, Victims mode; '' in
    MetaVictims mode), their UIDs, and kube-scheduler's PDB violation count for the set."""

    keys: list[str]
    uids: list[str]
    num_pdb_violations: int


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """ExtenderPreemptionArgs: ``{"Pod", "NodeNameToVictims": {node: {"Pods": [v1.Pod],
    "NumPDBViolations"}}}``, or ``"NodeNameToMetaVictims": {node: {"Pods": [{"UID"}],
    "NumPDBViolations"}}`` when ``nodeCacheCapable: true``."""

    pod: Obj
    victims: dict[str, NodeVictims]


def _victims(node: str, value: Any, meta: bool) -> NodeVictims:
    where = f"{'NodeNameToMetaVictims' if meta else 'NodeNameToVictims'}[{node!r}]"
    if value is None:
        return NodeVictims([], [], 0)
    if not isinstance(value, dict):
        raise WireError(f"{where} must be an object, got {type(value).__name__}")
    pods = value.get("Pods") or []
    pdb = value.get("NumPDBViolations") or 0
    if not isinstance(pods, list):
        raise WireError(f"{where}.Pods must be a list, got {type(pods).__name__}")
    if isinstance(pdb, bool) or not isinstance(pdb, int) or pdb < 0:
        raise WireError(f"{where}.NumPDBViolations must be a count, got {pdb!r}")
    keys, uids = [], []
    for i, item in enumerate(pods):
        if not isinstance(item, dict):
            raise WireError(f"{where}.Pods[{i}] must be an object")
        if meta:
            uid = item.get("UID")
            key = ""
        else:
            metadata = item.get("metadata")
            metadata = metadata if isinstance(metadata, dict) else {}
            uid, name = metadata.get("uid"), metadata.get("name")
            if not isinstance(name, str) or not name:
                raise WireError(f"{where}.Pods[{i}].metadata.name must be a non-empty string")
            key = f"{metadata.get('namespace') or ''}/{name}"
        if not isinstance(uid, str) or not uid:
            raise WireError(f"{where}.Pods[{i}] has no UID")
        keys.append(key)
        uids.append(uid)
    return NodeVictims(keys, uids, pdb)


def parse_preemption_args(body: bytes) -> PreemptionArgs:
    """ExtenderPreemptionArgs for preempt (k8s.io/kube-scheduler/extender/v1 types.go)."""
    args = _object(body)
    pod = args.get("Pod")
    if not isinstance(pod, dict):
        raise WireError("Pod is missing or not a v1.Pod object")
    meta = args.get("NodeNameToMetaVictims")
    plain = args.get("NodeNameToVictims")
    source, is_meta = (meta, True) if meta is not None else (plain, False)
    if source is None:
        source = {}
    if not isinstance(source, dict):
        raise WireError("NodeNameToVictims / NodeNameToMetaVictims must be an object")
    return PreemptionArgs(pod, {str(n): _victims(str(n), v, is_meta) for n, v in source.items()})


def preemption_result(victims: Mapping[str, tuple[list[str], int]]) -> dict[str, Any]:
    """ExtenderPreemptionResult: ``{"NodeNameToMetaVictims": {node: {"Pods": [{"UID"}],
    "NumPDBViolations"}}}`` (the only form kube-scheduler reads back)."""
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb}
        for node, (uids, pdb) in victims.items()}}


class NodeJson:
    """Each node's name, and its prioritize entry up to the score, pre-encoded as JSON.

    A row's name never changes, so these are encoded once per node; answers about thousands of
    nodes are then gathered with numpy and joined at C speed instead of built as Python dicts
    and encoded (at 5,000 nodes that was most of a request's time).
    """

    def __init__(self) -> None:
        self._names: list[bytes] = []
        self._hosts: list[bytes] = []
        self.name = np.zeros(0, object)
        self.host = np.zeros(0, object)

    def sync(self, names: Sequence[str]) -> None:
        """Encode the names of rows added since the last call (call with the state locked)."""
        if len(names) == len(self._names):
            return
        for text in names[len(self._names):]:
            encoded = orjson.dumps(text)
            self._names.append(encoded)
            self._hosts.append(b'{"Host":' + encoded + b',"Score":')
        name, host = np.empty(len(self._names), object), np.empty(len(self._hosts), object)
        name[:], host[:] = self._names, self._hosts
        self.name, self.host = name, host  # swapped whole: readers never see a half-built one

    @staticmethod
    def gather(table: npt.NDArray[np.object_], rows: IntArray, names: Sequence[Any],
               positions: Sequence[int] | IntArray,
               make: Callable[[Any], bytes]) -> list[bytes]:
        """``table[row]`` for each row; for ``UNKNOWN`` rows, ``make(names[position])``."""
        unknown = rows == UNKNOWN
        if not unknown.any():
            out: list[bytes] = table[rows].tolist()
            return out
        out = table[np.where(unknown, 0, rows)].tolist() if table.size else [b""] * rows.size
        for i in np.flatnonzero(unknown).tolist():
            out[i] = make(names[positions[i]])
        return out


def encode_reason(text: str) -> bytes:
    """A filter reason as the value half of a FailedNodes entry: ``:"<reason>",``."""
    return b":" + orjson.dumps(text) + b","


def _host(name: Any) -> bytes:
    return b'{"Host":' + orjson.dumps(name) + b',"Score":'


SCORE_TAIL = np.array([f"{score}}},".encode() for score in range(MAX_PRIORITY + 1)], object)


def _joined(heads: list[bytes], tails: list[bytes], open_: bytes, close: bytes) -> bytes:
    """``open_ + heads[0] + tails[0] + ... + close`` without the last tail's trailing comma.

    Interleaving by slice assignment and one join runs at C speed; concatenating each pair
    first costs a Python-level call per node."""
    if not heads:
        return open_ + close
    seq = [b""] * (2 * len(heads))
    seq[0::2] = heads
    seq[1::2] = tails
    return open_ + b"".join(seq)[:-1] + close


def filter_result(args: ExtenderArgs, outcome: FilterVerdicts, node_json: NodeJson) -> bytes:
    """ExtenderFilterResult (JSON) in the form the request used (NodeNames or Nodes)."""
    names = args.names
    positions = outcome.failed
    failed = unresolvable = b"{}"
    if positions.size:
        keys = node_json.gather(node_json.name, outcome.rows[positions], names, positions,
                                orjson.dumps)
        values = outcome.rendered
        if outcome.unresolvable.any():
            hard = outcome.unresolvable.tolist()
            soft = (~outcome.unresolvable).tolist()
            failed = _joined(list(compress(keys, soft)), list(compress(values, soft)),
                             b"{", b"}")
            unresolvable = _joined(list(compress(keys, hard)), list(compress(values, hard)),
                                   b"{", b"}")
        else:
            failed = _joined(keys, values, b"{", b"}")
    if args.nodes is None:
        nodes = b"null"
        kept = np.flatnonzero(outcome.passed)
        if kept.size == len(names):
            passed = orjson.dumps(names)
        else:
            passed = b"[" + b",".join(node_json.gather(
                node_json.name, outcome.rows[kept], names, kept, orjson.dumps)) + b"]"
    else:
        nodes = _echo_items(args.nodes, outcome.passed.tolist())
        passed = b"null"
    return (b'{"Nodes":' + nodes + b',"NodeNames":' + passed + b',"FailedNodes":' + failed
            + b',"FailedAndUnresolvableNodes":' + unresolvable + b',"Error":""}')


def _echo_items(items: list[Obj], passed: list[bool]) -> bytes:
    """The NodeList of the items that passed, the very objects sent (Nodes mode).

    orjson reads 1,024 levels of nesting but writes only 254, so a Node object nested between
    the two parses and then cannot be sent back; that is the request's fault (a 400 naming the
    item), found only on this error path so that the usual request pays nothing for it."""
    try:
        return orjson.dumps({"metadata": {}, "items": list(compress(items, passed))})
    except orjson.JSONEncodeError:
        for i, item in enumerate(items):
            if not passed[i]:
                continue
            try:
                orjson.dumps(item)
            except orjson.JSONEncodeError as e:
                raise WireError(f"Nodes.items[{i}] cannot be sent back in Nodes.items: {e} "
                                f"(objects nested more than {MAX_ECHO_DEPTH} levels deep are "
                                "refused)") from None
        raise


def filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": message}


def priorities(args: ExtenderArgs, result: Priorities, node_json: NodeJson) -> bytes:
    """HostPriorityList (JSON): ``[{"Host": name, "Score": 0..10}]`` in request order."""
    heads = node_json.gather(node_json.host, result.rows, args.names,
                             range(len(args.names)), _host)
    tails: list[bytes] = SCORE_TAIL[result.scores].tolist()
    return _joined(heads, tails, b"[", b"]")


__all__ = [
    "MAX_NAME_LISTS",
    "BindingArgs",
    "ExtenderArgs",
    "NameLists",
    "NameSet",
    "NodeJson",
    "NodeVictims",
    "PreemptionArgs",
    "WireError",
    "encode_reason",
    "filter_error",
    "filter_result",
    "json_error",
    "parse_binding_args",
    "parse_extender_args",
    "parse_preemption_args",
    "preemption_result",
    "priorities",
]
