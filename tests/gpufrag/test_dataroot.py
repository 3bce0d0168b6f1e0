"""The data root: ``GPUFRAG_DATA_ROOT``, else ``shared/data`` beside the repository, found from the
package's own file and never from the current directory, for the setting and for every product
default read from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpufrag
from gpufrag.dataroot import BESIDE_REPO, ENV, data_root, fallback_line
from simulations import defrag_whatif, genai

REPO = Path(gpufrag.__file__).resolve().parents[1]


def test_the_default_is_shared_data_beside_the_repository_whatever_the_cwd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert data_root() == BESIDE_REPO == REPO.parent / "shared" / "data"
    monkeypatch.chdir(tmp_path)
    assert data_root() == REPO.parent / "shared" / "data"
    assert data_root().is_absolute()


def test_the_setting_wins_and_an_empty_one_is_unset(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "elsewhere"))
    assert data_root() == tmp_path / "elsewhere"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV, "relative/data")  # as a path on a command line: from the cwd
    assert data_root() == tmp_path / "relative" / "data"
    monkeypatch.setenv(ENV, "  ")
    assert data_root() == BESIDE_REPO


def test_the_product_defaults_read_the_data_root() -> None:
    assert data_root() / "genai" == genai.DEFAULT_DIR
    assert data_root() / "genai" / defrag_whatif.GENAI_FILE == defrag_whatif.DEFAULT_GENAI


_PRINT_DEFAULTS = """
import json
from devkit import fleet
from simulations import defrag_whatif, genai
print(json.dumps([str(genai.DEFAULT_DIR), str(defrag_whatif.DEFAULT_GENAI),
                  str(fleet.OPENB_DIR)]))
"""


@pytest.mark.parametrize("setting", [None, "mine"])
def test_a_command_started_elsewhere_gets_the_same_defaults(tmp_path: Path,
                                                            setting: str | None) -> None:
    """In a fresh process started in an unrelated folder, as a user's command would be."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = str(REPO)
    root = BESIDE_REPO
    if setting is not None:
        root = tmp_path / setting
        env[ENV] = str(root)
    result = subprocess.run([sys.executable, "-c", _PRINT_DEFAULTS], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [str(root / "genai"),
                                         str(root / "genai" / defrag_whatif.GENAI_FILE),
                                         str(root / "openb")]


def test_the_fallback_line_names_the_path_and_the_setting(tmp_path: Path) -> None:
    line = fallback_line(tmp_path / "genai", "GenAI trace")
    assert line.startswith(f"no GenAI trace at {tmp_path / 'genai'}: using the synthetic")
    assert ENV in line and str(BESIDE_REPO) in line and "\n" not in line
