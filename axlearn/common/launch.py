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
        `axlearn.common.process_env`), so a JobSet pod and `axlearn local launch` run the
        documented command unchanged.
    --initialization_timeout: seconds to wait for all processes to connect.
    --data_dir: the TFDS data directory, or FAKE to train on synthetic inputs.
    --jax_profiler_port: serve the JAX profiler on this port.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from typing import Optional

from absl import flags, logging

# Keep TensorFlow's C++ logging quiet (it is imported later by the input pipelines).
_TF_LOG_LEVEL_FROM_USER = "TF_CPP_MIN_LOG_LEVEL" in os.environ
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402  (imported after the environment above is set)

from axlearn.common import gpu_memory  # noqa: E402
from axlearn.common.accelerator_probe import quiet_accelerator_probes  # noqa: E402
from axlearn.common.process_env import distributed_flag_defaults  # noqa: E402
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


class LaunchFlagError(ValueError):
    """A process flag names something this machine does not have (a backend, a data dir)."""


def check_data_dir(data_dir: str | None) -> None:
    """Refuses a local `--data_dir` that does not exist or is empty (it would be ignored).

    Args:
        data_dir: The flag's value (None, "FAKE", a remote "scheme://" path or a local path).

    Raises:
        LaunchFlagError: Naming the path and what to pass instead.
    """
    if not data_dir or data_dir == "FAKE" or "://" in data_dir:
        return
    fix = (
        "Pass a TFDS data dir that holds the experiment's data sets, --data_dir=FAKE for "
        "synthetic inputs, or leave the flag out to use the experiment's default data (the "
        "embedded data for the gpt-tiny configs)."
    )
    if not os.path.isdir(data_dir):
        raise LaunchFlagError(
            f"--data_dir={data_dir} does not exist (or is not a directory). {fix}"
        )
    if not os.listdir(data_dir):
        raise LaunchFlagError(f"--data_dir={data_dir} is an empty directory. {fix}")


def check_coordinator(
    coordinator: Optional[str],
    *,
    num_processes: Optional[int],
    process_id: Optional[int],
    initialization_timeout: Optional[int],
) -> None:
    """Before `jax.distributed` starts: process 0 checks that the coordinator port is free; the
    others say where they connect and how long they wait.

    A busy port would otherwise be a gRPC traceback on process 0 and, on the others, a wait
    without a word until `jax.distributed` aborts the process at its timeout.

    Args:
        coordinator: "host:port" of process 0's coordinator service (None: one process).
        num_processes: Processes of the run.
        process_id: This process's rank.
        initialization_timeout: Seconds the others wait (None: JAX's default).

    Raises:
        LaunchFlagError: On process 0, if the port is in use on this host.
    """
    if not coordinator or not num_processes or num_processes < 2 or process_id is None:
        return
    host, _, port_text = coordinator.rpartition(":")
    if not port_text.isdigit():
        raise LaunchFlagError(
            f"--distributed_coordinator={coordinator} is not host:port (e.g. 10.0.0.2:8476)."
        )
    port = int(port_text)
    if process_id == 0:
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise LaunchFlagError(
                    f"--distributed_coordinator={coordinator}: port {port} is already in use on "
                    "this host (another run or program holds it). Pass another free port to "
                    "every process of the run (`axlearn local launch` picks a free one when "
                    "--port is not given)."
                ) from e
        finally:
            probe.close()
        return
    timeout = (
        f"--initialization_timeout={initialization_timeout} s"
        if initialization_timeout
        else "jax.distributed's default timeout (--initialization_timeout)"
    )
    # An info line: every healthy multi-process start prints it (a W-line read as a problem).
    logging.info(
        "Process %d of %d: connecting to the coordinator at %s (process 0's). If process 0 did "
        "not start (see its log: e.g. a busy port), this process stops after %s.",
        process_id,
        num_processes,
        coordinator or host,
        timeout,
    )


def setup(flag_values: flags.FlagValues = FLAGS) -> None:
    """Sets up JAX for this process from the flags; call before touching devices.

    Args:
        flag_values: The parsed flags.

    Raises:
        LaunchFlagError: If the devices do not belong to the requested backend (or there is no
            TPU for --jax_backend=tpu), or --data_dir is a local path that does not exist or is
            empty.
        ValueError: If NUM_PROCESSES or PROCESS_ID (used for an unset flag) is not an integer.
    """
    backend = flag_values.jax_backend
    check_data_dir(flag_values.data_dir)
    if backend != "tpu":
        # No libtpu or cuInit E-lines on a CPU/GPU run (a TPU machine keeps its environment).
        quiet_accelerator_probes()
    if backend == "cpu" and not _TF_LOG_LEVEL_FROM_USER and "tensorflow" not in sys.modules:
        # TensorFlow (the input pipeline) logs "E... failed call to cuInit" at its first use on
        # every machine without a GPU driver: an error-looking line about a GPU the run never
        # uses. On CPU runs its C++ log keeps fatal errors only (its errors reach Python anyway).
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    # Before the GPU backend starts: the share of GPU memory JAX takes (see gpu_memory.py).
    gpu_memory.set_default_memory_fraction(backend)
    if backend != "tpu":
        # Unset distributed flags take the launcher's environment (JobSet pod, local launch).
        for name, value in distributed_flag_defaults().items():
            if flag_values[name].value is None and value is not None:
                flag_values[name].value = value
    if backend and not jax.config.jax_platforms:
        jax.config.update("jax_platforms", backend)
    if backend != "tpu":
        check_coordinator(
            flag_values.distributed_coordinator,
            num_processes=flag_values.num_processes,
            process_id=flag_values.process_id,
            initialization_timeout=flag_values.initialization_timeout,
        )
    try:
        setup_spmd(
            jax_backend=backend or "cpu",
            distributed_coordinator=flag_values.distributed_coordinator,
            num_processes=flag_values.num_processes,
            process_id=flag_values.process_id,
            initialization_timeout=flag_values.initialization_timeout,
        )
    except (ValueError, RuntimeError) as e:
        if backend == "tpu" and "coordinator_address" in str(e):
            # jax.distributed found no TPU metadata to discover its peers from.
            raise LaunchFlagError(
                "--jax_backend=tpu but this machine has no TPU (jax.distributed could not "
                "discover TPU peers). Run on a TPU VM, or pass --jax_backend=cpu (or gpu)."
            ) from e
        raise
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
        raise LaunchFlagError(
            f"--jax_backend={backend} but JAX's devices are {platforms}: pass "
            f"--jax_backend={platforms[0]} or run where {backend} devices are."
        )
    if flag_values.data_dir:
        os.environ["DATA_DIR"] = flag_values.data_dir
    logging.info("DATA_DIR=%s", os.environ.get("DATA_DIR"))
