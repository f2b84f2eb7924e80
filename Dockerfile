# axlearn images. Three targets:
#
#   docker build --target cpu -t axlearn-cpu .   # the CPU test image (also the default: last stage)
#   docker build --target tpu -t axlearn-tpu .   # what `axlearn gcp launch` runs on TPU slices
#   docker build --target gpu -t axlearn-gpu .   # what it runs on GPU nodes (jax[cuda12])
#
#   docker run --rm axlearn-cpu                  # the whole test suite (pytest -n 2)
#   docker run --rm axlearn-cpu axlearn config list --module=text.gpt.tiny
#
# `axlearn gcp launch` builds the tpu or gpu target (its bundlers pass --target from the instance
# type and --build-arg GIT_COMMIT=<commit>; the image has no .git, so the run summary reads the
# commit from AXLEARN_GIT_COMMIT). See docs/launch.md.
#
# NOTE: docker cannot run on the machines this project is developed on, so this file is UNTESTED
# here. The cpu target mirrors .ci/run (which is tested): same Python, same
# `pip install -e '.[dev]'`, same test command. Keep the two in step.
FROM python:3.11-slim AS base

ARG GIT_COMMIT=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AXLEARN_GIT_COMMIT=${GIT_COMMIT}

# git: some test helpers and tools call it; build-essential is not needed (all wheels are binary).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# Dependencies are installed from pyproject.toml alone first, so they are cached as long as it is
# unchanged; the source is copied afterwards (see .dockerignore).
COPY pyproject.toml README.md ./
RUN mkdir -p axlearn && touch axlearn/__init__.py

# TPU: jax with libtpu, plus the cloud clients.
FROM base AS tpu
RUN pip install -e '.[tpu,gcp]'
COPY . .
RUN pip install --no-deps -e . && axlearn --help > /dev/null

# GPU: jax with CUDA 12 wheels, plus the cloud clients.
FROM base AS gpu
RUN pip install -e '.[gcp]' 'jax[cuda12]>=0.10.2,<0.11'
COPY . .
RUN pip install --no-deps -e . && axlearn --help > /dev/null

# CPU test image (the default target). The CPU wheel index keeps `torch==2.13.0` (a test-only
# dependency) from pulling several GB of CUDA libraries.
FROM base AS cpu
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -e '.[dev]'
COPY . .
RUN pip install --no-deps -e . && axlearn --help > /dev/null
CMD ["pytest", "-n", "2"]
