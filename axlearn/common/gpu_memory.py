"""The share of GPU memory JAX takes for training, set before the GPU backend starts.

JAX's GPU client reserves a fixed pool at start-up: 75% of each GPU's memory unless
`XLA_PYTHON_CLIENT_MEM_FRACTION` says otherwise, and every array and every step's temporaries
must fit in that pool. On an 80 GB H100 that leaves 20 GB that training can never use, which is
exactly the room a device snapshot of a checkpoint needs beside the train step (a 1B-parameter
model's fp32 state and Adam moments are 12.5 GB): with the 75% pool the first step after a
device snapshot fails with RESOURCE_EXHAUSTED, or the checkpointer must fall back to a host
snapshot that blocks training for seconds. So the launcher sets `DEFAULT_GPU_MEMORY_FRACTION`
when the user has not chosen a fraction; the rest (about 8 GB of 80 GB) stays outside the pool
for the CUDA context, cuDNN/cuBLAS workspaces and NCCL buffers, which JAX does not allocate from
it. When the user sets the variable, or takes over the allocator with
XLA_PYTHON_CLIENT_PREALLOCATE or XLA_PYTHON_CLIENT_ALLOCATOR, nothing is changed.

Example:

    from axlearn.common import gpu_memory
    gpu_memory.set_default_memory_fraction("gpu")  # Before the first jax.devices().
"""

from __future__ import annotations

import os
from typing import MutableMapping, Optional

from absl import logging

MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
# The pool share set when the user has not set MEM_FRACTION_ENV (see the module docstring).
DEFAULT_GPU_MEMORY_FRACTION = 0.9
# Variables by which a user takes control of the GPU allocator: we then set nothing.
_USER_ALLOCATOR_ENVS = (
    MEM_FRACTION_ENV,
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)


def set_default_memory_fraction(
    backend: Optional[str], environ: Optional[MutableMapping[str, str]] = None
) -> Optional[str]:
    """Sets XLA_PYTHON_CLIENT_MEM_FRACTION to the training default unless the user chose.

    Call before JAX's GPU backend starts (the first `jax.devices()`); only the GPU client reads
    the variable, so it is set for backend "gpu" or None (JAX picks) and left alone otherwise.

    Args:
        backend: The --jax_backend value ("cpu", "gpu", "tpu" or None).
        environ: The environment to change (default: os.environ).

    Returns:
        The value set, or None if nothing was set.
    """
    environ = os.environ if environ is None else environ
    if backend not in (None, "gpu"):
        return None
    if any(environ.get(name) for name in _USER_ALLOCATOR_ENVS):
        return None
    value = str(DEFAULT_GPU_MEMORY_FRACTION)
    environ[MEM_FRACTION_ENV] = value
    logging.info(
        "%s=%s (axlearn's training default; JAX's is 0.75): room for a device snapshot of the "
        "checkpoint beside the train step. Set the variable to choose another share.",
        MEM_FRACTION_ENV,
        value,
    )
    return value
