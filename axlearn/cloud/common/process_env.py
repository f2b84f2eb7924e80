"""The old public path of `axlearn.common.process_env`, which every public name is re-exported
from: the module moved to the bottom layer so that `axlearn.common` never imports `axlearn.cloud`.
"""

from axlearn.common.process_env import (  # noqa: F401 (public re-exports)
    COMPLETION_INDEX,
    COORDINATOR_ENV,
    DEFAULT_COORDINATOR_PORT,
    JOB_INDEX,
    LITERAL,
    MEGASCALE_PORT,
    NUM_PROCESSES_ENV,
    PROCESS_ID_ENV,
    EnvVar,
    distributed_env,
    distributed_flag_defaults,
    megascale_env,
    resolve_env,
)
