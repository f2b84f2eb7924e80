"""The faults and bad inputs of docs/reliability.md, each with the test that produces its row.

`python -m tests.reliability_cases` prints the table; tests/test_reliability.py checks that the
docs page holds exactly this table and that every test named here exists (they all run in CI
with the rest of the suite, so each row is re-proven on every change).
"""

from __future__ import annotations

from tests.reliability_cases_base import (
    _CFG,
    _CKPT,
    _GP,
    _GPE,
    _LAUNCH,
    _LL,
    _MAIN,
    _META,
    _PRE,
    _RANGE,
    _REC,
    _RES,
    _RR,
    _TR,
    _VER,
    Case,
)
from tests.reliability_cases_more import MORE_CASES

CASES = [
    # Process death and preemption.
    Case(
        "SIGKILL at each save fault point, then restart",
        "restart resumes from the last committed step",
        "nothing (the in-flight step is redone)",
        "tests/common/test_checkpointer_crash.py::test_kill_at_fault_point_then_resume",
    ),
    Case(
        "crash at every checkpoint fault point in one run",
        "resume from the newest committed step",
        "nothing",
        "tests/common/test_checkpoint_crash_safety.py::test_one_crash_per_fault_point",
    ),
    Case(
        "20 crash trials at random fault points and steps",
        "final state bit-identical to an uninterrupted run",
        "nothing",
        "tests/common/test_checkpoint_crash_safety.py::test_crash_safety_20_trials",
    ),
    Case(
        "3 external SIGKILLs at random times on the GPT/tf.data main job, restarted each time",
        "final parameters, optimizer state and input position bit-identical to an "
        "uninterrupted run; every step's loss equal",
        "nothing (every step seen committed is kept)",
        "tests/common/test_random_sigkill.py::test_random_external_sigkills_on_the_gpt_job",
    ),
    Case(
        "save precondition fails (non-finite state)",
        "error at the next save; no file written",
        "nothing",
        "tests/common/test_checkpoint_crash_safety.py::test_failed_precondition_writes_nothing",
    ),
    Case(
        "SIGKILL mid-save, then the page cache dropped before the restart",
        "committed step verifies and restores from the device (skipped, with the reason, "
        "where dropping the cache is not permitted)",
        "nothing",
        "tests/common/test_checkpointer_durability.py::"
        "test_committed_step_restores_after_kill_and_page_cache_drop",
    ),
    Case(
        "SIGTERM (preemption notice) mid-run",
        "the step in flight is saved; exit code 75",
        "nothing",
        f"{_PRE}::test_trainer_saves_the_last_completed_step_and_resumes_from_it",
    ),
    Case(
        "SIGTERM at a step the policy already saves",
        "one save, exit 75, resume",
        "nothing",
        f"{_PRE}::test_preemption_at_a_step_the_policy_already_saves",
    ),
    Case(
        "SIGTERM sent by another process",
        "same as a preemption notice",
        "nothing",
        f"{_PRE}::test_sigterm_from_another_process",
    ),
    Case(
        "preemption while the save hangs",
        "exit 75 at the deadline; older step intact",
        "the hung step only",
        f"{_PRE}::test_deadline_when_the_save_hangs",
    ),
    Case(
        "preemption of a 2-process run",
        "both stop after the same step",
        "nothing",
        f"{_PRE}::test_two_processes_stop_after_the_same_step",
    ),
    Case(
        "launcher preempted, same command rerun",
        "exit 75, rerun resumes",
        "nothing",
        f"{_PRE}::test_launcher_exits_with_the_preempted_code_and_the_same_command_resumes",
    ),
    Case(
        "a peer process never reaches a checkpoint barrier",
        "BarrierTimeoutError naming the missing process",
        "nothing committed is touched",
        "tests/common/test_checkpointer_multiprocess.py::test_barrier_timeout_names_missing_process",
    ),
    # Damaged checkpoints.
    Case(
        "truncated step_N/index",
        "refuses to start: names the file, --restore_fallback and --restore_step",
        "nothing (no file deleted)",
        f"{_REC}::test_corrupt_newest_is_refused_and_nothing_deleted",
    ),
    Case(
        "a leaf's checksum field removed from the index",
        "same refusal; verify exits 1",
        "nothing",
        f"{_REC}::test_corrupt_newest_is_refused_and_nothing_deleted",
    ),
    Case(
        "one flipped bit in a chunk of the newest step",
        "same refusal (CRC mismatch names file and leaf)",
        "nothing",
        f"{_REC}::test_corrupt_newest_is_refused_and_nothing_deleted",
    ),
    Case(
        "corrupt newest step with --restore_fallback=previous",
        "step set aside as step_N.corrupt-<time>; older step restored",
        "nothing (moved, not deleted)",
        f"{_REC}::test_fallback_previous_sets_the_corrupt_step_aside",
    ),
    Case(
        "trainer on a corrupt index; --restore_step=N",
        "refusal, then resume from N; newer steps set aside once",
        "nothing",
        f"{_REC}::test_trainer_refuses_corrupt_index_and_restore_step_chooses",
    ),
    Case(
        "--restore_step of a step that is not committed",
        "error listing the committed steps",
        "nothing",
        f"{_REC}::test_trainer_refuses_corrupt_index_and_restore_step_chooses",
    ),
    Case(
        "`axlearn checkpoint select` of a damaged step",
        "exit 1, nothing changed",
        "nothing",
        f"{_REC}::test_cli_select_sets_newer_steps_aside",
    ),
    Case(
        "bad restore_fallback value",
        "ValueError naming the allowed values",
        "nothing",
        f"{_REC}::test_restore_fallback_value_is_checked",
    ),
    Case(
        "truncated chunk file",
        "CheckpointCorruptionError naming file and leaf",
        "nothing",
        f"{_CKPT}::test_truncated_chunk_names_file_and_leaf",
    ),
    Case(
        "altered chunk bytes",
        "CheckpointCorruptionError naming file and leaf",
        "nothing",
        f"{_CKPT}::test_altered_chunk_names_file_and_leaf",
    ),
    Case(
        "missing chunk and bytes files",
        "error naming each file",
        "nothing",
        f"{_CKPT}::test_missing_chunk_and_bytes_file",
    ),
    Case(
        "interrupted save (no index) plus a corrupt older index",
        "uncommitted skipped with a warning; corrupt refused",
        "nothing",
        f"{_CKPT}::test_uncommitted_skipped_with_warning_corrupt_index_refused",
    ),
    Case(
        "`axlearn checkpoint verify` on damaged files",
        "exit 1 listing each file and leaf",
        "nothing",
        f"{_VER}::test_verify_finds_corruption",
    ),
    Case(
        "an index that lost a leaf (verify used to say OK)",
        "verify exits 1 naming the array the index does not list; restore refuses it as corrupt",
        "nothing",
        f"{_META}::test_verify_reports_damaged_metadata",
    ),
    Case(
        "a `.zarray` deleted, garbage, or of another dtype or shape",
        "verify exits 1 naming the file; the trainer and generate refuse the step naming "
        "--restore_fallback; with it the step is set aside and the previous one restored",
        "nothing (moved, not deleted)",
        f"{_META}::test_restore_refuses_damaged_metadata_or_sets_it_aside",
    ),
    Case(
        "an index edited to another shape",
        "CorruptCheckpointError naming the `.zarray` that disagrees and --restore_fallback (not "
        "a model mismatch)",
        "nothing",
        f"{_META}::test_restore_refuses_damaged_metadata_or_sets_it_aside",
    ),
    Case(
        "an older step with a corrupt chunk, due for garbage collection",
        "GC verifies before removing: it sets the step aside as step_N.corrupt-<time> and logs "
        "why; the intact steps are unchanged and restore",
        "nothing (moved, not deleted)",
        f"{_META}::test_gc_sets_a_step_that_fails_verification_aside",
    ),
    Case(
        "only the index of the newest step deleted, every chunk intact",
        "verify exits 1 saying so; the run resumes from the step before and sets the step aside "
        "as step_N.unindexed-<time> (the next save of that step cannot delete it)",
        "nothing (moved, not deleted)",
        f"{_META}::test_lost_index_with_intact_chunks_is_set_aside_never_deleted",
    ),
    Case(
        "every step corrupt, with --restore_fallback=previous",
        "error naming the steps set aside; training from step 0 needs them moved out first",
        "nothing (moved, not deleted)",
        f"{_META}::test_fallback_with_nothing_left_is_an_error_naming_what_was_set_aside",
    ),
    Case(
        "`axlearn checkpoint verify|list` of a trainer dir",
        "exit 1 pointing to its checkpoints/ directory",
        "nothing",
        f"{_VER}::test_cli_on_a_trainer_dir_points_to_its_checkpoints",
    ),
    Case(
        "`axlearn checkpoint select` that sets steps aside",
        "the set-aside steps logged as info, not ERROR lines",
        "nothing",
        f"{_REC}::test_select_logs_no_error_for_the_steps_it_sets_aside",
    ),
    Case(
        "restoring into a model with another parameter shape",
        "StateMismatchError naming the parameter",
        "nothing",
        f"{_CKPT}::test_mismatch_names_parameter",
    ),
    Case(
        "restore of a trainer checkpoint without the model (read_state_spec)",
        "restores every leaf incl. input_iter",
        "nothing",
        f"{_VER}::test_read_state_spec_restores_a_trainer_checkpoint",
    ),
    Case(
        "saving a step that is already committed",
        "skipped; the committed step is never rewritten",
        "nothing",
        f"{_CKPT}::test_committed_step_is_never_rewritten",
    ),
    Case(
        "an async save fails in the background",
        "its error is raised by the next call",
        "nothing committed",
        f"{_CKPT}::test_async_error_is_raised_on_next_call",
    ),
    # The run's record.
    Case(
        "rerun of a finished run that fails at restore (another model), has nothing to do "
        "(another learning rate at max_step) or is rejected (an out-of-range value)",
        "trainer_config and launch_trainer_flags unchanged; a rerun that trains adds "
        "run_records/<n> and keeps the earlier records",
        "nothing",
        f"{_RR}::test_a_rerun_that_does_not_train_leaves_the_record",
    ),
    Case(
        "`axlearn generate`/`eval` of a step saved before a start with another config",
        "the model of the record that step was made with",
        "nothing",
        f"{_RR}::test_config_of_a_step_comes_from_its_record",
    ),
    Case(
        "disk full while appending to metrics.jsonl; a torn tail left by a killed process",
        "OSError naming the file, no half line; the resumed run cuts a torn tail with a "
        "warning; compare skips a torn line with a note",
        "nothing (the failed step is redone and logged by the resumed run)",
        "tests/common/test_summary_writer.py::"
        "test_jsonl_full_disk_leaves_whole_lines_and_a_torn_tail_is_cut",
    ),
    # Concurrent runs.
    Case(
        "two trainers on one trainer dir",
        "the second fails at once naming host, pid, start time",
        "nothing",
        "tests/common/test_run_lock.py::test_two_trainers_on_one_dir",
    ),
    Case(
        "the lock owner was SIGKILLed",
        "the next run takes the stale lock over",
        "nothing",
        "tests/common/test_run_lock.py::test_lock_of_a_killed_owner_is_stale",
    ),
    # Runs that go bad.
    Case(
        "NaN loss with a learner that does not skip",
        "NonFiniteLossError; that state never saved",
        "nothing committed",
        f"{_TR}::test_nonfinite_loss_stops_and_is_never_checkpointed",
    ),
    Case(
        "a few NaN steps under skip_and_clip",
        "skipped and counted (perf/skipped_steps)",
        "nothing",
        f"{_TR}::test_nonfinite_steps_are_skipped_and_counted",
    ),
    Case(
        "every step NaN and skipped (as with ids beyond vocab_size)",
        "TooManySkippedStepsError naming likely causes; the streak is not saved",
        "nothing committed",
        "tests/common/test_skip_streak.py::test_all_nan_run_stops_without_checkpointing_the_streak",
    ),
    Case(
        "every step dropped by drop_norm (finite loss and gradient norm)",
        "TooManySkippedStepsError saying the values were finite and naming drop_norm; no step "
        "of the streak is saved",
        "nothing committed",
        "tests/common/test_skip_streak.py::test_drop_norm_streak_names_drop_norm_not_non_finite_values",
    ),
    Case(
        "fp16 loss scaling skipping its first steps",
        "not counted as a streak; run goes on",
        "nothing",
        "tests/common/test_skip_streak.py::test_fp16_scale_search_does_not_count",
    ),
    Case(
        "non-finite state with a finite loss",
        "never saved; error at the save",
        "nothing committed",
        f"{_RES}::test_nonfinite_state_with_finite_loss_is_never_saved",
    ),
    Case(
        "token ids >= the model's vocab_size",
        "error at the first batch naming both numbers",
        "nothing",
        f"{_RANGE}::test_token_ids_beyond_vocab_fail_at_the_first_batch",
    ),
    # Values that make no sense.
    Case(
        "string mesh_shape / max_step='ten'",
        "InvalidConfigValueError at set() naming field and types",
        "nothing",
        f"{_CFG}::test_trainer_fields",
    ),
    Case(
        "a string where a Sequence/tuple/dict is annotated",
        "InvalidConfigValueError at set()",
        "nothing",
        f"{_CFG}::test_sequences_and_unions_are_checked",
    ),
    Case(
        "wrong enum/Literal/Callable/class value",
        "InvalidConfigValueError at set()",
        "nothing",
        f"{_CFG}::test_mappings_literals_enums_classes_and_callables",
    ),
    Case(
        "max_step=-5, negative learning rate, zero batch size, NaN eps",
        "ValueError at instantiation with the config path",
        "nothing",
        f"{_RANGE}::test_out_of_range_values_fail_at_instantiation",
    ),
    Case(
        "max_step=20.5; a learning rate of 0; model.decoder.dim=0",
        "ConfigRangeError (a whole number, >= 1) naming the path; a warning for the rate of 0",
        "nothing",
        f"{_RANGE}::test_fractional_step_counts_fail_and_a_zero_learning_rate_warns",
    ),
    Case(
        "--config_override=max_step=N below the experiment's",
        "the start names the fields still holding the old number (schedule, policies); step N "
        "is evaluated and saved",
        "nothing",
        f"{_LAUNCH}::test_shortened_max_step_names_derived_fields_and_saves_and_evaluates_the_last_step",
    ),
    Case(
        "launcher mistakes: --max_step=20, unknown --module or --config, no --trainer_dir, "
        "missing or empty --data_dir, --jax_backend=tpu without a TPU, max_step=20.5, "
        "peak_lr=nan, dim=0, a schedule no longer than its warm-up",
        "exit 64 (usage) or 78 (config), which `local launch` does not retry, with one line "
        "naming the mistake and the fix (did-you-mean, --config_override, warmup_steps), no "
        "traceback; nothing recorded",
        "nothing",
        f"{_MAIN}::test_user_errors_are_one_line_without_a_traceback",
    ),
    Case(
        "a train step larger than device memory (e.g. a far too long sequence)",
        "one line with the size asked for and the knobs to lower, not XLA's raw allocation error",
        "nothing",
        f"{_MAIN}::test_out_of_memory_is_one_line_naming_the_size_and_the_knobs",
    ),
    Case(
        "disk full outside a checkpoint save",
        "one line naming the path and that a rerun resumes",
        "nothing (the run resumes from its last committed checkpoint)",
        f"{_MAIN}::test_disk_full_outside_a_save_names_the_path",
    ),
    Case(
        "goodput: one attempt's START_STEP times out of order",
        "the line reported as <file>:<line> and excluded (was: 195% goodput, -99.9 s input wait)",
        "nothing",
        f"{_GP}::test_silent_195_percent_out_of_order_start_step",
    ),
    Case(
        "goodput: the clock steps back during a run",
        "the earlier-timed lines reported and excluded; every part >= 0 (was: a negative wall "
        "time)",
        "nothing",
        f"{_GP}::test_silent_negative_wall_time_when_the_clock_steps_back",
    ),
    Case(
        "goodput: the launcher's end long after the attempt's last event",
        "reported (launcher.jsonl:<line>) and not counted: 66.7% (was: 97.5%)",
        "nothing",
        f"{_GP}::test_silent_97_5_percent_launcher_end_after_the_last_event",
    ),
    Case(
        "goodput: run_summary.json and `axlearn goodput` of one run",
        "one computation: 1.03% and 1.10% (was: 1.0% and 6.2-6.5%)",
        "nothing",
        f"{_GP}::test_silent_summary_and_goodput_agree",
    ),
    Case(
        'event lines with wrong types (`"step": "7b"`), nesting 100,000 deep, non-UTF-8, '
        "10 MB long, torn",
        "one warning each, <file>:<line> and the reason, never the bytes; the run's own summary "
        "is written",
        "nothing",
        f"{_GPE}::test_deep_nesting_non_utf8_huge_line_and_torn_tail",
    ),
    Case(
        "a linked event file, a FIFO or a directory under events/",
        "not read, one warning naming the file and the rule; the link's target untouched",
        "nothing",
        f"{_GPE}::test_a_linked_event_file_is_not_read",
    ),
    Case(
        "a linked events/ directory or event file when the run records",
        "refused naming the link; nothing written into the target",
        "nothing",
        "tests/common/test_measurement.py::test_linked_events_dir_or_file_is_never_written_through",
    ),
    Case(
        "a second trainer on a live dir; a run rejected for a bad --config_override",
        "exit 73 / 78 with one line; nothing written into the live run's events",
        "nothing",
        f"{_MAIN}::test_refused_or_rejected_runs_write_nothing_into_the_live_runs_events",
    ),
    Case(
        "a SIGTERM preemption (exit 75) in `axlearn goodput`",
        "its own outcome, `preempted`, not `failed: ended without END_JOB`",
        "nothing",
        f"{_GP}::test_preempted_attempt_is_its_own_outcome",
    ),
    Case(
        "`axlearn local launch` SIGKILLed while a process has grandchildren (even in their own "
        "session)",
        "the whole tree ends (a subreaper supervisor per process)",
        "nothing (the run resumes from its last committed checkpoint)",
        f"{_LL}::test_launcher_grandchild_does_not_outlive_a_sigkilled_launcher",
    ),
    Case(
        "SIGTERM to `axlearn local launch`, then SIGTERM and Ctrl-C again during the grace period",
        "one line per signal; the processes keep the grace period (a save in progress finishes)",
        "nothing",
        f"{_LL}::test_launcher_second_sigterm_keeps_the_grace_period",
    ),
    Case(
        "`events/launcher.jsonl` (or `events/`) planted as a link, e.g. to ~/.bashrc",
        "one line: the attempt log is not written; the target keeps its bytes and mtime",
        "nothing",
        f"{_LL}::test_launcher_attempt_log_is_never_appended_through_a_link",
    ),
    Case(
        "a usage, config, input or checkpoint data error under `local launch --max_restarts`",
        "not retried: the launcher exits at once with the code and one line",
        "nothing",
        f"{_LL}::test_deterministic_errors_are_not_retried",
    ),
    *MORE_CASES,
]


def table() -> str:
    """Returns the Markdown table of `CASES`."""
    lines = [
        "| # | Fault or bad input | What the user sees | Lost | Test |",
        "|---|---|---|---|---|",
    ]
    for i, case in enumerate(CASES, start=1):
        lines.append(f"| {i} | {case.fault} | {case.user_sees} | {case.lost} | `{case.test}` |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
