"""Container image references, read the way container runtimes read them.

One home for the rule that decides whether a reference names its registry (every image gpufrag
ships or runs must: a short name is resolved against a registry the node chooses) and for
splitting a reference into the parts a Helm value or a kustomize ``images:`` entry holds.
"""

from __future__ import annotations


def has_registry_host(ref: str) -> bool:
    """Whether an image reference names its registry: the first path component has a dot or a
    port, or is ``localhost`` (the rule container runtimes apply; any other name is resolved
    against a default registry the node chooses)."""
    first, sep, _ = ref.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def split_image(ref: str) -> tuple[str, str, str]:
    """An image reference as (repository, tag, digest); tag and digest may be empty."""
    name, _, digest = ref.partition("@")
    repository, tag = name, ""
    if ":" in name.rsplit("/", 1)[-1]:
        repository, tag = name.rsplit(":", 1)
    return repository, tag, digest
