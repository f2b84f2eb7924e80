"""The row type of docs/reliability.md's table and the test files its rows name (shared by
tests/reliability_cases.py and tests/reliability_cases_more.py)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Case:
    """One row: the fault, what the user sees, what is lost, and the test that shows it."""

    fault: str
    user_sees: str
    lost: str
    test: str  # "path/to/test_file.py::test_name".


_CKPT = "tests/common/test_checkpointer.py"
_REC = "tests/common/test_checkpointer_recovery.py"
_VER = "tests/common/test_checkpointer_verify.py"
_PRE = "tests/common/test_preemption.py"
_TR = "tests/common/test_trainer.py"
_RES = "tests/common/test_trainer_resume.py"
_CFG = "tests/common/config/test_typecheck.py"
_RANGE = "tests/common/test_config_ranges.py"
_LAUNCH = "tests/common/test_launch_trainer.py"
_TFD = "tests/common/test_input_tf_data.py"
_META = "tests/common/test_checkpointer_metadata.py"
_MAIN = "tests/common/test_launch_trainer_main.py"
_RR = "tests/common/test_run_record.py"
_CONT = "tests/common/test_checkpointer_containment.py"
_PATHS = "tests/common/test_path_containment.py"
_HF = "tests/common/test_hf_checkpoint.py"
_GP = "tests/common/test_goodput.py"
_GPE = "tests/common/test_goodput_events.py"
_LL = "tests/cloud/common/test_local_launch.py"
_OWN = "tests/common/test_checkpointer_ownership.py"
_FA = "tests/common/test_file_access.py"
