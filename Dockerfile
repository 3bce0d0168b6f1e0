# One image for every gpufrag component (extender, defrag, agent, device plugin, serve, whatif),
# in two variants from this one recipe: the cluster image (default) and the GPU image, whose ONNX
# Runtime is onnxruntime-gpu with NVIDIA's CUDA wheels (python -m devkit.image --gpu, or
# --build-arg VARIANT=gpu --build-arg LOCK=requirements/image-gpu.lock
# --build-arg ONNXRUNTIME_IN=requirements/gpu.in).
# Multi-stage: install the locked dependencies, then gpufrag itself without resolving anything,
# and copy only the installed environment into a slim runtime that runs as a non-root user.
# BASE is any image with Python 3.11 as `python3` (and its venv module). The default is fully
# qualified; pin it by digest (...python:3.11-slim@sha256:<digest>) where your build must be
# reproducible. The dev kit builds with a Debian base made on the machine instead
# (--build-arg BASE=oci-archive:..., devkit/image.py; docs/node.md): no registry needed.
ARG BASE=docker.io/library/python:3.11-slim
# The build stage also compiles the C fragmentation kernel (setup.py), so it needs a C compiler
# and Python's headers: the full image of the same Python (the dev kit: the Debian base with
# gcc and python3-dev). Only the installed environment reaches the final image.
ARG BUILD_BASE=docker.io/library/python:3.11
FROM ${BUILD_BASE} AS build
ARG LOCK=requirements/image.lock
ARG ONNXRUNTIME_IN=requirements/onnxruntime-cpu.in
WORKDIR /src
RUN python3 -m venv /opt/gpufrag
ENV PATH=/opt/gpufrag/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# Dependencies first, in a layer that changes only with the lock: every version pinned, every
# file's hash checked, wheels only. The locks are generated from requirements/*.in (their
# headers say how); tests/packaging checks that they cover every runtime dependency.
COPY ${LOCK} requirements/image.lock
RUN pip install --require-hashes --only-binary=:all: -r requirements/image.lock
COPY pyproject.toml setup.py README.md ./
# gpufrag's requirements as this image holds them (pyproject.toml reads these four files):
# every component's, this variant's ONNX Runtime in onnxruntime-cpu.in's place, an empty
# plot.in: the what-if's plotting (matplotlib, ~90 MB) stays out of the images, where
# `gpufrag whatif` writes its tables and says the plots were skipped (gpufrag/plotting.py),
# and an empty jit.in: the image has the C fragmentation kernel, so no numba (~200 MB).
COPY requirements/runtime.in requirements/runtime.in
COPY ${ONNXRUNTIME_IN} requirements/onnxruntime-cpu.in
RUN : > requirements/plot.in && : > requirements/jit.in
COPY gpufrag ./gpufrag
COPY scheduler ./scheduler
COPY defrag ./defrag
COPY node ./node
COPY simulations ./simulations
COPY serving ./serving
# gpufrag itself: no dependency resolution (--no-deps) and the locked setuptools as its build
# backend (--no-build-isolation), so nothing outside the lock is fetched. setuptools is needed
# only to build; pip check then proves the lock satisfies every installed requirement. The C
# kernel is optional to setuptools (an install without a compiler succeeds) but not to the
# image, which has no numba to fall back on: the build fails unless it is the engine in use.
RUN pip install --no-deps --no-build-isolation . \
    && pip uninstall --yes setuptools \
    && pip check \
    && cd / && python3 -c "from scheduler.core import fragkernel; e = fragkernel.engine(); \
assert e == 'c', f'the C fragmentation kernel was not built (engine {e})'"

FROM ${BASE}
ARG VARIANT=cluster
ARG VERSION=0.1.0
# OCI annotations (the image spec's pre-defined keys). Release builds add the commit and time
# with --label org.opencontainers.image.revision=... / .created=...; the dev kit builds with
# --timestamp=0 and leaves them out, so equal inputs give an equal image.
LABEL org.opencontainers.image.title="gpufrag" \
      org.opencontainers.image.description="GPU-fragmentation-aware scheduling for Kubernetes inference clusters: FGD scheduler extender, defrag controller, node agent, device plugin, batching runtime (${VARIANT} image)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="gpufrag" \
      io.gpufrag.image.variant="${VARIANT}"
RUN useradd --system --uid 65532 --home-dir /nonexistent --shell /usr/sbin/nologin gpufrag
COPY --from=build /opt/gpufrag /opt/gpufrag
# The GPU image's CUDA libraries come as NVIDIA's wheels (site-packages/nvidia/*/lib), which
# ONNX Runtime's CUDA provider loads by name: the dynamic loader is told where they are. The
# driver's own libraries (libcuda, libnvidia-ml) come from the node through the NVIDIA
# container runtime. The cluster image has no such directory, and this step does nothing.
RUN set -e; for nvidia in /opt/gpufrag/lib/python3*/site-packages/nvidia; do \
      [ -d "$nvidia" ] || continue; \
      find "$nvidia" -mindepth 2 -maxdepth 2 -type d -name lib | sort \
        > /etc/ld.so.conf.d/gpufrag-nvidia.conf; \
      ldconfig; \
    done
ENV PATH=/opt/gpufrag/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GPUFRAG_LOG_FORMAT=json
USER 65532:65532
ENTRYPOINT ["gpufrag"]
CMD ["--help"]
