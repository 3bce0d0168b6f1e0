"""The webhook's own JSON patches applied to a copy of the pod (RFC 6902: add, replace,
remove), so that a second mutation can read the pod as the first one leaves it and both go
back as one patch (right-sizing, then the conversion into claims: docs/dra.md).

Only the three operations the webhook writes, on paths it built from the pod it read: a path
that does not resolve is a bug here, raised as ``ValueError``. No library is used for this
because none is among the image's dependencies and this is all the webhook needs of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _parent(doc: Any, path: str) -> tuple[Any, str]:
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not a JSON pointer")
    *head, last = [_unescape(t) for t in path[1:].split("/")]
    node = doc
    for token in head:
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node, last


def applied(doc: Any, patch: Sequence[dict[str, Any]]) -> Any:
    """A copy of ``doc`` with ``patch`` applied in order."""
    out = orjson.loads(orjson.dumps(doc))
    for op in patch:
        if op.get("op") not in ("add", "replace", "remove"):
            raise ValueError(f"patch op {op.get('op')!r}: only add, replace and remove")
        try:
            parent, key = _parent(out, op["path"])
            if isinstance(parent, list):
                if op["op"] == "add":
                    parent.insert(len(parent) if key == "-" else int(key), op["value"])
                elif op["op"] == "replace":
                    parent[int(key)] = op["value"]
                else:
                    del parent[int(key)]
            elif op["op"] == "remove":
                del parent[key]
            elif op["op"] == "replace" and key not in parent:
                raise KeyError(key)
            else:
                parent[key] = op["value"]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ValueError(f"patch {op['op']} {op['path']}: {type(e).__name__}: {e}") from None
    return out
