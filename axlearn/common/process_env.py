"""The environment contract between a launcher and `launch_trainer_main`'s processes.

A multi-process CPU/GPU job tells each process how to join the run through three environment
variables, read by `axlearn.common.launch` as the defaults of its flags of the same meaning:

| Variable | Flag | Value |
| --- | --- | --- |
| `DISTRIBUTED_COORDINATOR` | `--distributed_coordinator` | `host:port` of process 0 |
| `NUM_PROCESSES` | `--num_processes` | the process count |
| `PROCESS_ID` | `--process_id` | this process's rank, the pod's job completion index |

TPU pods set none of them (JAX discovers TPU peers itself); a multi-slice TPU job sets the
`MEGASCALE_*` variables instead (coordinator, slice count, slice id = the pod's job index).

The contract is stated once, as a list of `EnvVar`s whose values are either literal or derived
from the pod's position in the JobSet (`COMPLETION_INDEX`: the pod's index within its Job;
`JOB_INDEX`: the Job's index within its replicated job, i.e. the slice). The JobSet builder
(`axlearn.cloud.gcp.jobset`) renders the derived ones as Kubernetes downward-API references, and
`axlearn local launch` (`axlearn.cloud.common.local_launch`) renders them as the numbers a process
at that position gets, so a local run exercises the pods' code path.

This module imports only the standard library. It lives in `axlearn.common` (which never imports
`axlearn.cloud`); its old path `axlearn.cloud.common.process_env` re-exports every public name.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Optional

COORDINATOR_ENV = "DISTRIBUTED_COORDINATOR"
NUM_PROCESSES_ENV = "NUM_PROCESSES"
PROCESS_ID_ENV = "PROCESS_ID"

# Where a variable's value comes from.
LITERAL = "literal"
COMPLETION_INDEX = "completion_index"  # The pod's index within its Job (0 .. hosts - 1).
JOB_INDEX = "job_index"  # The Job's index within its replicated job (the slice, 0 .. slices - 1).

# The port the JAX coordinator (process 0) listens on in a JobSet pod.
DEFAULT_COORDINATOR_PORT = 8476
# The port of the multi-slice (Megascale) coordinator on TPU.
MEGASCALE_PORT = 8080


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """One environment variable of a launched process.

    Attributes:
        name: The variable's name.
        value: The literal value (when `source` is LITERAL).
        source: LITERAL, COMPLETION_INDEX or JOB_INDEX.
    """

    name: str
    value: Optional[str] = None
    source: str = LITERAL

    def __post_init__(self):
        if self.source not in (LITERAL, COMPLETION_INDEX, JOB_INDEX):
            raise ValueError(f"EnvVar {self.name}: unknown source {self.source!r}.")
        if (self.source == LITERAL) != (self.value is not None):
            raise ValueError(f"EnvVar {self.name}: a literal needs a value, a derived one none.")

    def resolve(self, *, completion_index: int, job_index: int = 0) -> str:
        """Returns the value a process at this position gets.

        Args:
            completion_index: The process's index within its Job.
            job_index: Its Job's index within the replicated job.

        Returns:
            The value as a string.
        """
        if self.source == COMPLETION_INDEX:
            return str(completion_index)
        if self.source == JOB_INDEX:
            return str(job_index)
        return self.value


def distributed_env(*, coordinator: str, num_processes: int) -> list[EnvVar]:
    """Returns the variables that let a CPU/GPU process join a `jax.distributed` run.

    All processes of the run are the pods of one Job, so the rank is the completion index.

    Args:
        coordinator: `host:port` of process 0.
        num_processes: The process count.

    Returns:
        DISTRIBUTED_COORDINATOR, NUM_PROCESSES and PROCESS_ID.

    Raises:
        ValueError: If `num_processes` < 1 or `coordinator` is not host:port.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}.")
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator must be host:port, got {coordinator!r}.")
    return [
        EnvVar(COORDINATOR_ENV, coordinator),
        EnvVar(NUM_PROCESSES_ENV, str(num_processes)),
        EnvVar(PROCESS_ID_ENV, source=COMPLETION_INDEX),
    ]


def megascale_env(*, coordinator_host: str, num_slices: int) -> list[EnvVar]:
    """Returns the variables of a multi-slice TPU job (one Job per slice).

    Args:
        coordinator_host: Host name of slice 0's first host.
        num_slices: The slice count (> 1).

    Returns:
        MEGASCALE_COORDINATOR_ADDRESS, MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID, MEGASCALE_PORT.
    """
    return [
        EnvVar("MEGASCALE_COORDINATOR_ADDRESS", f"{coordinator_host}:{MEGASCALE_PORT}"),
        EnvVar("MEGASCALE_NUM_SLICES", str(num_slices)),
        EnvVar("MEGASCALE_SLICE_ID", source=JOB_INDEX),
        EnvVar("MEGASCALE_PORT", str(MEGASCALE_PORT)),
    ]


def resolve_env(
    env: Sequence[EnvVar], *, completion_index: int, job_index: int = 0
) -> dict[str, str]:
    """Returns the variables as the process at a position sees them.

    Args:
        env: The contract's variables.
        completion_index: The process's index within its Job.
        job_index: Its Job's index within the replicated job.

    Returns:
        name -> value.
    """
    return {v.name: v.resolve(completion_index=completion_index, job_index=job_index) for v in env}


def distributed_flag_defaults(environ: Optional[Mapping[str, str]] = None) -> dict:
    """Returns the defaults of launch's distributed flags from the environment.

    Args:
        environ: The environment (default: `os.environ`).

    Returns:
        {"distributed_coordinator": str|None, "num_processes": int|None, "process_id": int|None}.

    Raises:
        ValueError: If NUM_PROCESSES or PROCESS_ID is set but not an integer.
    """
    environ = os.environ if environ is None else environ

    def as_int(name: str) -> Optional[int]:
        value = environ.get(name)
        if value is None or value == "":
            return None
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"Environment variable {name}={value!r} is not an integer.") from None

    return {
        "distributed_coordinator": environ.get(COORDINATOR_ENV) or None,
        "num_processes": as_int(NUM_PROCESSES_ENV),
        "process_id": as_int(PROCESS_ID_ENV),
    }
