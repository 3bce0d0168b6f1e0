"""The project's image, built on this machine with no registry and no daemon.

Two steps, each cached outside the repository under ``$GPUFRAG_CACHE_DIR/image`` (default
``~/.cache/gpufrag/image``) by a key made of everything it reads:

1. **The base**: a Debian root file system made by ``mmdebstrap`` from the machine's own apt
   sources (minbase + Python 3 + venv + CA certificates, documentation left out), wrapped as a
   one-layer OCI archive by :func:`write_oci_archive`. Key: suite, packages, dpkg options,
   mmdebstrap's version and the apt sources' text (which names the mirror snapshot). The
   Dockerfile's build stage gets a second base, the same plus gcc and Python's headers, to
   compile the C fragmentation kernel (``BUILD_BASE``); only the runtime base ships.
2. **The image**: the repository's ``Dockerfile``, built by ``buildah bud`` with chroot isolation
   and vfs storage (no daemon, no overlay-on-overlay), with ``--build-arg BASE=oci-archive:...``
   so the Dockerfile's ``FROM`` stays a normal image reference for everyone else. Python
   dependencies come from the package index through pip, exactly as the lock says. The result is
   pushed to an OCI archive that ``ctr images import`` (``devkit.node.Node.import_image``)
   reads. Key: both bases' keys, the variant's build arguments, the Dockerfile,
   ``.dockerignore``, the variant's lock and ONNX Runtime requirement, ``pyproject.toml``,
   ``setup.py``, ``README.md``,
   ``requirements/runtime.in`` and every file of the packages the Dockerfile copies.

Two variants of the one Dockerfile (:data:`VARIANTS`): the cluster image (default) and, with
``--gpu``, the GPU image: the same base and code with ``requirements/image-gpu.lock``
(onnxruntime-gpu and NVIDIA's CUDA and cuDNN wheels, GBs: CI does not build it) in place of
the cluster lock; no CUDA base image from a registry either way.

A third image, for diagnosis only (:func:`build_profiler_image`, ``--profiler``): the same
Debian base with the sampling profiler py-spy, the one static binary of its wheel, downloaded
by pip exactly as ``requirements/profiler.lock`` says (version and hashes) and added as a second
layer by :func:`write_oci_archive`: no buildah, no Dockerfile, nothing compiled. It runs as an
ephemeral container beside a gpufrag process (``kubectl debug --target``; docs/operations.md
"Diagnose a live process") and is never part of a workload. Key: the base's key and the lock.

buildah's storage is private to one build (a temporary directory, removed after): vfs copies
the whole root file system per layer, and the cached archive is what later runs reuse. A warm
call costs hashing the inputs. ``python -m devkit.image`` builds (or finds) it and prints the
archive's path, with ``--json`` its figures.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Final

from devkit.cachelock import exclusive
from devkit.procs import ControlPlaneError

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
IMAGE_NAME: Final = "gpufrag.local/gpufrag"
GPU_IMAGE_NAME: Final = "gpufrag.local/gpufrag-gpu"
PROFILER_IMAGE_NAME: Final = "gpufrag.local/gpufrag-profiler"
PROFILER_LOCK: Final = "requirements/profiler.lock"
# py-spy's Linux x86-64 wheel (tagged manylinux_2_5): a static-pie binary, so any base runs it.
PROFILER_PLATFORM: Final = "manylinux_2_5_x86_64"
PROFILER_BINARY: Final = "usr/local/bin/py-spy"  # on the base's PATH
BASE_NAME: Final = "gpufrag.local/debian-base"
BASE_SUITE: Final = "bookworm"
# python3-venv: ensurepip, which the Dockerfile's `python3 -m venv` needs on Debian.
BASE_PACKAGES: Final = ("python3", "python3-venv", "ca-certificates")
# The Dockerfile's build stage (BUILD_BASE) also compiles the C fragmentation kernel
# (setup.py): the same base with a C compiler and Python's headers. Never in the final image.
BUILD_BASE_PACKAGES: Final = (*BASE_PACKAGES, "gcc", "libc6-dev", "python3-dev")
# Documentation and translations are dead weight in an image (Debian's own slim images drop
# them the same way); copyright files stay.
BASE_DPKG_OPTIONS: Final = ("path-exclude=/usr/share/doc/*",
                             "path-include=/usr/share/doc/*/copyright",
                             "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*",
                             "path-exclude=/usr/share/locale/*")
APT_SOURCES: Final = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
# What the Dockerfile copies from the repository (its COPY lines) for every variant, for the
# cache key; each variant adds its lock and its ONNX Runtime requirement (Variant.inputs).
COMMON_INPUTS: Final = ("Dockerfile", ".dockerignore", "pyproject.toml", "setup.py", "README.md",
                        "requirements/runtime.in", "gpufrag", "scheduler", "defrag", "node",
                        "simulations", "serving")
HOST_CA_BUNDLE: Final = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_TIMEOUT_S: Final = 1800.0
KEEP_ARCHIVES: Final = 2  # per kind, newest first: the one in use and the one before it


class ImageBuildError(ControlPlaneError):
    """The base or the image could not be built; the message says which step and its output."""


@dataclass(frozen=True)
class Variant:
    """One image of the Dockerfile: the build arguments that choose its lock and its ONNX
    Runtime (the Dockerfile's ``ARG`` lines), and where its archives go in the cache."""

    name: str  # the Dockerfile's VARIANT, also its io.gpufrag.image.variant label
    image_name: str
    archive_prefix: str  # cache files: <prefix>-<key>.oci.tar
    lock: str
    onnxruntime_in: str

    @property
    def inputs(self) -> tuple[str, ...]:
        return (*COMMON_INPUTS, self.lock, self.onnxruntime_in)

    @property
    def build_args(self) -> tuple[str, ...]:
        return (f"VARIANT={self.name}", f"LOCK={self.lock}",
                f"ONNXRUNTIME_IN={self.onnxruntime_in}")


CLUSTER: Final = Variant("cluster", IMAGE_NAME, "gpufrag", "requirements/image.lock",
                         "requirements/onnxruntime-cpu.in")
GPU: Final = Variant("gpu", GPU_IMAGE_NAME, "gpu", "requirements/image-gpu.lock",
                     "requirements/gpu.in")
VARIANTS: Final = (CLUSTER, GPU)
# The cluster image's inputs, as the node tests and the key's test read them.
IMAGE_INPUTS: Final = CLUSTER.inputs


@dataclass(frozen=True)
class BuiltImage:
    """An OCI archive in the cache, and how it was obtained."""

    archive: Path
    ref: str
    key: str
    cold: bool  # built now (True) or found in the cache (False)
    seconds: float  # what this call took
    size_bytes: int  # the archive's size (uncompressed layers)


def gpufrag_cache_dir() -> Path:
    """``$GPUFRAG_CACHE_DIR``, default ``~/.cache/gpufrag``: the dev kit's caches."""
    return Path(os.environ.get("GPUFRAG_CACHE_DIR") or Path.home() / ".cache" / "gpufrag")


def cache_root() -> Path:
    return gpufrag_cache_dir() / "image"


def cached_image_refs() -> set[str]:
    """The references of the project images whose archives the cache keeps (the
    :data:`KEEP_ARCHIVES` newest): what a node's persistent image store keeps too."""
    return {f"{IMAGE_NAME}:{p.name.removeprefix('gpufrag-').removesuffix('.oci.tar')}"
            for p in cache_root().glob("gpufrag-*.oci.tar")}


# -- OCI archives ------------------------------------------------------------------------------

def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _add_blob(tar: tarfile.TarFile, data: bytes | Path, media_type: str) -> dict[str, Any]:
    """Add a content-addressed blob; a Path is streamed (a root file system can be large)."""
    if isinstance(data, Path):
        digest, size = _sha256_file(data), data.stat().st_size
        info = tarfile.TarInfo(f"blobs/sha256/{digest}")
        info.size, info.mode, info.mtime = size, 0o644, 0
        with data.open("rb") as f:
            tar.addfile(info, f)
    else:
        digest, size = hashlib.sha256(data).hexdigest(), len(data)
        _add_bytes(tar, f"blobs/sha256/{digest}", data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": size}


def _sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_oci_archive(path: Path, ref: str, layers: Sequence[bytes | Path],
                      image_config: dict[str, Any]) -> Path:
    """An OCI image layout in a tar (what ``ctr images import`` and buildah's ``oci-archive:``
    read) with uncompressed ``layers`` (tar bytes or tar files) and ``image_config`` as the
    image's ``config`` (Cmd, Env, ...). Deterministic: same inputs, same bytes."""
    diff_ids = ["sha256:" + (_sha256_file(layer) if isinstance(layer, Path)
                             else hashlib.sha256(layer).hexdigest()) for layer in layers]
    config = {"architecture": "amd64", "os": "linux", "config": image_config,
              "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        layer_descs = [_add_blob(tar, layer, "application/vnd.oci.image.layer.v1.tar")
                       for layer in layers]
        config_desc = _add_blob(tar, json.dumps(config, sort_keys=True).encode(),
                                "application/vnd.oci.image.config.v1+json")
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": config_desc, "layers": layer_descs}
        manifest_desc = _add_blob(tar, json.dumps(manifest, sort_keys=True).encode(),
                                  "application/vnd.oci.image.manifest.v1+json")
        manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
        manifest_desc["annotations"] = {"io.containerd.image.name": ref,
                                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]}
        _add_bytes(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add_bytes(tar, "index.json", json.dumps(
            {"schemaVersion": 2, "manifests": [manifest_desc]}, sort_keys=True).encode())
    tmp.replace(path)
    return path


# -- cache keys ----------------------------------------------------------------------------------

def _hash_files(h: Any, root: Path, names: Iterable[str]) -> None:
    for name in names:
        top = root / name
        files = [top] if top.is_file() else sorted(
            p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            and p.suffix != ".pyc")
        if not files:
            raise ImageBuildError(f"image input {top} is missing (run from a source checkout)")
        for f in files:
            h.update(str(f.relative_to(root)).encode() + b"\0")
            h.update(f.read_bytes() + b"\0")


def apt_sources() -> Path:
    for path in APT_SOURCES:
        if path.is_file() and path.read_text().strip():
            return path
    raise ImageBuildError("no apt sources on this machine (looked for "
                          f"{', '.join(map(str, APT_SOURCES))}); mmdebstrap needs a Debian mirror")


def _tool_version(argv: Sequence[str]) -> str:
    tool = shutil.which(argv[0])
    if tool is None:
        raise ImageBuildError(f"{argv[0]} is not installed; run scripts/install-node-deps")
    out = subprocess.run([tool, *argv[1:]], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).strip()


def base_key(packages: Sequence[str] = BASE_PACKAGES) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([BASE_SUITE, list(packages), BASE_DPKG_OPTIONS]).encode())
    h.update(_tool_version(["mmdebstrap", "--version"]).encode())
    h.update(apt_sources().read_bytes())
    return h.hexdigest()[:16]


def image_key(base: str, repo: Path = REPO_ROOT, variant: Variant = CLUSTER) -> str:
    h = hashlib.sha256(base.encode())
    h.update(_tool_version(["buildah", "--version"]).encode())
    h.update(json.dumps(variant.build_args).encode())
    _hash_files(h, repo, variant.inputs)
    return h.hexdigest()[:16]


# -- building ------------------------------------------------------------------------------------

def _run(step: str, argv: Sequence[str], *, log: IO[str], cwd: Path | None = None,
         env: dict[str, str] | None = None, timeout_s: float = BUILD_TIMEOUT_S) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    try:
        result = subprocess.run(list(argv), cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ImageBuildError(f"{step}: did not finish in {timeout_s:.0f}s; log: {log.name}") \
            from None
    if result.returncode != 0:
        log.flush()
        tail = Path(log.name).read_text(errors="replace").splitlines()[-40:]
        raise ImageBuildError(f"{step} failed (exit {result.returncode}); last lines of "
                              f"{log.name}:\n" + "\n".join(tail))


def _prune(directory: Path, pattern: str, keep: Path) -> None:
    """Keep the newest KEEP_ARCHIVES archives of one kind (always ``keep``)."""
    old = sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in [p for p in old if p != keep][KEEP_ARCHIVES - 1:]:
        path.unlink(missing_ok=True)


def _found(archive: Path, ref: str, key: str, started: float) -> BuiltImage | None:
    if not archive.is_file():
        return None
    archive.touch()  # newest-used first when pruning
    return BuiltImage(archive, ref, key, False, time.monotonic() - started,
                      archive.stat().st_size)


def _cached_or_built(root: Path, prefix: str, ref: str, key: str, started: float,
                     build: Callable[[Path], BuiltImage]) -> BuiltImage:
    """The archive ``<prefix>-<key>.oci.tar`` under ``root`` when it is there; else ``build``
    makes it, one builder per entry (a second caller waits on the entry's lock, then finds
    what the first made)."""
    archive = root / f"{prefix}-{key}.oci.tar"
    found = _found(archive, ref, key, started)
    if found is not None:
        return found
    with exclusive(root / f"{prefix}-{key}.lock"):
        found = _found(archive, ref, key, started)  # made while this caller waited
        if found is not None:
            return found
        return build(archive)


def build_base(packages: Sequence[str] = BASE_PACKAGES, prefix: str = "base") -> BuiltImage:
    """The Debian base with ``packages`` as an OCI archive (cached by :func:`base_key`, as
    ``<prefix>-<key>.oci.tar``): the runtime base by default, the build stage's with
    :func:`build_build_base`."""
    started = time.monotonic()
    key = base_key(packages)
    root = cache_root()
    ref = f"{BASE_NAME}:{key}"

    def build(archive: Path) -> BuiltImage:
        with tempfile.TemporaryDirectory(prefix=f"gpufrag-{prefix}-", dir=root) as tmp, \
                (root / f"{prefix}-{key}.log").open("w") as out:
            rootfs = Path(tmp) / "rootfs.tar"
            _run("mmdebstrap", ["mmdebstrap", "--variant=minbase", "--format=tar",
                                f"--include={','.join(packages)}",
                                *(f"--dpkgopt={o}" for o in BASE_DPKG_OPTIONS),
                                BASE_SUITE, str(rootfs), str(apt_sources())], log=out)
            write_oci_archive(archive, ref, [rootfs], {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Cmd": ["/bin/sh"]})
        _prune(root, f"{prefix}-*.oci.tar", archive)
        return BuiltImage(archive, ref, key, True, time.monotonic() - started,
                          archive.stat().st_size)

    return _cached_or_built(root, prefix, ref, key, started, build)


def build_build_base() -> BuiltImage:
    """The Dockerfile's build stage base (``BUILD_BASE``): the Debian base with a C compiler
    and Python's headers, for the C fragmentation kernel."""
    return build_base(BUILD_BASE_PACKAGES, "build-base")


def build_image(repo: Path = REPO_ROOT, variant: Variant = CLUSTER) -> BuiltImage:
    """The project's image (``variant``, default the cluster image) as an OCI archive (cached
    by :func:`image_key`); builds the base first when its cache is cold. ``seconds`` covers
    both."""
    started = time.monotonic()
    base = build_base()
    build = build_build_base()
    key = image_key(f"{base.key}:{build.key}", repo, variant)
    ref = f"{variant.image_name}:{key}"
    return _cached_or_built(
        cache_root(), variant.archive_prefix, ref, key, started,
        lambda archive: _buildah(repo, variant, base, build, archive, ref, key, started))


def _buildah(repo: Path, variant: Variant, base: BuiltImage, build: BuiltImage, archive: Path,
             ref: str, key: str, started: float) -> BuiltImage:
    """Build ``variant`` from the Dockerfile with buildah into ``archive`` (the caller holds
    its lock)."""
    root = archive.parent
    with tempfile.TemporaryDirectory(prefix="gpufrag-buildah-", dir=root) as tmp, \
            (root / f"{variant.archive_prefix}-{key}.log").open("w") as out:
        storage = ["--storage-driver=vfs", f"--root={Path(tmp) / 'root'}",
                   f"--runroot={Path(tmp) / 'run'}"]
        env = {**os.environ, "BUILDAH_ISOLATION": "chroot", "TMPDIR": tmp}
        try:
            _run("buildah bud", ["buildah", *storage, "bud", "--isolation=chroot",
                                 "--layers=false", "--pull-never", "--format=oci",
                                 f"--build-arg=BASE=oci-archive:{base.archive}",
                                 f"--build-arg=BUILD_BASE=oci-archive:{build.archive}",
                                 *(f"--build-arg={arg}" for arg in variant.build_args),
                                 *_trust_volume(),
                                 "--timestamp=0", f"--tag={ref}", "--file=Dockerfile", "."],
                 log=out, cwd=repo, env=env)
            _run("buildah push", ["buildah", *storage, "push", ref,
                                  f"oci-archive:{archive}.tmp:{ref}"], log=out, env=env)
        finally:
            # vfs leaves root-owned copies of every layer; remove them with the directory.
            subprocess.run(["buildah", *storage, "rmi", "--all", "--force"], env=env,
                           capture_output=True, check=False)
        Path(f"{archive}.tmp").replace(archive)
    _prune(root, f"{variant.archive_prefix}-*.oci.tar", archive)
    return BuiltImage(archive, ref, key, True, time.monotonic() - started,
                      archive.stat().st_size)


def profiler_key(base: str, repo: Path = REPO_ROOT) -> str:
    h = hashlib.sha256(f"profiler:{base}:{PROFILER_PLATFORM}:{PROFILER_BINARY}".encode())
    _hash_files(h, repo, [PROFILER_LOCK])
    return h.hexdigest()[:16]


def build_profiler_image(repo: Path = REPO_ROOT) -> BuiltImage:
    """The profiler image (module docstring) as an OCI archive, cached by
    :func:`profiler_key`: the base's layer as it is, and a layer with py-spy's binary taken
    from the wheel pip downloaded with ``--require-hashes`` (a wheel whose hash is not in the
    lock fails the build). The image's user is the base's (root); a pod's own ``runAsUser``
    applies to an ephemeral container too, which suits py-spy: the same uid as its target."""
    started = time.monotonic()
    base = build_base()
    key = profiler_key(base.key, repo)
    root = cache_root()
    ref = f"{PROFILER_IMAGE_NAME}:{key}"

    def build(archive: Path) -> BuiltImage:
        with tempfile.TemporaryDirectory(prefix="gpufrag-profiler-", dir=root) as tmp, \
                (root / f"profiler-{key}.log").open("w") as out:
            wheels = Path(tmp) / "wheels"
            _run("pip download", [sys.executable, "-m", "pip", "download", "--require-hashes",
                                  "--no-deps", "--only-binary=:all:",
                                  f"--platform={PROFILER_PLATFORM}", f"--dest={wheels}",
                                  "--disable-pip-version-check", "-r", str(repo / PROFILER_LOCK)],
                 log=out)
            base_layer = Path(tmp) / "base-layer.tar"
            with tarfile.open(base.archive) as outer, base_layer.open("wb") as f:
                (layer,) = _manifest(outer)["layers"]
                shutil.copyfileobj(_member(outer, _blob_name(layer["digest"])), f)
            with tarfile.open(base.archive) as outer:
                config = json.load(_member(outer, _blob_name(_manifest(outer)["config"]["digest"])))
            write_oci_archive(archive, ref, [base_layer, _py_spy_layer(wheels)], {
                **config["config"],
                "Labels": {"org.opencontainers.image.title": "gpufrag-profiler",
                           "org.opencontainers.image.description":
                               "py-spy beside a gpufrag process (kubectl debug --target)"}})
        _prune(root, "profiler-*.oci.tar", archive)
        return BuiltImage(archive, ref, key, True, time.monotonic() - started,
                          archive.stat().st_size)

    return _cached_or_built(root, "profiler", ref, key, started, build)


def _py_spy_layer(wheels: Path) -> bytes:
    """A layer with the py-spy binary of the one wheel in ``wheels`` at :data:`PROFILER_BINARY`."""
    found = sorted(wheels.glob("py_spy-*.whl"))
    if len(found) != 1:
        raise ImageBuildError(f"expected one py-spy wheel from {PROFILER_LOCK}, found "
                              f"{[p.name for p in found]}")
    with zipfile.ZipFile(found[0]) as wheel:
        names = [n for n in wheel.namelist() if n.endswith(".data/scripts/py-spy")]
        if len(names) != 1:
            raise ImageBuildError(f"{found[0].name} has no py-spy binary under *.data/scripts")
        binary = wheel.read(names[0])
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, PROFILER_BINARY, binary, 0o755)
    return buffer.getvalue()


def _manifest(tar: tarfile.TarFile) -> dict[str, Any]:
    """The image manifest of a one-image OCI archive."""
    index = json.load(_member(tar, "index.json"))
    manifest: dict[str, Any] = json.load(_member(tar, _blob_name(index["manifests"][0]["digest"])))
    return manifest


def unpacked_bytes(archive: Path) -> int:
    """What the image's files take once unpacked (a node's store, ``du`` of the root file
    system): the sizes of the regular files in every layer, read from the archive's layers
    (buildah pushes them gzip-compressed, so the archive's own size is the download, not this).
    A file a later layer replaces is counted in both, as a store keeps both layers."""
    total = 0
    with tarfile.open(archive) as outer:
        for layer in _manifest(outer)["layers"]:
            with tarfile.open(fileobj=_member(outer, _blob_name(layer["digest"])),
                              mode="r|*") as inner:
                total += sum(m.size for m in inner if m.isfile())
    return total


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    f = tar.extractfile(name)
    if f is None:
        raise ImageBuildError(f"{name} is not a file in the image archive")
    return f


def _blob_name(digest: str) -> str:
    return f"blobs/sha256/{digest.split(':', 1)[1]}"


def _trust_volume() -> list[str]:
    """This machine's CA bundle over the base's, for the build's RUN steps only (never in the
    image): where TLS to the package index is intercepted by a local CA, pip (Debian's, which
    reads the system bundle) trusts what this machine trusts."""
    return [f"--volume={HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if HOST_CA_BUNDLE.is_file() else []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.image",
        description="Build (or find in the cache) gpufrag's image as an OCI archive, without a "
                    "registry or a daemon: mmdebstrap base + buildah (see docs/node.md).")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--gpu", action="store_true",
                        help="the GPU image: onnxruntime-gpu with NVIDIA's CUDA and cuDNN wheels "
                             "(requirements/image-gpu.lock; several GB to download and build)")
    parser.add_argument("--profiler", action="store_true",
                        help="the profiler image: the base with py-spy (requirements/"
                             "profiler.lock), for kubectl debug (docs/operations.md)")
    args = parser.parse_args(argv)
    if args.gpu and args.profiler:
        parser.error("--gpu and --profiler name two images: choose one")
    try:
        built = (build_profiler_image() if args.profiler
                 else build_image(variant=GPU if args.gpu else CLUSTER))
    except ImageBuildError as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**{k: str(v) if isinstance(v, Path) else v
                             for k, v in asdict(built).items()},
                          "unpacked_bytes": unpacked_bytes(built.archive)}))
    else:
        print(f"{'built' if built.cold else 'cached'} {built.ref} in {built.seconds:.1f}s, "
              f"{built.size_bytes / 2**20:.0f} MiB", file=sys.stderr)
        print(built.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
