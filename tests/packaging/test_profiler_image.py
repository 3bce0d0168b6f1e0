"""The profiler image's recipe (``devkit.image.build_profiler_image``) without building it: the
lock it downloads by, the layer it makes of py-spy's wheel, its cache key and its command line.
The image itself runs on the real node (tests/e2e/node/test_profiler_debug.py)."""

from __future__ import annotations

import io
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Final

import pytest

from devkit import image
from devkit.image import PROFILER_BINARY, PROFILER_LOCK, ImageBuildError
from tests.packaging.test_lock import REPO, read_lock, requirement_lines

PINS: Final = read_lock((REPO / PROFILER_LOCK).read_text(), PROFILER_LOCK)


def test_the_lock_pins_exactly_py_spy_with_its_hashes_at_the_version_the_in_file_names() -> None:
    assert list(PINS) == ["py-spy"]
    assert requirement_lines("profiler.in") == [f"py-spy=={PINS['py-spy'].version}"]
    assert PINS["py-spy"].hashes


def test_the_lock_script_regenerates_the_profiler_lock() -> None:
    script = (REPO / "scripts" / "lock").read_text()
    assert f"--output-file={PROFILER_LOCK} \"$@\" requirements/profiler.in" in script


def _wheel(directory: Path, members: dict[str, bytes], name: str = "py_spy-0.4.3-py2.py3-none-"
           "manylinux_2_5_x86_64.whl") -> Path:
    directory.mkdir(exist_ok=True)
    with zipfile.ZipFile(directory / name, "w") as wheel:
        for member, data in members.items():
            wheel.writestr(member, data)
    return directory / name


def test_the_layer_holds_the_wheel_s_binary_on_the_path_executable(tmp_path: Path) -> None:
    _wheel(tmp_path, {"py_spy-0.4.3.data/scripts/py-spy": b"\x7fELF static",
                      "py_spy-0.4.3.dist-info/METADATA": b"Name: py-spy"})
    with tarfile.open(fileobj=io.BytesIO(image._py_spy_layer(tmp_path))) as layer:
        (member,) = layer.getmembers()
        assert (member.name, member.mode, member.mtime) == (PROFILER_BINARY, 0o755, 0)
        extracted = layer.extractfile(member)
        assert extracted is not None and extracted.read() == b"\x7fELF static"


@pytest.mark.parametrize(("wheels", "message"), [
    ([], "expected one py-spy wheel"),
    (["a", "b"], "expected one py-spy wheel"),
    (["no-binary"], "has no py-spy binary"),
])
def test_a_download_that_is_not_one_wheel_with_the_binary_fails_the_build(
        tmp_path: Path, wheels: list[str], message: str) -> None:
    tmp_path.joinpath("wheels").mkdir()
    for i, kind in enumerate(wheels):
        members = ({"py_spy-0.4.3.dist-info/METADATA": b""} if kind == "no-binary"
                   else {"py_spy-0.4.3.data/scripts/py-spy": b""})
        _wheel(tmp_path / "wheels", members, f"py_spy-0.4.{i}-py2.py3-none-any.whl")
    with pytest.raises(ImageBuildError, match=message):
        image._py_spy_layer(tmp_path / "wheels")


def test_the_cache_key_follows_the_base_and_the_lock(tmp_path: Path) -> None:
    (tmp_path / "requirements").mkdir()
    shutil.copy(REPO / PROFILER_LOCK, tmp_path / PROFILER_LOCK)
    key = image.profiler_key("base-a", tmp_path)
    assert image.profiler_key("base-a", tmp_path) == key
    assert image.profiler_key("base-b", tmp_path) != key
    (tmp_path / PROFILER_LOCK).write_text((REPO / PROFILER_LOCK).read_text() + "# changed\n")
    assert image.profiler_key("base-a", tmp_path) != key


def test_asking_for_two_images_at_once_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        image.main(["--gpu", "--profiler"])
    assert exited.value.code == 2
    assert "--gpu and --profiler name two images" in capsys.readouterr().err
