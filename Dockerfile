# CPU image of axlearn that installs the package with its test dependencies and runs the tests.
#
#   docker build -t axlearn-cpu .
#   docker run --rm axlearn-cpu                       # the whole test suite (pytest -n 2)
#   docker run --rm axlearn-cpu axlearn config list --module=text.gpt.tiny
#
# NOTE: docker cannot run on the machines this project is developed on, so this file is UNTESTED
# here. It mirrors .ci/run (which is tested): same Python, same `pip install -e '.[dev]'`, same
# test command. Keep the two in step.
#
# Build args: JAX_EXTRA selects an accelerator build of jax, e.g. `--build-arg JAX_EXTRA=tpu` or
# `cuda12` (left empty: the CPU build).
FROM python:3.11-slim

ARG JAX_EXTRA=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# git: some test helpers and tools call it; build-essential is not needed (all wheels are binary).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# Install dependencies first (cached as long as pyproject.toml is unchanged). The CPU wheel index
# keeps `torch==2.13.0` (a test-only dependency) from pulling several GB of CUDA libraries.
COPY pyproject.toml README.md ./
RUN mkdir -p axlearn experiments && touch axlearn/__init__.py experiments/__init__.py \
    && pip install --extra-index-url https://download.pytorch.org/whl/cpu \
        -e '.[dev]' ${JAX_EXTRA:+"jax[$JAX_EXTRA]"}

# Then the source (see .dockerignore), re-registered as the editable install.
COPY . .
RUN pip install --no-deps -e . && axlearn --help > /dev/null

CMD ["pytest", "-n", "2"]
