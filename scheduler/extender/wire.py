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

import bisect
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any, overload

import numpy as np
import numpy.typing as npt
import orjson

from gpufrag.membudget import parse_cost
from scheduler.core.state import IntArray
from scheduler.extender.scoring import MAX_PRIORITY, UNKNOWN, FilterVerdicts, Priorities

Obj = Mapping[str, Any]


class WireError(ValueError):
    """A request body that is not what the protocol says; the message names the field."""


NameSet = frozenset[bytes]


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: Obj
    names: Sequence[Any]  # a list, or NameChunks for a list too long to hold whole
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
# filters), at most this many, of at most MAX_KEPT_NAMES names together (a kept name costs
# about 160 bytes: its bytes, its set entry, its parsed string): a list longer than that, which
# no cluster's scheduler sends twice, is parsed each time and not kept.
MAX_NAME_LISTS = 8
MAX_KEPT_NAMES = 262_144


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

    def __init__(self, size: int = MAX_NAME_LISTS, names: int | None = None) -> None:
        self.size = size
        self.names = MAX_KEPT_NAMES if names is None else names  # over all lists, at most
        self._lists: dict[NameSet, tuple[NameSet, list[Any]]] = {}
        self._kept = 0
        self._lock = threading.Lock()

    def fits(self, count: int) -> bool:
        """Whether a list of ``count`` names may be kept at all."""
        return count <= self.names

    def get(self, names: NameSet) -> tuple[NameSet, list[Any]] | None:
        """The kept key object (the same one each time: dict lookups by it are O(1)) and
        list for this set, or None."""
        with self._lock:
            return self._lists.get(names)

    def put(self, names: NameSet, parsed: list[Any]) -> tuple[NameSet, list[Any]]:
        """Keep ``parsed`` under ``names`` (the oldest lists go to make room); a list over
        :meth:`fits` is handed back unkept."""
        if not self.fits(len(parsed)):
            return names, parsed
        with self._lock:
            if names not in self._lists:
                while self._lists and (len(self._lists) >= self.size
                                       or self._kept + len(parsed) > self.names):
                    self._kept -= len(self._lists.pop(next(iter(self._lists)))[1])  # oldest
                self._kept += len(parsed)
            kept = self._lists.setdefault(names, (names, parsed))
            return kept

    @property
    def kept_names(self) -> int:
        """Names held over every kept list."""
        return self._kept


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
    # Each entry takes at least 3 bytes ("", and a comma), so most lists need no count.
    if (len(body) - at) // 3 > lists.names and not lists.fits(
            body.count(b'","', at, len(body)) + 1):
        return None  # not to be kept: its split, set and parse would only add to one parse
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


def names_at(body: bytes) -> tuple[int, int] | None:
    """Where the NodeNames list's entries lie in ``body`` (between its brackets), when it ends
    with them as kube-scheduler writes it (``,"NodeNames":[...]}``) and no backslash is among
    them; else None. Searched in place: no copy of them."""
    at = body.rfind(_NAMES_TAIL)
    if at <= 0 or not body.endswith(b"]}"):
        return None
    start, end = at + len(_NAMES_TAIL), len(body) - 2
    if body.find(b"\\", start, end) >= 0:
        return None
    return start, end


def names_sent(body: bytes) -> int | None:
    """How many NodeNames ``body`` holds (see :func:`names_at`), counted without parsing it;
    else None. What a verb's answer will cost is then known before the body is parsed."""
    span = names_at(body)
    if span is None:
        return None
    start, end = span
    return body.count(b'","', start, end) + 1 if end > start else 0


# A NodeNames list of more than MAX_KEPT_NAMES names is read NAME_CHUNK_BYTES of it at a time.
NAME_CHUNK_BYTES = 256 * 1024


class NameChunks(Sequence[Any]):
    """A NodeNames list too long to hold whole (more than :data:`MAX_KEPT_NAMES`), read from
    the body a chunk of :data:`NAME_CHUNK_BYTES` at a time.

    Held whole, 3.5M names (a 50 MB body) were 215 MB of strings beside the rows looked up
    from them and the answer made from them. Without a backslash among the entries, ``","``
    occurs only between two strings (a quote inside a string is escaped), so the list splits
    there into chunks that each parse as a JSON array; every chunk is parsed by orjson when
    it is read (a chunk that is not JSON is the request's fault: :class:`WireError`), and
    reading them all reads what parsing the list would. :meth:`chunks` reads them in order
    (the rows of the names); indexing reads the chunk of the index, the last one kept (the
    answer, which asks for names in order)."""

    def __init__(self, body: bytes, start: int, end: int) -> None:
        self._body = body
        self._spans = _name_spans(body, start, end)  # (first index, start, end) of each
        self._count = self._spans[-1][0] + body.count(b'","', *self._spans[-1][1:]) + 1
        self._firsts = [span[0] for span in self._spans]
        self._kept: tuple[int, list[Any]] = (-1, [])

    def __len__(self) -> int:
        return self._count

    def _chunk(self, i: int) -> list[Any]:
        if self._kept[0] != i:
            first, start, stop = self._spans[i]
            try:
                names = orjson.loads(b"[" + self._body[start:stop] + b"]")
            except orjson.JSONDecodeError as e:
                raise WireError(f"request body is not valid JSON: NodeNames, from entry "
                                f"{first}: {json_error(e)}") from None
            if not isinstance(names, list):  # pragma: no cover - it was bracketed
                raise WireError("NodeNames must be a list")
            self._kept = (i, names)
        return self._kept[1]

    def chunks(self) -> Iterator[tuple[int, list[Any]]]:
        """(index of its first name, its names) for each chunk, in order."""
        for i, (first, _, _) in enumerate(self._spans):
            yield first, self._chunk(i)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        index %= self._count
        i = bisect.bisect_right(self._firsts, index) - 1
        return self._chunk(i)[index - self._firsts[i]]


def _name_spans(body: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """(index of its first name, start, end) of each chunk of the entries from ``start`` to
    ``end`` (not empty): cut at the first ``","`` past :data:`NAME_CHUNK_BYTES`."""
    spans: list[tuple[int, int, int]] = []
    first, at = 0, start
    while at < end:
        cut = body.find(b'","', min(at + NAME_CHUNK_BYTES, end), end)
        stop = end if cut < 0 else cut + 1
        spans.append((first, at, stop))
        first += body.count(b'","', at, stop) + 1
        at = stop + 1  # past the comma
    return spans


def _chunked_list(body: bytes) -> tuple[int, int] | None:
    """Where a NodeNames list to be read in chunks lies (see :class:`NameChunks`), or None."""
    span = names_at(body)
    if span is None or body.count(b'","', *span) + 1 <= MAX_KEPT_NAMES:
        return None
    return span


def parse_cost_of(body: bytes) -> int:
    """What :func:`parse_extender_args` holds to parse ``body``, read off it
    (:func:`gpufrag.membudget.parse_cost`): all of it, or, for a NodeNames list read in
    chunks, the rest of the body, its costliest chunk (and that chunk's copy) and the rows
    looked up from it (two int64s a name, while they are joined)."""
    span = _chunked_list(body)
    if span is None:
        return parse_cost(body)
    spans = _name_spans(body, *span)
    count = spans[-1][0] + body.count(b'","', *spans[-1][1:]) + 1
    return (parse_cost(body, 0, span[0]) + 16 * count
            + max(parse_cost(body, s, e) + 2 * (e - s) for _, s, e in spans))


def _chunked(body: bytes) -> tuple[dict[str, Any], NameChunks] | None:
    """The body as (the rest of its object, its NodeNames as :class:`NameChunks`) when the
    list is written last, has no backslash and is too long to hold whole; else None."""
    span = _chunked_list(body)
    if span is None:
        return None
    start, end = span
    try:
        head = orjson.loads(body[:start - len(_NAMES_TAIL)] + b"}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(head, dict) or "NodeNames" in head:
        return None
    return head, NameChunks(body, start, end)


def parse_extender_args(body: bytes, lists: NameLists | None = None) -> ExtenderArgs:
    """ExtenderArgs for filter and prioritize; with ``lists``, a NodeNames list seen before
    is not parsed again (see :class:`NameLists`)."""
    split: tuple[dict[str, Any], Sequence[Any], NameSet | None] | None = (
        _split_names(body, lists) if lists is not None and body else None)
    if split is None and body:
        chunked = _chunked(body)
        split = None if chunked is None else (*chunked, None)
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
        # The entries are checked where they are looked up (Placement.rows): a per-name check
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


def json_text(value: Any) -> bytes:
    """``orjson.dumps(value)`` in an object of its own size.

    orjson (3.13) hands back bytes that keep its whole initial buffer, about 4 KiB however
    short the text (measured: 100,000 encoded node names held 393 MB, their copies 5.5 MB).
    An encoding that is kept (one per node) or made once per entry of an answer (a node name
    the state does not know) is copied out of it first; one made and dropped at once is not."""
    return bytes(memoryview(orjson.dumps(value)))


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
            encoded = json_text(text)
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
            out[i] = make(names[int(positions[i])])
        return out


def encode_reason(text: str) -> bytes:
    """A filter reason as the value half of a FailedNodes entry: ``:"<reason>",``."""
    return b":" + orjson.dumps(text) + b","


def _host(name: Any) -> bytes:
    return b'{"Host":' + orjson.dumps(name) + b',"Score":'


SCORE_TAIL = np.array([f"{score}}},".encode() for score in range(MAX_PRIORITY + 1)], object)
# Answers are built in pieces of this many entries, each joined at C speed, and sent piece
# after piece (see :data:`Answer`): an answer is never copied whole, and what a piece needs
# on the way (an entry's bytes, the list that joins them) is freed before the next is made.
PIECE_ENTRIES = 16_384
# Nodes mode sends back the Node objects that passed, encoded this many at a time.
ECHO_ITEMS = 64
# An answer up to this size is joined into one piece: sent in one write, as small answers
# always were (a piece per write costs every request a few sends).
JOIN_BYTES = 1024 * 1024

# A verb's answer: its JSON text in pieces, to be sent one after the other as they are.
Answer = list[bytes]


class _Pieces:
    """The pieces of one JSON container whose entries each end with a comma: ``open_``, the
    joined pieces, ``close``, with the last entry's comma dropped (from the last piece only)."""

    def __init__(self, open_: bytes, close: bytes) -> None:
        self.parts = [open_]
        self.close = close

    def add(self, entries: list[bytes]) -> None:
        if entries:
            self.parts.append(b"".join(entries))

    def done(self) -> list[bytes]:
        if len(self.parts) > 1:
            self.parts[-1] = self.parts[-1][:-1]
        self.parts.append(self.close)
        return self.parts


def _interleaved(heads: list[bytes], tails: list[bytes]) -> list[bytes]:
    """``heads[0], tails[0], heads[1], ...``: slice assignment runs at C speed, a pair's
    concatenation would cost a Python-level call per node."""
    seq = [b""] * (2 * len(heads))
    seq[0::2] = heads
    seq[1::2] = tails
    return seq


def _failed_maps(names: Sequence[Any], outcome: FilterVerdicts, node_json: NodeJson
                 ) -> tuple[list[bytes], list[bytes]]:
    """FailedNodes and FailedAndUnresolvableNodes, each as pieces."""
    positions = outcome.failed
    soft, hard = _Pieces(b"{", b"}"), _Pieces(b"{", b"}")
    split = bool(outcome.unresolvable.any())
    for start in range(0, positions.size, PIECE_ENTRIES):
        at = positions[start:start + PIECE_ENTRIES]
        keys = node_json.gather(node_json.name, outcome.rows[at], names, at, json_text)
        values = outcome.rendered[start:start + PIECE_ENTRIES]
        if not split:
            soft.add(_interleaved(keys, values))
            continue
        hard_mask = outcome.unresolvable[start:start + PIECE_ENTRIES].tolist()
        soft_mask = [not h for h in hard_mask]
        soft.add(_interleaved(list(compress(keys, soft_mask)), list(compress(values, soft_mask))))
        hard.add(_interleaved(list(compress(keys, hard_mask)), list(compress(values, hard_mask))))
    return soft.done(), hard.done()


def _passed_names(names: Sequence[Any], outcome: FilterVerdicts,
                  node_json: NodeJson) -> list[bytes]:
    """The NodeNames that passed, as pieces of a JSON list."""
    kept = np.flatnonzero(outcome.passed)
    if kept.size == len(names) and kept.size <= PIECE_ENTRIES:
        return [orjson.dumps(names)]
    pieces = _Pieces(b"[", b"]")
    for start in range(0, kept.size, PIECE_ENTRIES):
        at = kept[start:start + PIECE_ENTRIES]
        encoded = node_json.gather(node_json.name, outcome.rows[at], names, at, json_text)
        pieces.add(_interleaved(encoded, [b","] * len(encoded)))
    return pieces.done()


def filter_result(args: ExtenderArgs, outcome: FilterVerdicts, node_json: NodeJson) -> Answer:
    """ExtenderFilterResult (JSON, in pieces) in the form the request used (NodeNames or
    Nodes)."""
    names = args.names
    failed, unresolvable = _failed_maps(names, outcome, node_json)
    if args.nodes is None:
        nodes, passed = [b"null"], _passed_names(names, outcome, node_json)
    else:
        nodes, passed = _echo_items(args.nodes, outcome.passed.tolist()), [b"null"]
    return [b'{"Nodes":', *nodes, b',"NodeNames":', *passed, b',"FailedNodes":', *failed,
            b',"FailedAndUnresolvableNodes":', *unresolvable, b',"Error":""}']


def _echo_items(items: list[Obj], passed: list[bool]) -> list[bytes]:
    """The NodeList of the items that passed, the very objects sent (Nodes mode), in pieces of
    :data:`ECHO_ITEMS` objects: one encoding of them all would hold orjson's buffer, grown to
    the whole answer and more, beside its copy.

    orjson reads 1,024 levels of nesting but writes only 254, so a Node object nested between
    the two parses and then cannot be sent back; that is the request's fault (a 400 naming the
    item), found only on this error path so that the usual request pays nothing for it."""
    chosen = [i for i, ok in enumerate(passed) if ok]
    parts = [b'{"metadata":{},"items":[']
    for start in range(0, len(chosen), ECHO_ITEMS):
        batch = chosen[start:start + ECHO_ITEMS]
        try:
            encoded = orjson.dumps([items[i] for i in batch])
        except orjson.JSONEncodeError:
            _too_deep(items, batch)
            raise
        if start:
            parts.append(b",")
        parts.append(encoded[1:-1])  # a copy of its own size; orjson's buffer goes
    parts.append(b"]}")
    return parts


def _too_deep(items: list[Obj], batch: list[int]) -> None:
    """Raise the WireError naming the first of ``batch`` that cannot be encoded, if any."""
    for i in batch:
        try:
            orjson.dumps(items[i])
        except orjson.JSONEncodeError as e:
            raise WireError(f"Nodes.items[{i}] cannot be sent back in Nodes.items: {e} "
                            f"(objects nested more than {MAX_ECHO_DEPTH} levels deep are "
                            "refused)") from None


def filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": message}


def priorities(args: ExtenderArgs, result: Priorities, node_json: NodeJson) -> Answer:
    """HostPriorityList (JSON, in pieces): ``[{"Host": name, "Score": 0..10}]`` in request
    order."""
    pieces = _Pieces(b"[", b"]")
    for start in range(0, len(args.names), PIECE_ENTRIES):
        end = min(start + PIECE_ENTRIES, len(args.names))
        heads = node_json.gather(node_json.host, result.rows[start:end], args.names,
                                 range(start, end), _host)
        tails: list[bytes] = SCORE_TAIL[result.scores[start:end]].tolist()
        pieces.add(_interleaved(heads, tails))
    return pieces.done()


def joined(answer: Answer) -> Answer:
    """``answer`` as one piece when it is small (:data:`JOIN_BYTES`), else as it is."""
    if len(answer) > 1 and sum(map(len, answer)) <= JOIN_BYTES:
        return [b"".join(answer)]
    return answer


__all__ = [
    "ECHO_ITEMS",
    "MAX_KEPT_NAMES",
    "MAX_NAME_LISTS",
    "NAME_CHUNK_BYTES",
    "PIECE_ENTRIES",
    "Answer",
    "BindingArgs",
    "ExtenderArgs",
    "NameChunks",
    "NameLists",
    "NameSet",
    "NodeJson",
    "NodeVictims",
    "PreemptionArgs",
    "WireError",
    "encode_reason",
    "filter_error",
    "filter_result",
    "joined",
    "json_error",
    "json_text",
    "names_at",
    "names_sent",
    "parse_binding_args",
    "parse_cost_of",
    "parse_extender_args",
    "parse_preemption_args",
    "preemption_result",
    "priorities",
]
