"""Process-level flags and setup shared by every launcher (trainer, evaluation, tools).

Import this module before anything touches JAX devices, then call `setup()` once flags are
parsed: it initializes `jax.distributed` for multi-process CPU/GPU runs (TPU discovers its peers
itself), checks the backend, and records `--data_dir` in the `DATA_DIR` environment variable.

Flags:
    --jax_backend: cpu, gpu or tpu (default: whatever JAX picks; TPU pods must pass tpu so that
        jax.distributed is initialized).
    --distributed_coordinator, --num_processes, --process_id: multi-process CPU/GPU runs. Each
        one left unset takes its value from the environment variable the launchers set
        (DISTRIBUTED_COORDINATOR, NUM_PROCESSES, PROCESS_ID; see
        `axlearn.cloud.common.process_env`), so a JobSet pod and `axlearn local launch` run the
        documented command unchanged.
    --initialization_timeout: seconds to wait for all processes to connect.
    --data_dir: the TFDS data directory, or FAKE to train on synthetic inputs.
    --jax_profiler_port: serve the JAX profiler on this port.
"""

from __future__ import annotations

import os

from absl import flags, logging

# Keep TensorFlow's C++ logging quiet (it is imported later by the input pipelines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402  (imported after the environment above is set)

from axlearn.cloud.common.process_env import distributed_flag_defaults  # noqa: E402
from axlearn.common import gpu_memory  # noqa: E402
from axlearn.common.utils_spmd import setup as setup_spmd  # noqa: E402

flags.DEFINE_string(
    "data_dir",
    None,
    "The TFDS data directory; if unset, the DATA_DIR environment variable or the inputs' own "
    "defaults are used. 'FAKE' replaces every data-reading input with FakeLmInput.",
)
flags.DEFINE_string(
    "jax_backend",
    None,
    "The XLA backend: cpu, gpu or tpu. If unset, JAX's default backend is used.",
)
flags.DEFINE_string(
    "distributed_coordinator",
    None,
    "host:port of process 0's coordinator for multi-process CPU/GPU runs (default: the "
    "DISTRIBUTED_COORDINATOR environment variable). Must be unset on TPU.",
)
flags.DEFINE_integer(
    "num_processes",
    None,
    "Total number of processes (CPU/GPU multi-process; default: the NUM_PROCESSES environment "
    "variable). Unset on TPU.",
)
flags.DEFINE_integer(
    "process_id",
    None,
    "This process's rank (CPU/GPU multi-process; default: the PROCESS_ID environment variable).",
)
flags.DEFINE_integer(
    "initialization_timeout",
    None,
    "Seconds to wait for all processes to join jax.distributed (default: JAX's).",
)
flags.DEFINE_integer("jax_profiler_port", None, "If set, serve the JAX profiler on this port.")

FLAGS = flags.FLAGS


def setup(flag_values: flags.FlagValues = FLAGS) -> None:
    """Sets up JAX for this process from the flags; call before touching devices.

    Args:
        flag_values: The parsed flags.

    Raises:
        RuntimeError: If the devices do not belong to the requested backend.
        ValueError: If NUM_PROCESSES or PROCESS_ID (used for an unset flag) is not an integer.
    """
    backend = flag_values.jax_backend
    # Before the GPU backend starts: the share of GPU memory JAX takes (see gpu_memory.py).
    gpu_memory.set_default_memory_fraction(backend)
    if backend != "tpu":
        # Unset distributed flags take the launcher's environment (JobSet pod, local launch).
        for name, value in distributed_flag_defaults().items():
            if flag_values[name].value is None and value is not None:
                flag_values[name].value = value
    if backend and not jax.config.jax_platforms:
        jax.config.update("jax_platforms", backend)
    setup_spmd(
        jax_backend=backend or "cpu",
        distributed_coordinator=flag_values.distributed_coordinator,
        num_processes=flag_values.num_processes,
        process_id=flag_values.process_id,
        initialization_timeout=flag_values.initialization_timeout,
    )
    if flag_values.jax_profiler_port is not None:
        jax.profiler.start_server(flag_values.jax_profiler_port)
    devices = jax.devices()
    logging.info(
        "Process %d/%d; devices: %d global, %d local (%s)",
        jax.process_index(),
        jax.process_count(),
        len(devices),
        jax.local_device_count(),
        devices[0].device_kind,
    )
    if backend and not all(d.platform == backend for d in devices):
        platforms = sorted({d.platform for d in devices})
        raise RuntimeError(f"--jax_backend={backend} but JAX's devices are {platforms}.")
    if flag_values.data_dir:
        os.environ["DATA_DIR"] = flag_values.data_dir
    logging.info("DATA_DIR=%s", os.environ.get("DATA_DIR"))
