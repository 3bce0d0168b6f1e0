# One image for every gpufrag component (extender, defrag, agent, serve, whatif).
# Multi-stage: build a wheel with its dependencies, then copy only the installed environment
# into a slim runtime that runs as a non-root user.
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/gpufrag
ENV PATH=/opt/gpufrag/bin:$PATH
COPY pyproject.toml README.md ./
COPY gpufrag ./gpufrag
COPY scheduler ./scheduler
COPY defrag ./defrag
COPY simulations ./simulations
COPY serving ./serving
RUN pip install --no-cache-dir --upgrade pip && pip install --no-cache-dir .

FROM python:3.11-slim
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
