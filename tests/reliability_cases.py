"""The faults and bad inputs of docs/reliability.md, each with the test that produces its row.

`python -m tests.reliability_cases` prints the table; tests/test_reliability.py checks that the
docs page holds exactly this table and that every test named here exists (they all run in CI
with the rest of the suite, so each row is re-proven on every change).
"""

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
        "exit 1 with one line naming the mistake and the fix (did-you-mean, --config_override, "
        "warmup_steps), no traceback; nothing recorded",
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
        "a garbage dataset_info.json in the embedded data set",
        "ValueError naming the folder and how to rebuild it (not a bare protobuf ParseError)",
        "nothing",
        "tests/common/test_embedded_data.py::test_garbage_dataset_info_names_the_file",
    ),
    Case(
        "`axlearn hf import` into a model with QK-norm",
        "one line about importing that names the --config_override values to pass",
        "nothing",
        "tests/cli/test_hf.py::test_import_errors_name_the_problem",
    ),
    Case(
        "`launch_trainer_main --help`",
        "the usage and every training flag, exit 0",
        "nothing",
        f"{_MAIN}::test_help_prints_the_training_flags_and_exits_0",
    ),
    Case(
        "`axlearn eval|generate --step` of a step that never existed",
        "one line listing the committed steps",
        "nothing",
        "tests/cli/test_inference_commands.py::test_eval_errors_name_the_problem",
    ),
    Case(
        "`axlearn config diff` of a file that is not a dump",
        "one line naming the file and line and what a dump is; trainer dirs are accepted",
        "nothing",
        "tests/cli/test_config_commands.py::"
        "test_diff_of_trainer_dirs_and_of_a_file_that_is_not_a_dump",
    ),
    # Numbers that must not mislead.
    Case(
        "two runs of one config in different trainer dirs",
        "one config hash, spelled as `axlearn compare` shows it",
        "nothing",
        "tests/common/test_run_summary.py::test_one_config_hash_spelling_for_runs_in_other_dirs",
    ),
    Case(
        "`axlearn compare` of a timing measured once or twice per run (+23% eval time)",
        "within noise (too few samples), never REGRESSED",
        "nothing",
        "tests/common/test_run_comparison.py::test_a_timing_from_too_few_samples_is_never_regressed",
    ),
    Case(
        "a CPU run on a machine without a GPU driver",
        "no `E0000 ... failed call to cuInit` line",
        "nothing",
        f"{_MAIN}::test_cpu_run_prints_no_error_looking_lines",
    ),
    Case(
        "--mesh_selector matching no rule; --trace_at_steps=x,y",
        "error naming the flag and the rules",
        "nothing",
        f"{_LAUNCH}::test_launch_flag_errors_name_the_flag",
    ),
    Case(
        "mesh_shape that does not fit the devices",
        "error naming mesh and devices",
        "nothing",
        f"{_TR}::test_mesh_shape_errors",
    ),
    Case(
        "partition spec naming an unknown mesh axis",
        "error naming the parameter",
        "nothing",
        f"{_TR}::test_unknown_mesh_axis_in_partition_spec_names_the_parameter",
    ),
    Case(
        "--config_override with a wrong type",
        "error naming the expected type",
        "nothing",
        "tests/common/config/test_override.py::test_bad_type_names_the_expected_type",
    ),
    Case(
        "--config_override of a misspelled path",
        "error naming the nearest valid path",
        "nothing",
        "tests/common/config/test_override.py::test_bad_path_names_the_nearest_valid_one",
    ),
    # Crafted files: nothing reaches outside its directory.
    Case(
        "an index leaf `file` that is absolute or climbs out with `../`",
        "verify exits 1 and restore refuses, naming the index, the leaf and the containment rule",
        "nothing (the outside file is not read)",
        f"{_CONT}::test_index_array_file_outside_the_step_is_refused",
    ),
    Case(
        "`axlearn generate`/`eval` on a checkpoint whose index leaf `file` is absolute",
        "ValueError naming the leaf and the containment rule",
        "nothing (the outside copy is not read)",
        "tests/common/test_inference.py::test_restore_refuses_an_index_leaf_outside_the_checkpoint",
    ),
    Case(
        "a bytes leaf pointed at a system file outside, with a matching CRC",
        "same refusal; no error shows the file's content",
        "nothing",
        f"{_CONT}::test_index_bytes_file_at_a_system_file_with_matching_crc_is_refused",
    ),
    Case(
        "a chunk file or an `index` that is a symbolic link out of its step",
        "verify reports the chunk unreadable; restore refuses the linked index as corrupt",
        "nothing",
        f"{_CONT}::test_symlinked_chunk_or_index_is_never_read",
    ),
    Case(
        "a multi-process save's manifest naming a bytes file outside the step, or a linked "
        "manifest",
        "refused before the index is written, naming the manifest, the leaf and the rule",
        "nothing (the outside file is not read)",
        f"{_CONT}::test_a_manifest_naming_a_file_outside_the_step_is_refused",
    ),
    Case(
        "a step directory that is a symbolic link into another run",
        "a warning: the link is ignored (a save of that step replaces the link); GC and restore "
        "never go through it",
        "nothing (the other run's committed step is intact)",
        f"{_CONT}::test_gc_never_follows_a_symlinked_step_into_another_run",
    ),
    Case(
        "`run.lock` planted as a symbolic link in a shared trainer dir",
        "RunLockError naming the link; its target is not truncated",
        "nothing",
        f"{_PATHS}::test_run_lock_refuses_a_planted_link",
    ),
    Case(
        "`metrics.jsonl` or `run_summary.json` planted as a symbolic link",
        "the append is refused naming the link; the summary replaces the link",
        "nothing (the link's target is untouched)",
        f"{_PATHS}::test_metrics_and_run_summary_are_never_written_through_links",
    ),
    Case(
        "run record files or `run_records` planted as symbolic links",
        "the record is written as files of the trainer dir, or refused naming the rule",
        "nothing",
        f"{_PATHS}::test_run_record_never_writes_through_links",
    ),
    Case(
        "`hf import` of a `weight_map` entry outside the directory (`../`, absolute, a linked "
        "directory)",
        "HfConversionError naming the index, the weight key and the containment rule",
        "nothing (no outside file read, no step 0 committed)",
        f"{_HF}::test_weight_map_outside_the_directory_is_refused",
    ),
    Case(
        "a truncated safetensors file, or a header that lies about its size or offsets",
        "one-line HfConversionError naming the file; nothing allocated from the header",
        "nothing",
        f"{_HF}::test_malformed_safetensors_is_one_line_naming_the_file",
    ),
    Case(
        "a `model.safetensors.index.json` without `weight_map` (or not JSON)",
        "HfConversionError naming the file and the fix",
        "nothing",
        f"{_HF}::test_index_without_weight_map_names_the_file",
    ),
    Case(
        "a save interrupted after its chunks, before its index",
        "set aside as step_N.unindexed-<time>, removed by GC once a newer step commits",
        "nothing (the run moved past it)",
        f"{_CONT}::test_interrupted_save_set_aside_is_removed_once_a_newer_step_commits",
    ),
    # The rough edges a new user hits.
    Case(
        "`axlearn config diff` of a binary file, a non-UTF-8 file or /dev/zero",
        "one line: not a config dump (binary, not UTF-8, or over 64 MiB, refused before "
        "reading it whole); exit 2",
        "nothing",
        "tests/cli/test_config_commands.py::test_diff_refuses_binary_and_oversized_input",
    ),
    Case(
        "--config_override of one item of a tuple field (`mesh_axis_names.1=x`)",
        "error naming the tuple and the whole-tuple override to pass instead",
        "nothing",
        "tests/common/config/test_override.py::test_tuple_item_override_names_the_whole_tuple_to_set",
    ),
    Case(
        "--trainer_dir pointing at a file",
        "one line: a file, not a directory (no traceback)",
        "nothing (the file is untouched)",
        "tests/common/test_run_lock.py::test_a_trainer_dir_that_is_a_file_is_one_line",
    ),
    Case(
        "`axlearn checkpoint verify` while a run is saving (chunks written, index not yet)",
        "`save in progress` for the newest uncommitted step (exit 0); failure only without a "
        "live run",
        "nothing",
        f"{_VER}::test_cli_verify_during_a_live_run_reports_the_save_in_progress",
    ),
    Case(
        "`checkpoint list` and `verify` sizes of one step differ",
        "each says what it counts: `on disk` (every file) and `of array data`",
        "nothing",
        f"{_VER}::test_cli_list_and_verify_say_what_their_sizes_count",
    ),
    Case(
        "--restore_step of a step that was set aside",
        "one line naming the set-aside copy, why, and the `mv` that brings it back",
        "nothing",
        f"{_REC}::test_trainer_refuses_corrupt_index_and_restore_step_chooses",
    ),
    Case(
        "`axlearn generate --max_new_tokens=1000000000`",
        "one line naming the model's context and how many new tokens fit (no native abort)",
        "nothing",
        "tests/common/test_inference.py::test_generation_is_bounded_by_the_context",
    ),
    Case(
        "resuming a checkpoint with a changed model (the checkpoint holds `input_iter`)",
        "StateMismatchError naming the model's parameters only (not `input_iter`)",
        "nothing",
        "tests/common/test_trainer_checkpointing.py::"
        "test_model_mismatch_error_does_not_blame_the_input_iterator",
    ),
    Case(
        "`axlearn generate`/`eval`/`hf export` on a machine without a TPU or GPU",
        "no libtpu `unexpected worker hostname` or `cuInit` E-lines (as `axlearn aot`)",
        "nothing",
        "tests/cli/test_inference_commands.py::"
        "test_generate_starts_without_accelerator_probe_errors_and_bounds_the_context",
    ),
    Case(
        "`axlearn compare` of a 60-step and a 20-step run with the same overhead per step",
        'eval, checkpoint and input wait compared per step (never "better" for being '
        "shorter); the 3-sample rule of timing rows printed with each row it silenced",
        "nothing",
        "tests/common/test_run_comparison.py::"
        "test_runs_of_different_lengths_compare_overheads_per_step",
    ),
    Case(
        "the first run builds the embedded data set",
        "one line saying it builds from the shipped corpus with no download (no TFDS "
        '"Downloading and preparing dataset" line)',
        "nothing",
        "tests/common/test_embedded_data.py::test_first_build_says_no_download",
    ),
    Case(
        "a 2-process run whose coordinator port is held by another program",
        "process 0: one line naming the port and the fix; process 1: says where it connects and "
        "that it stops at --initialization_timeout (no silent hang)",
        "nothing (no run started)",
        f"{_MAIN}::test_busy_coordinator_port_is_one_line_and_the_peer_says_what_it_waits_for",
    ),
    Case(
        "a 1-process checkpoint resumed with 2 processes",
        "restored, not called corrupt: the new process reads process 0's per-process value "
        "and its owner (the input) decides whether it can use it",
        "nothing (nothing moved)",
        "tests/common/test_checkpointer_multiprocess.py::"
        "test_resuming_a_one_process_checkpoint_with_two_processes_is_not_corrupt",
    ),
    Case(
        "chunk damage found by a 2-process run that already passed --restore_fallback=previous",
        "the refusal says the fallback covers an unreadable index only here and names "
        "--restore_step / `checkpoint select`",
        "nothing (nothing moved)",
        "tests/common/test_checkpointer_multiprocess.py::"
        "test_two_process_run_with_fallback_previous_is_not_told_to_pass_it",
    ),
    # Inputs.
    Case(
        "resuming an input whose config changed",
        "error: the saved position belongs to another input",
        "nothing",
        f"{_TFD}::test_resume_refuses_changed_config",
    ),
    Case(
        "a missing data set",
        "error naming the path",
        "nothing",
        f"{_TFD}::test_missing_dataset_names_the_path",
    ),
    Case(
        "a malformed record",
        "error naming the source",
        "nothing",
        f"{_TFD}::test_malformed_record_fails_naming_the_source",
    ),
    Case(
        "a garbage vocabulary file",
        "ValueError naming the file (not a bare protobuf DecodeError)",
        "nothing",
        "tests/experiments/text/test_common.py::test_garbage_vocab_file_names_the_path",
    ),
    Case(
        "resuming a real-data checkpoint with --data_dir=FAKE",
        "error: the input state belongs to another input",
        "nothing",
        "tests/common/test_input_fake.py::test_restoring_another_inputs_state_says_so",
    ),
    Case(
        "a missing vocabulary file",
        "error naming every path tried",
        "nothing",
        "tests/experiments/text/test_common.py::test_missing_vocab_names_every_path",
    ),
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
