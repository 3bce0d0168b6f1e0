"""Separate virtual environments for clients that cannot live in the project's own venv.

Some clients no one here wrote pin dependencies that conflict with this project's (``kserve``
pins ``protobuf<7`` and ``python-dateutil<3``), so the tests that drive ``gpufrag serve`` with
them run them from a venv of their own. :func:`client_python` builds that venv once and caches
it outside the repository, under
``${GPUFRAG_CACHE_DIR:-~/.cache/gpufrag}/venvs/<name>-<hash of requirements>``:

- a lock file next to it makes concurrent sessions wait for one build instead of racing;
- the venv is built in a uniquely named directory and published by atomically renaming a
  symlink onto the cache path, so a reader sees either no venv or a complete one (the build
  directory keeps its name, so the absolute paths pip writes into it stay valid);
- the venv's installer is replaced first by the locked one (``requirements/test-tools.lock``,
  hash-checked): the pip that ``python -m venv`` bundles is whatever the interpreter shipped
  with, and pip 23's resolver refuses a hashed lock as soon as a dependency names an extra
  (``kserve`` asks ``uvicorn[standard]``) and a newer release of it is published;
- a failed build raises :class:`ClientVenvError` with the tail of pip's output, so the test
  that needs the client fails rather than silently skipping.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

REQUIREMENTS: Final = Path(__file__).resolve().parents[1] / "requirements"
# What each named client venv holds: a lock (every version pinned and hash-checked, made by
# scripts/lock) of the versions measured working against ``gpufrag serve``, so a fresh machine
# builds the venv the last green run had.
CLIENTS: Final[dict[str, tuple[str, ...]]] = {
    "kserve": ("--require-hashes", "-r", str(REQUIREMENTS / "kserve-client.lock")),
}
# Modules each venv must import once built (a venv that installs but cannot import is broken).
# The installer every client venv gets before its own requirements: pip, setuptools and wheel at
# the test environment's versions, hash-checked.
INSTALLER: Final[tuple[str, ...]] = ("--require-hashes", "-r",
                                     str(REQUIREMENTS / "test-tools.lock"))
IMPORTS: Final[dict[str, tuple[str, ...]]] = {
    "kserve": ("kserve", "numpy"),
}
BUILD_TIMEOUT_S: Final = 900.0
LOCK_TIMEOUT_S: Final = 1200.0
OUTPUT_TAIL_CHARS: Final = 4000
_SCHEMA: Final = "2"  # bump to invalidate every cached venv


class ClientVenvError(RuntimeError):
    """Building a client venv failed; the message carries the tail of the failing output."""


def cache_root() -> Path:
    root = os.environ.get("GPUFRAG_CACHE_DIR") or str(Path.home() / ".cache" / "gpufrag")
    return Path(root) / "venvs"


def venv_key(name: str, requirements: Sequence[str]) -> str:
    """``<name>-<hash>``: the hash covers the installer and the requirements (a requirements
    file named after ``-r`` by its content: a changed lock builds a new venv) and the base
    interpreter."""
    files = [Path(path).read_text()
             for flag, path in itertools.pairwise((*INSTALLER, *requirements)) if flag == "-r"]
    text = "\n".join([_SCHEMA, sys.version, sys.base_prefix, *sorted(requirements), *files])
    return f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(command: Sequence[str | Path], what: str, timeout_s: float) -> None:
    try:
        result = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                                timeout=timeout_s, check=False,
                                env={**os.environ, "PIP_NO_INPUT": "1",
                                     "PIP_PROGRESS_BAR": "off"})
    except subprocess.TimeoutExpired as exc:
        output = _text(exc.stdout) + _text(exc.stderr)
        raise ClientVenvError(f"{what} timed out after {timeout_s:.0f} s:\n"
                              f"{output[-OUTPUT_TAIL_CHARS:]}") from exc
    if result.returncode != 0:
        output = result.stdout + result.stderr
        raise ClientVenvError(f"{what} failed (exit {result.returncode}):\n"
                              f"{output[-OUTPUT_TAIL_CHARS:]}")


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _ready(link: Path) -> Path | None:
    """The venv ``link`` points at, if it is published and has its interpreter."""
    if link.is_symlink() and _python(link.resolve()).exists():
        return link.resolve()
    return None


def _lock(path: Path, timeout_s: float) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise ClientVenvError(f"waited {timeout_s:.0f} s for {path} (another session "
                                      "building the same venv?)") from None
            time.sleep(1.0)


def client_python(name: str, requirements: Sequence[str] | None = None, *,
                  imports: Sequence[str] | None = None,
                  build_timeout_s: float = BUILD_TIMEOUT_S,
                  lock_timeout_s: float = LOCK_TIMEOUT_S) -> Path:
    """The interpreter of the client venv ``name``, building it first if it is not cached.

    ``requirements`` defaults to :data:`CLIENTS` [name], ``imports`` to :data:`IMPORTS` [name].
    """
    reqs = tuple(requirements if requirements is not None else CLIENTS[name])
    modules = tuple(imports if imports is not None else IMPORTS.get(name, ()))
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    key = venv_key(name, reqs)
    link = root / key
    if (venv := _ready(link)) is not None:
        return _python(venv)
    fd = _lock(root / f"{key}.lock", lock_timeout_s)
    try:
        if (venv := _ready(link)) is not None:  # built by whoever held the lock
            return _python(venv)
        for stale in root.glob(f".{key}.*"):  # left by a build that died; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        build = root / f".{key}.{os.getpid()}.{time.time_ns()}"
        try:
            _build(build, reqs, modules, build_timeout_s)
            staged = root / f".{key}.link-{os.getpid()}"
            staged.unlink(missing_ok=True)
            staged.symlink_to(build.name)
            if link.is_dir() and not link.is_symlink():  # not ours (a plain dir): replace it
                shutil.rmtree(link)
            os.replace(staged, link)  # atomic: readers see no venv or a complete one
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
        return _python(build)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _build(venv: Path, requirements: Sequence[str], modules: Sequence[str],
           timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    _run([sys.executable, "-m", "venv", venv], f"creating the venv {venv}", left())
    python = _python(venv)
    for step in (INSTALLER, tuple(requirements)):
        _run([python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
              "--progress-bar", "off", *step], f"pip install {' '.join(step)}", left())
    if modules:
        code = "; ".join(f"import {module}" for module in modules)
        _run([python, "-I", "-c", code], f"importing {', '.join(modules)} in {venv}", left())
