# syntax=docker/dockerfile:1
# The webhook image: a virtualenv built in one stage, copied alone into a clean runtime
# stage (no compiler, no pip cache, no source tree), run as a numeric non-root user so
# that `runAsNonRoot` can verify it.
#
# BASE is the image both stages start from: any with Python 3.11+ and its venv module
# at `python` (the public python image by default; the test suite builds one from
# Debian's packages, tests/e2e/imagekit.py).
ARG BASE=python:3.11-slim

FROM ${BASE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The venv lives at the path it will have in the final image: its scripts hold it.
RUN python -m venv /opt/gpu-webhook
# The dependencies first, read from pyproject.toml alone: their layer is rebuilt only when
# the pins change, not on every change to the code.
COPY pyproject.toml ./
RUN /opt/gpu-webhook/bin/python -c "import tomllib; \
print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && /opt/gpu-webhook/bin/pip install --no-cache-dir -r /tmp/requirements.txt
COPY README.md ./
COPY webhook ./webhook
RUN /opt/gpu-webhook/bin/pip install --no-cache-dir --no-deps . \
    && /opt/gpu-webhook/bin/pip check \
    && /opt/gpu-webhook/bin/gpu-webhook --version

FROM ${BASE}
ENV PATH=/opt/gpu-webhook/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=builder /opt/gpu-webhook /opt/gpu-webhook
# 65532: the conventional "nonroot" id; no entry in /etc/passwd is needed.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8443
ENTRYPOINT ["gpu-webhook", "serve"]
