# syntax=docker/dockerfile:1
# The webhook image: a virtualenv built in one stage, copied alone into a clean runtime
# stage (no compiler, no pip cache, no source tree), run as a numeric non-root user so
# that `runAsNonRoot` can verify it.

FROM python:3.11-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The venv lives at the path it will have in the final image: its scripts hold it.
RUN python -m venv /opt/gpu-webhook
COPY pyproject.toml README.md ./
COPY webhook ./webhook
RUN /opt/gpu-webhook/bin/pip install --no-cache-dir . \
    && /opt/gpu-webhook/bin/gpu-webhook --version

FROM python:3.11-slim
ENV PATH=/opt/gpu-webhook/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=builder /opt/gpu-webhook /opt/gpu-webhook
# 65532: the conventional "nonroot" id; no entry in /etc/passwd is needed.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8443
ENTRYPOINT ["gpu-webhook", "serve"]
