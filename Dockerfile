# One image for every gpufrag component (extender, defrag, agent, device plugin, serve, whatif).
# Multi-stage: install the locked dependencies, then gpufrag itself without resolving anything,
# and copy only the installed environment into a slim runtime that runs as a non-root user.
# BASE is any image with Python 3.11 as `python3` (and its venv module). The default is fully
# qualified; pin it by digest (...python:3.11-slim@sha256:<digest>) where your build must be
# reproducible. The dev kit builds with a Debian base made on the machine instead
# (--build-arg BASE=oci-archive:..., devkit/image.py; docs/node.md): no registry needed.
ARG BASE=docker.io/library/python:3.11-slim
FROM ${BASE} AS build
WORKDIR /src
RUN python3 -m venv /opt/gpufrag
ENV PATH=/opt/gpufrag/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# Dependencies first, in a layer that changes only with the lock: every version pinned, every
# file's hash checked, wheels only. The lock is generated from pyproject.toml (its header says
# how); tests/packaging checks that it covers every runtime dependency.
COPY requirements/image.lock requirements/image.lock
RUN pip install --require-hashes --only-binary=:all: -r requirements/image.lock
COPY pyproject.toml README.md ./
COPY gpufrag ./gpufrag
COPY scheduler ./scheduler
COPY defrag ./defrag
COPY node ./node
COPY simulations ./simulations
COPY serving ./serving
# gpufrag itself: no dependency resolution (--no-deps) and the locked setuptools as its build
# backend (--no-build-isolation), so nothing outside the lock is fetched. setuptools is needed
# only to build; pip check then proves the lock satisfies every installed requirement.
RUN pip install --no-deps --no-build-isolation . \
    && pip uninstall --yes setuptools \
    && pip check

FROM ${BASE}
RUN useradd --system --uid 65532 --home-dir /nonexistent --shell /usr/sbin/nologin gpufrag
COPY --from=build /opt/gpufrag /opt/gpufrag
ENV PATH=/opt/gpufrag/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp \
    GPUFRAG_LOG_FORMAT=json
USER 65532:65532
ENTRYPOINT ["gpufrag"]
CMD ["--help"]
