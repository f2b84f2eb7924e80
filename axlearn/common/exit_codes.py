"""Exit codes with a meaning that launchers act on.

This module imports nothing: the trainer's watchdog, the trainer's launcher
(`launch_trainer_main`) and the local launcher (`axlearn local launch`) all use it.

Two kinds of failure:
- transient (worth a restart from the last committed checkpoint): a hang, a preemption, a crash,
  a killed process; any code not listed below;
- deterministic (the same on every attempt: retrying wastes the restarts): a mistake in the
  command line, in the config, in the input or checkpoint data, or a trainer dir held by another
  run. `launch_trainer_main` exits with one of `DETERMINISTIC_EXIT_CODES` after its one line, and
  `axlearn local launch --max_restarts` exits at once with it instead of restarting.

The values are those of sysexits.h, so a scheduler that knows them reads them the same way.
"""

# The trainer's watchdog exits with this code when no step finished for
# `crash_on_hang_timeout_seconds` (a hang). 75 is EX_TEMPFAIL of sysexits.h: "try again later";
# `axlearn local launch --max_restarts` restarts the job, as any transient failure.
HANG_EXIT_CODE = 75
# A trainer stopped by a preemption notice (SIGTERM) after saving its step (the same
# EX_TEMPFAIL: a restart resumes from the saved step). `preemption.PREEMPTED_EXIT_CODE`.
PREEMPTED_EXIT_CODE = 75
# EX_USAGE: the command line is wrong (an unknown flag, experiment or config name, a trainer dir
# that is a file, a missing required flag).
USAGE_ERROR_EXIT_CODE = 64
# EX_DATAERR: the input or checkpoint data does not fit the run (a damaged checkpoint, a model or
# input state that does not match it, a step that does not exist).
DATA_ERROR_EXIT_CODE = 65
# EX_CANTCREAT: the trainer dir (or its checkpoint dir) is held by another live run.
BUSY_EXIT_CODE = 73
# EX_CONFIG: the config is refused (a bad --config_override, a value out of range, a config its
# modules reject, a mesh selector matching no rule, a step that does not fit in memory).
CONFIG_ERROR_EXIT_CODE = 78
# The codes that mean "the same on every attempt: do not retry".
DETERMINISTIC_EXIT_CODES = frozenset(
    {USAGE_ERROR_EXIT_CODE, DATA_ERROR_EXIT_CODE, BUSY_EXIT_CODE, CONFIG_ERROR_EXIT_CODE}
)
# What each deterministic code means, for the launcher's one line.
EXIT_CODE_MEANINGS = {
    USAGE_ERROR_EXIT_CODE: "a usage error",
    DATA_ERROR_EXIT_CODE: "an input or checkpoint data error",
    BUSY_EXIT_CODE: "the trainer dir is held by another run",
    CONFIG_ERROR_EXIT_CODE: "a config error",
}
