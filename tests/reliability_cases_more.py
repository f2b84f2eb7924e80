"""The later rows of docs/reliability.md's table (run files, goodput, the launcher, inputs,
Hugging Face and new-user cases); `tests.reliability_cases.CASES` ends with them."""

from __future__ import annotations

from tests.reliability_cases_base import (
    _CONT,
    _FA,
    _HF,
    _LAUNCH,
    _MAIN,
    _OWN,
    _PATHS,
    _PRE,
    _REC,
    _RR,
    _TFD,
    _TR,
    _VER,
    Case,
)

MORE_CASES = [
    Case(
        "`<trainer_dir>/compilation_cache` made by another user, group/world-writable, or a link",
        "the cache is off with one line naming the directory, the reason and the fix; nothing "
        "planted is loaded",
        "nothing",
        "tests/common/test_compilation_cache.py::test_planted_cache_dir_is_refused",
    ),
    Case(
        "a run record naming a module that is not axlearn's",
        "one line: it is not imported (its code does not run); pass --module=M",
        "nothing",
        f"{_RR}::test_insecure_record_module_is_imported_only_when_named",
    ),
    Case(
        "generate/eval/hf export of a run whose config dump differs (or holds secrets)",
        "a warning naming the differing fields of the rebuilt config, never the file's values",
        "nothing",
        f"{_RR}::test_insecure_config_comparison_never_logs_the_files_content",
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
    # Issue 48, part A: one file layer, one owner per directory.
    Case(
        "a link at the last or at a middle component of a run file, a FIFO, a directory, a "
        "/dev/zero link, a 1 GiB or 100,000-deep JSON file, non-UTF-8 bytes (the file layer)",
        "one line `<path>: <rule>`, at once (no blocking, no unbounded read), never the content",
        "nothing (nothing outside is read or written)",
        f"{_FA}::test_link_at_last_and_middle_component_refused",
    ),
    Case(
        "a `.zarray` that is a link to an outside JSON file",
        "verify exits 1 and restore refuses, naming the link; no output holds the file's values",
        "nothing (the outside file keeps its bytes and mtime)",
        f"{_CONT}::test_insecure_zarray_linked_outside_never_shows_its_content",
    ),
    Case(
        "a `.zarray`, chunk or `index` linked to /dev/zero",
        "refused at once as a link (it was read until memory ran out, also by GC's check)",
        "nothing",
        f"{_CONT}::test_insecure_dev_zero_link_is_refused_at_once",
    ),
    Case(
        "a FIFO or a directory where a `.zarray`, chunk, bytes file or `index` is expected",
        "verify and restore: one line naming the file and what it is (it hung or was a traceback)",
        "nothing",
        f"{_CONT}::test_unclear_fifo_or_directory_in_a_files_place_is_one_line",
    ),
    Case(
        "an `index` nested 100,000 deep, or not UTF-8",
        "refused as corrupt in one line naming the file (was a RecursionError/UnicodeDecodeError)",
        "nothing",
        f"{_CONT}::test_unclear_index_nested_too_deep_or_not_utf8_is_one_line",
    ),
    Case(
        "a thread swapping a step's array directory for a link out of it while restores run "
        "(3 s; 10 s in the slow suite)",
        "0 restores return the outside values (was 1,743 of 7,177 in 10 s); every one refused",
        "nothing (the outside files keep their bytes and mtime)",
        f"{_CONT}::test_insecure_link_swapped_during_restores_never_returns_outside_values",
    ),
    Case(
        "two runs whose checkpoints land in one directory (a copied `checkpointer.dir`, or a "
        "`checkpoints/` linked to another run's)",
        "the second run is refused naming the holder (pid, host, start time) before it restores "
        "or writes",
        "nothing (the first run's committed steps keep their bytes)",
        f"{_OWN}::test_lost_two_runs_sharing_one_checkpoint_dir_are_refused",
    ),
    Case(
        "the `index` of a committed step lost, then the next commit",
        "the step is set aside as unindexed and kept while keep_last_n would keep it; verify "
        "says what it is and how to restore it",
        "nothing (before: the step was deleted at the next commit)",
        f"{_OWN}::test_lost_index_of_a_kept_step_is_never_deleted_by_the_next_commit",
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
        "error naming both inputs and the fix (the same --data_dir, or a fresh --trainer_dir)",
        "nothing",
        "tests/common/test_input_fake.py::test_restoring_another_inputs_state_says_so",
    ),
    Case(
        "a missing vocabulary file",
        "error naming every path tried",
        "nothing",
        "tests/experiments/text/test_common.py::test_missing_vocab_names_every_path",
    ),
    Case(
        "a Grain elastic state whose rows_per_batch is null after batches",
        "one-line InputStateError naming the field (was: input restarted at position 0)",
        "nothing (no data repeated)",
        "tests/common/test_input_grain.py::test_silent_null_rows_per_batch_is_refused",
    ),
    Case(
        "an ArrayRecord file replaced between save and resume",
        "one-line InputStateError naming the file, its old and new size and fingerprint",
        "nothing (was: read on from the saved index)",
        "tests/common/test_input_grain.py::test_silent_replaced_array_record_file_is_refused",
    ),
    Case(
        "a TFRecord file replaced between save and resume (tf.data)",
        "one-line InputStateError naming the file",
        "nothing",
        "tests/common/test_input_tf_data.py::test_resume_refuses_replaced_source_file",
    ),
    Case(
        "a Grain input state with wrong JSON types, 100,000-deep nesting, non-UTF-8 or over 16 MiB",
        "one line naming the state, the field and the fix",
        "nothing",
        "tests/common/test_input_grain.py::test_bad_state_is_one_line",
    ),
    Case(
        "a tf.data input state header with wrong types or payload slices past its end",
        "one line naming the field and the fix",
        "nothing",
        "tests/common/test_input_tf_data.py::test_bad_state_header_is_one_line",
    ),
    Case(
        "a refused input state in a checkpoint; its file a FIFO or a link",
        "the error names the step dir and leaf; a FIFO or link is refused, its target untouched",
        "nothing",
        "tests/common/test_trainer_checkpointing.py::test_input_state_refusal_names_the_checkpoint",
    ),
    Case(
        "tiktoken text that the file's regex does not match",
        "encoded byte-level as its own piece (ids equal HF tokenizers'; was: dropped)",
        "nothing",
        "tests/experiments/text/gpt/test_vocabulary_fuji_v3.py::test_silent_text_the_regex_skips_is_encoded_byte_level",
    ),
    Case(
        "a special token whose id is an ordinary token's",
        "ValueError naming both tokens (was: silently shared)",
        "nothing",
        "tests/experiments/text/gpt/test_vocabulary_fuji_v3.py::test_special_token_ids_outside_the_ordinary_range",
    ),
    Case(
        "hf export into a non-empty directory",
        "refused without --overwrite; with it only files an earlier export wrote are replaced",
        "nothing (was: every model*.safetensors deleted)",
        "tests/common/test_hf_checkpoint_export.py::test_non_empty_target_needs_overwrite_and_keeps_other_files",
    ),
    Case(
        "links planted under the names hf export writes",
        "the links are replaced, their targets untouched",
        "nothing",
        "tests/common/test_hf_checkpoint_export.py::test_export_never_writes_through_links",
    ),
    Case(
        "hf export file modes",
        "every file 0644 less the umask, model.safetensors included",
        "nothing",
        "tests/common/test_hf_checkpoint_export.py::test_fresh_export_is_renamed_into_place_with_one_mode",
    ),
    Case(
        "hf import config.json huge, 100,000-deep, non-UTF-8, a FIFO or a dangling link",
        "one line naming the file",
        "nothing",
        "tests/common/test_hf_checkpoint.py::test_config_json_is_read_bounded_through_the_file_layer",
    ),
    Case(
        "a 10 MB --config_override",
        "one line of about 1 KB (the value cut, its length named)",
        "nothing",
        "tests/common/config/test_override.py::test_oversized_override_is_one_short_line",
    ),
    Case(
        "an `axlearn` argument over 70,000 characters",
        "one line naming the argument and its length (exit 2)",
        "nothing",
        "tests/cli/test_main.py::test_oversized_arguments_are_one_short_line",
    ),
    # Issue 55: what a new user hits after the first run.
    Case(
        "Ctrl-C mid-run; a second Ctrl-C while it saves",
        "the step in flight is saved, exit 130 with one line; the second exits at once naming "
        "the step not saved",
        "nothing (the second Ctrl-C: the steps since the last committed checkpoint)",
        f"{_PRE}::test_ctrl_c_saves_the_step_and_exits_130_and_a_second_exits_at_once",
    ),
    Case(
        "a --trainer_dir under a file, in /sys or /proc",
        "error naming the dir and the fix, exit 64 (usage), before anything is written",
        "nothing",
        f"{_MAIN}::test_user_errors_are_one_line_without_a_traceback",
    ),
    Case(
        "resuming a --data_dir=FAKE checkpoint with real data",
        "error naming both inputs and the fix (the same --data_dir, or a fresh --trainer_dir)",
        "nothing",
        f"{_TFD}::test_resuming_a_fake_input_checkpoint_names_both_inputs_and_the_fix",
    ),
    Case(
        "a torn last metrics.jsonl record longer than 1 MiB",
        "warning; the torn record is cut at the last whole line",
        "nothing but the torn record's bytes",
        "tests/common/test_summary_writer.py::test_jsonl_torn_record_longer_than_1mib_cuts_only_itself",
    ),
    Case(
        "a resume re-doing steps already in metrics.jsonl",
        "one record per step; the superseded ones in metrics.redone.jsonl",
        "nothing",
        "tests/common/test_summary_writer.py::"
        "test_resumed_run_moves_redone_records_aside_one_record_per_step",
    ),
]
