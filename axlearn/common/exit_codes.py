"""Exit codes with a meaning that launchers act on.

This module imports nothing: the trainer's watchdog and the launchers both use it.
"""

# The trainer's watchdog exits with this code when no step finished for
# `crash_on_hang_timeout_seconds` (a hang). 75 is EX_TEMPFAIL of sysexits.h: "try again later";
# `axlearn local launch --max_restarts` restarts the job, as any failure.
HANG_EXIT_CODE = 75
