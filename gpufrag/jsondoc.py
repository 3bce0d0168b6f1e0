"""The opening of every versioned JSON object the project stores in an annotation.

The right-sizing recommendation (``gpufrag.io/gpu-recommendation``) and the defrag
controller's state both hold a JSON object with a ``version``; a reader must refuse a value
that is not JSON, not an object, or of a version it does not know, each as
:class:`~gpufrag.errors.BadInput` naming the place, so an operator sees which annotation to
fix (or which component to upgrade) instead of a traceback. One home for that opening, in the
shared base, because the two readers sit in different components.
"""

from __future__ import annotations

from typing import Any

import orjson

from gpufrag.errors import BadInput


def versioned_object(text: str | bytes, version: int, *, source: str) -> dict[str, Any]:
    """The JSON object ``text`` holds, whose ``version`` is ``version``; else BadInput."""
    try:
        doc: Any = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"not valid JSON ({exc})", source=source) from None
    if not isinstance(doc, dict):
        raise BadInput("expected an object", source=source, field="(root)")
    if doc.get("version") != version:
        raise BadInput(f"schema version {doc.get('version')!r} is not supported (this reader "
                       f"knows {version})", source=source, field="version")
    return doc
