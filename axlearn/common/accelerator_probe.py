"""Quiet start-up on machines without the accelerator a library probes for.

On a machine without a TPU, JAX's TPU plugin (libtpu, installed with `jax[tpu]`) still starts
at the first device query: it asks a GCE metadata server for the TPU type and worker hostnames,
finds none, and logs `E... unexpected worker hostname 'WARNING: could not determine TPU worker
hostnames ...'` and `Failed to find host bounds` lines. TensorFlow (the input pipelines) logs
`E... failed call to cuInit` on a machine without a GPU driver. Neither is a failure of the
command, but both look like one. `quiet_accelerator_probes` sets the environment that keeps them
quiet; it changes nothing on a machine that has the accelerator (or when the user set the
variables). `axlearn aot`, `eval`, `generate`, `hf export`/`import` and CPU/GPU training runs
call it before JAX touches a device.
"""

from __future__ import annotations

import glob
import os


def has_tpu_device() -> bool:
    """Whether this machine has a TPU device (`/dev/accel*` or `/dev/vfio`).

    Returns:
        True on a TPU VM.
    """
    return bool(glob.glob("/dev/accel*")) or os.path.exists("/dev/vfio")


def has_gpu_device() -> bool:
    """Whether this machine has an NVIDIA GPU device node (`/dev/nvidia0`, ...).

    Returns:
        True where a GPU driver is loaded.
    """
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def quiet_accelerator_probes() -> None:
    """Sets the environment that keeps libtpu and TensorFlow from logging error-looking lines
    about accelerators this machine does not have (variables the user set are kept).

    Call before JAX initializes its backends and before TensorFlow is imported.
    """
    if not has_tpu_device():
        # libtpu refuses a second process on the machine unless this is set (2-process runs).
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        # No GCE metadata server to ask for the TPU type; these describe no topology (nothing
        # runs on a TPU here) and only keep libtpu from logging that it found none.
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("TPU_WORKER_ID", "0")
    if not has_gpu_device() and os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2") == "2":
        # TensorFlow's C++ log keeps fatal errors only (its errors reach Python anyway); a
        # user's 0 or 1 is kept.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
