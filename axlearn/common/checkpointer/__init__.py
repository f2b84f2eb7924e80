"""Checkpoints: TensorStore storage with a commit marker, save policies, async saves, resume.

Layout: one directory per step, `<dir>/step_%08d/`, holding one zarr array per array leaf of
the state (named by its tree path, under `gda/`) and an `index` file written last as the commit
marker; the index lists every leaf's path, dtype, shape and per-chunk CRC-32 (JSON; no pickle).
See docs/checkpoints.md.

The implementation is split over this package's modules; every public name is re-exported here
and reports `axlearn.common.checkpointer` as its module, so config dumps show the public path
(e.g. 'axlearn.common.checkpointer.Checkpointer').
"""

from axlearn.common.checkpointer.base import (
    BaseCheckpointer,
    PythonSavable,
    async_save_tf_savables,
    check_state_structure,
    drop_learner_optimizer_cfg,
    drop_paths_filter,
    restore_tf_savables,
)
from axlearn.common.checkpointer.core import Checkpointer
from axlearn.common.checkpointer.faults import (
    FAULT_ACTION_ENV,
    FAULT_ENV,
    FAULT_POINTS,
    TRANSFER_FAULT_POINTS,
    InjectedFault,
)
from axlearn.common.checkpointer.layout import (
    CheckpointIndexError,
    build_step_dir,
    checkpoint_paths,
    is_committed,
    latest_checkpoint_path,
    latest_checkpoint_step,
    parse_step_from_dir,
    read_index_file,
    step_dir_name,
    step_dirs,
)
from axlearn.common.checkpointer.metadata import check_metadata, chunks_complete
from axlearn.common.checkpointer.multihost import BarrierTimeoutError
from axlearn.common.checkpointer.policies import (
    BestMetricPolicy,
    CheckpointPolicy,
    EvalMetric,
    every_n_steps_and_last_policy,
    every_n_steps_policy,
)
from axlearn.common.checkpointer.recovery import (
    RESTORE_FALLBACKS,
    CorruptCheckpointError,
    RestoreStepError,
    set_aside_dirs,
    supersede_newer,
)
from axlearn.common.checkpointer.storage import (
    SaveStats,
    StateStorage,
    TensorStoreStateStorage,
)
from axlearn.common.checkpointer.tensorstore_restore import (
    CheckpointCorruptionError,
    CheckpointValidationType,
    RestoreStats,
    StateMismatchError,
)
from axlearn.common.checkpointer.tensorstore_save import SaveResult
from axlearn.common.checkpointer.verify import (
    CheckpointInfo,
    VerifyResult,
    list_checkpoints,
    read_state_spec,
    verify_checkpoint,
)

__all__ = [
    "BaseCheckpointer",
    "EvalMetric",
    "PythonSavable",
    "async_save_tf_savables",
    "check_state_structure",
    "drop_learner_optimizer_cfg",
    "drop_paths_filter",
    "restore_tf_savables",
    "BarrierTimeoutError",
    "BestMetricPolicy",
    "CheckpointCorruptionError",
    "CheckpointIndexError",
    "CheckpointInfo",
    "CheckpointPolicy",
    "CheckpointValidationType",
    "check_metadata",
    "chunks_complete",
    "Checkpointer",
    "CorruptCheckpointError",
    "RestoreStepError",
    "FAULT_ACTION_ENV",
    "FAULT_ENV",
    "FAULT_POINTS",
    "RESTORE_FALLBACKS",
    "InjectedFault",
    "RestoreStats",
    "SaveResult",
    "SaveStats",
    "StateMismatchError",
    "StateStorage",
    "TensorStoreStateStorage",
    "TRANSFER_FAULT_POINTS",
    "VerifyResult",
    "build_step_dir",
    "checkpoint_paths",
    "every_n_steps_and_last_policy",
    "every_n_steps_policy",
    "is_committed",
    "latest_checkpoint_path",
    "latest_checkpoint_step",
    "list_checkpoints",
    "parse_step_from_dir",
    "read_index_file",
    "read_state_spec",
    "set_aside_dirs",
    "step_dir_name",
    "step_dirs",
    "supersede_newer",
    "verify_checkpoint",
]

for _name in __all__:
    _value = globals()[_name]
    if getattr(_value, "__module__", "").startswith(__name__ + "."):
        _value.__module__ = __name__
del _name, _value
