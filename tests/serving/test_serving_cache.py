"""Where the model cache is (flag > env > default > temp fallback) and cold/warm states."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from serving import cache as cache_module
from serving.cache import (
    CacheState,
    ModelCache,
    cache_state,
    combine,
    resolve_model_cache,
    unwritable_reason,
)


def unusable(tmp_path: Path) -> Path:
    """A path no one can create a directory at, root included (CI runs as root, which
    ignores permission bits): it lies under a regular file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return blocker / "cache"


@pytest.mark.parametrize(("flag", "environ", "expected", "source"), [
    ("/f", {"GPUFRAG_MODEL_CACHE_DIR": "/m", "GPUFRAG_CACHE_DIR": "/r"}, "/f",
     "--model-cache-dir"),
    (None, {"GPUFRAG_MODEL_CACHE_DIR": "/m", "GPUFRAG_CACHE_DIR": "/r"}, "/m",
     "GPUFRAG_MODEL_CACHE_DIR"),
    (None, {"GPUFRAG_CACHE_DIR": "/r", "XDG_CACHE_HOME": "/x"}, "/r/models",
     "GPUFRAG_CACHE_DIR"),
    (None, {"XDG_CACHE_HOME": "/x"}, "/x/gpufrag/models", "default"),
])
def test_the_first_configured_place_wins(tmp_path: Path, flag: str | None,
                                         environ: dict[str, str], expected: str,
                                         source: str) -> None:
    def under(value: str) -> str:  # the table's absolute paths, placed under tmp_path
        return str(tmp_path) + value

    env = {key: under(value) for key, value in environ.items()}
    found = resolve_model_cache(Path(under(flag)) if flag else None, env)
    assert found == ModelCache(path=Path(under(expected)), source=source)
    assert found.path.is_dir()  # created, and probed by writing a file into it
    assert list(found.path.iterdir()) == []  # the probe leaves nothing behind


def test_an_empty_variable_counts_as_unset(tmp_path: Path) -> None:
    found = resolve_model_cache(None, {"GPUFRAG_MODEL_CACHE_DIR": "",
                                       "XDG_CACHE_HOME": str(tmp_path)})
    assert found.source == "default"


def test_an_unwritable_default_falls_back_to_a_private_temp_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The production image's user has HOME=/nonexistent on a read-only root: the default
    must not stop it from serving."""
    home = unusable(tmp_path)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: home))
    monkeypatch.setattr(cache_module.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with capture_logs() as logs:
        found = resolve_model_cache(None, {})
    assert found.source == "temp-fallback" and found.unwritable is None
    assert found.fallback_from == home / ".cache" / "gpufrag" / "models"
    assert found.path == tmp_path / "tmp" / f"gpufrag-{os.getuid()}" / "models"
    assert (found.path.parent.stat().st_mode & 0o777) == 0o700
    (line,) = logs
    assert line["event"] == "model_cache_fallback" and line["log_level"] == "warning"
    assert line["path"] == str(found.path) and line["reason"] == "Not a directory"
    assert "--model-cache-dir" in line["fix"] and "GPUFRAG_MODEL_CACHE_DIR" in line["fix"]


def test_a_temp_dir_someone_else_planted_is_not_used(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module.tempfile, "tempdir", str(tmp_path))
    (tmp_path / f"gpufrag-{os.getuid()}").write_text("not a directory")
    path = cache_module.private_temp_dir()
    assert path.parent.parent == tmp_path and path.parent.name.startswith("gpufrag-")
    assert path.parent.is_dir()


def test_an_unwritable_explicit_dir_is_kept_and_warned_about(tmp_path: Path) -> None:
    """An operator's choice is not second-guessed (a pre-filled read-only cache works), but
    the log says that misses cannot be written."""
    chosen = unusable(tmp_path)
    with capture_logs() as logs:
        found = resolve_model_cache(chosen, {})
    assert found.path == chosen and found.unwritable == "Not a directory"
    (line,) = logs
    assert line["event"] == "model_cache_not_writable" and line["source"] == "--model-cache-dir"


def test_unwritable_reason_names_the_problem(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert unwritable_reason(tmp_path / "new" / "dir") is None
    assert unwritable_reason(tmp_path / "file" / "below") == "Not a directory"


@pytest.mark.parametrize(("hits", "expected"), [
    ((None,), "none"),
    ((True,), "warm"),
    ((False,), "cold"),
])
def test_cache_state_of_one_artefact(hits: tuple[bool | None], expected: CacheState) -> None:
    assert cache_state(*hits) == expected


@pytest.mark.parametrize(("states", "expected"), [
    (("warm", "none"), "warm"),     # built-in model found, ONNX Runtime: nothing else cached
    (("none", "none"), "none"),     # a model file by path on ONNX Runtime
    (("warm", "cold"), "cold"),     # model found, TensorRT engine built: a cold start
    (("cold", "warm"), "cold"),
    (("none", "warm"), "warm"),     # a model file by path, engine deserialised
])
def test_one_miss_makes_the_load_cold(states: tuple[CacheState, ...],
                                      expected: CacheState) -> None:
    assert combine(*states) == expected
