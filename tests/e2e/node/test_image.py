"""devkit/image.py: the OCI archive writer, the cache key, and the image it builds (mmdebstrap
base + buildah), read back from the archive: what the Dockerfile says, and nothing of the build
machine's (its CA bundle, mounted for pip during the build only)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tomllib
from pathlib import Path
from typing import Any

from devkit.image import (
    HOST_CA_BUNDLE,
    IMAGE_INPUTS,
    REPO_ROOT,
    build_image,
    image_key,
    unpacked_bytes,
    write_oci_archive,
)
from tests import skips


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _read(archive: Path) -> tuple[dict[str, Any], dict[str, Any], list[bytes]]:
    """(manifest, config, layers) of a one-image OCI archive."""
    with tarfile.open(archive) as tar:
        def blob(digest: str) -> bytes:
            f = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert f is not None
            return f.read()
        index_file = tar.extractfile("index.json")
        assert index_file is not None
        (entry,) = json.load(index_file)["manifests"]
        manifest = json.loads(blob(entry["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        return manifest, config, [blob(layer["digest"]) for layer in manifest["layers"]]


def test_the_archive_is_a_deterministic_oci_layout(tmp_path: Path) -> None:
    layers: list[bytes | Path] = [_layer({"a": b"1"}), tmp_path / "layer.tar"]
    (tmp_path / "layer.tar").write_bytes(_layer({"b": b"2"}))
    first = write_oci_archive(tmp_path / "one.tar", "gpufrag.local/x:1", layers, {"Cmd": ["a"]})
    second = write_oci_archive(tmp_path / "two.tar", "gpufrag.local/x:1", layers, {"Cmd": ["a"]})
    assert first.read_bytes() == second.read_bytes()
    manifest, config, blobs = _read(first)
    assert config["config"] == {"Cmd": ["a"]}
    assert config["rootfs"]["diff_ids"] == [
        "sha256:" + hashlib.sha256(b).hexdigest() for b in blobs]
    assert [layer["size"] for layer in manifest["layers"]] == [len(b) for b in blobs]
    assert unpacked_bytes(first) == 2  # one byte in each layer's one file


@skips.skip_if(shutil.which("buildah") is None, skips.MISSING_COMMAND, "buildah")
def test_the_image_key_follows_what_the_dockerfile_copies(tmp_path: Path) -> None:
    for name in IMAGE_INPUTS:
        path = tmp_path / name
        if "." in name or name == "Dockerfile":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(name)
        else:
            (path / "__init__.py").parent.mkdir(parents=True)
            (path / "__init__.py").write_text(name)
    key = image_key("base", tmp_path)
    (tmp_path / "serving" / "__pycache__").mkdir()
    (tmp_path / "serving" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert image_key("base", tmp_path) == key  # not an input
    assert image_key("other-base", tmp_path) != key
    (tmp_path / "serving" / "new.py").write_text("")
    assert image_key("base", tmp_path) != key


@skips.skip_if(os.geteuid() != 0, skips.NOT_ROOT, "buildah with chroot isolation here")
def test_the_built_image_is_what_the_dockerfile_says() -> None:
    built = build_image()  # cached by the node's fixture or an earlier run; else ~2 min
    _, config, layers = _read(built.archive)
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Entrypoint"] == ["gpufrag"]
    assert "GPUFRAG_LOG_FORMAT=json" in config["config"]["Env"]
    labels = config["config"]["Labels"]
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["io.gpufrag.image.variant"] == "cluster"
    # The lean image: the what-if's plotting is left out (requirements/plot.in, #30).
    installed: set[str] = set()
    files: set[str] = set()
    for layer in layers:
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            names = [m.name.lstrip("./") for m in tar.getmembers()]
            files |= set(names)
            installed |= {name.split("site-packages/", 1)[1].split("/", 1)[0]
                          for name in names if "/site-packages/" in name}
    assert {"numpy", "onnxruntime", "gpufrag"} <= installed
    assert installed & {"matplotlib", "PIL", "fontTools"} == set()
    # The C fragmentation kernel, compiled in the build stage (the build itself refuses an
    # image without it), in place of numba; the compiler stayed in the build stage.
    assert [f for f in files if "/site-packages/scheduler/core/_fragkernel." in f
            and f.endswith(".so")], "the image has no compiled fragmentation kernel"
    assert installed & {"numba", "llvmlite"} == set()
    assert not any(f in files for f in ("usr/bin/gcc", "usr/include/python3.11/Python.h"))
    # The build machine's CA bundle was mounted over the base's for pip only: the image has
    # Debian's own (the last layer that carries the file wins).
    bundle = None
    for layer in layers:
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            with_bundle = [m for m in tar.getmembers()
                           if m.name.lstrip("./") == "etc/ssl/certs/ca-certificates.crt"]
            if with_bundle and with_bundle[0].isfile():
                f = tar.extractfile(with_bundle[0])
                assert f is not None
                bundle = f.read()
    assert bundle, "the image has no CA bundle"
    if HOST_CA_BUNDLE.is_file() and HOST_CA_BUNDLE.read_bytes() != bundle:
        return  # differs from this machine's: nothing leaked
    skips.skip(skips.SAME_CA_BUNDLE)
