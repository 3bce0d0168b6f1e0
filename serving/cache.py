"""The model cache: where built-in models and TensorRT engines are kept, and whether a load
found what it needed there (warm) or had to make it (cold).

Why it matters: a pod's cold start is dominated by making the model servable (generating a
built-in graph, building a TensorRT engine: tens of seconds to minutes) rather than by reading
it back (a deserialisation: seconds). With the cache on a node-local volume (a hostPath or a
local PV) a replacement pod on the same node starts warm; with an ``emptyDir`` every pod
starts cold. ``gpufrag_serving_model_load_seconds{cache="cold|warm"}`` shows which one a pod
got, so the difference can be measured rather than assumed.

Where the cache is, first match wins:

1. ``--model-cache-dir`` (the flag),
2. ``$GPUFRAG_MODEL_CACHE_DIR`` (the directory itself),
3. ``$GPUFRAG_CACHE_DIR/models`` (gpufrag's cache root, shared with the dev kit),
4. ``$XDG_CACHE_HOME/gpufrag/models``, else ``~/.cache/gpufrag/models`` (the default).

1-3 are an operator's explicit choice and are used as given: one that cannot be written is
logged as a warning, and a load that then needs to write there fails naming it (a read-only,
pre-filled cache is legitimate, so it is not refused up front). The default (4) depends on
HOME, which the production image does not have (its user's HOME is ``/nonexistent``, on a
read-only root file system), so when it cannot be written the runtime falls back to a
private directory under the system temp dir and says so in one log line.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

log = structlog.get_logger("serving.cache")

MODEL_CACHE_ENV = "GPUFRAG_MODEL_CACHE_DIR"
CACHE_ROOT_ENV = "GPUFRAG_CACHE_DIR"

# A load's cache outcome, the ``cache`` label of the load-time gauge: "warm" when everything
# the load needed was already in the cache, "cold" when something had to be made and written
# there, "none" when the load used no cache at all (a model file given by path, on ONNX
# Runtime, which reads it directly).
CacheState = Literal["warm", "cold", "none"]


@dataclass(frozen=True)
class ModelCache:
    """The resolved cache directory, where the choice came from, and whether it can be
    written (``unwritable`` is the reason when not)."""

    path: Path
    source: str
    unwritable: str | None = None
    fallback_from: Path | None = None


def cache_state(hit: bool | None) -> CacheState:
    """One cached artefact: ``True`` = it was in the cache, ``False`` = it had to be made and
    written there, ``None`` = this load does not cache it."""
    if hit is None:
        return "none"
    return "warm" if hit else "cold"


def combine(*states: CacheState) -> CacheState:
    """A load made of several cached steps (the model file, then the engine): one miss makes
    it cold, since its time is that of making the artefact whatever else was warm."""
    if "cold" in states:
        return "cold"
    return "warm" if "warm" in states else "none"


def default_model_cache_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/gpufrag/models``, else ``~/.cache/gpufrag/models``."""
    xdg = environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "gpufrag" / "models"


def unwritable_reason(path: Path) -> str | None:
    """None when files can be created in ``path`` (created if missing), else why not.

    Probes by creating (and at once removing) a file rather than asking ``os.access``: that
    is the operation the cache needs, and it sees read-only mounts and ownership alike.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def private_temp_dir() -> Path:
    """``<temp dir>/gpufrag-<uid>/models``, created 0700 and owned by this user. The temp dir
    may be shared with other users, so one we do not own is not trusted: a fresh
    ``mkdtemp`` is used instead."""
    root = Path(tempfile.gettempdir()) / f"gpufrag-{os.getuid()}"
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        info = root.lstat()
        if info.st_uid != os.getuid() or not stat.S_ISDIR(info.st_mode):
            root = Path(tempfile.mkdtemp(prefix="gpufrag-"))
    except OSError:
        root = Path(tempfile.mkdtemp(prefix="gpufrag-"))
    return root / "models"


def resolve_model_cache(configured: Path | None,
                        environ: Mapping[str, str] | None = None) -> ModelCache:
    """Where this process caches models (see the module docstring for the order), logging
    the choice once: ``model_cache`` (info), or ``model_cache_fallback`` /
    ``model_cache_not_writable`` (warnings that name the path, the reason and the fix)."""
    env = os.environ if environ is None else environ
    explicit: tuple[Path, str] | None = None
    if configured is not None:
        explicit = configured, "--model-cache-dir"
    elif env.get(MODEL_CACHE_ENV):
        explicit = Path(env[MODEL_CACHE_ENV]), MODEL_CACHE_ENV
    elif env.get(CACHE_ROOT_ENV):
        explicit = Path(env[CACHE_ROOT_ENV]) / "models", CACHE_ROOT_ENV

    if explicit is not None:
        path, source = explicit
        reason = unwritable_reason(path)
        cache = ModelCache(path=path, source=source, unwritable=reason)
        if reason is not None:
            log.warning("model_cache_not_writable", path=str(path), source=source,
                        reason=reason, effect="models and engines missing from it cannot be "
                        "written; a load that needs one fails", fix="make it writable by "
                        f"uid {os.getuid()} (e.g. fsGroup on the volume) or choose another "
                        "directory")
        else:
            log.info("model_cache", path=str(path), source=source)
        return cache

    default = default_model_cache_dir(env)
    reason = unwritable_reason(default)
    if reason is None:
        log.info("model_cache", path=str(default), source="default")
        return ModelCache(path=default, source="default")
    fallback = private_temp_dir()
    log.warning("model_cache_fallback", default=str(default), reason=reason,
                path=str(fallback), effect="the cache lasts only as long as this "
                "container's temp dir: every new pod starts cold",
                fix=f"mount a writable volume and pass --model-cache-dir or set "
                f"{MODEL_CACHE_ENV}")
    return ModelCache(path=fallback, source="temp-fallback",
                      unwritable=unwritable_reason(fallback), fallback_from=default)
