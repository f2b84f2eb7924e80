"""The trainer's metrics recorder: FLOPs per step, peak FLOP/s, memory, step records, summary.

`MetricsRecorder` is a part that `SpmdTrainer` (axlearn/common/trainer.py) owns; it turns each
step's timing (`step_timer.StepTiming`) and host-side scalars into the step record that the log
line, metrics.jsonl, TensorBoard and run_summary.json show. Definitions: docs/metrics.md.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Callable, Optional

import jax
import numpy as np
from absl import logging

from axlearn.common import utils
from axlearn.common.attention import remat_choices_of
from axlearn.common.config import ConfigBase
from axlearn.common.device_memory import compiled_memory_stats, live_memory_per_device
from axlearn.common.device_peak import device_peak_flops
from axlearn.common.flops import lm_training_flops, matmul_param_count
from axlearn.common.goodput import goodput_summary
from axlearn.common.run_summary import (
    build_run_summary,
    config_hash,
    environment_info,
    format_run_summary,
    write_run_summary,
)
from axlearn.common.step_log import format_step_line, step_throughput
from axlearn.common.step_timer import StepTimer, StepTiming
from axlearn.common.utils import NestedTensor

# The parameter table (path, shape, partition spec per parameter) in the trainer dir.
PARAMETER_TABLE_FILE = "model_parameters.txt"
# AXLearn's files of a fresh start: the trainer state's tree structure, and the model analysis.
STATE_TREE_FILE = "trainer_state_tree.txt"
MODEL_ANALYSIS_FILE = "model_analysis.txt"


def write_text_file(path: str, text: str) -> None:
    """Writes `text` (plus a final newline) to a local or remote ("scheme://") path.

    Args:
        path: The file path; its directory is created if needed.
        text: The content.
    """
    if "://" in path:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        tf.io.gfile.makedirs(os.path.dirname(path))
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text + "\n")
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")


def trainable_parameter_counts(
    param_specs: NestedTensor, *, learner: Any, learner_state_specs: Optional[NestedTensor] = None
) -> dict[str, int]:
    """Counts the parameters a learner trains and freezes, and its optimizer state's values.

    Args:
        param_specs: The model's parameter specs (or arrays).
        learner: A learner with `should_update_with_optimizers(params) -> Nested[bool]`.
        learner_state_specs: The learner's state specs; its "optimizer" entry is counted (None:
            not counted).

    Returns:
        {"total", "trainable", "frozen", "optimizer_state"} element counts; trainable + frozen ==
        total by construction; "optimizer_state" is -1 when `learner_state_specs` is None.
    """
    mask = learner.should_update_with_optimizers(param_specs)
    specs = jax.tree_util.tree_leaves(param_specs)
    keeps = jax.tree_util.tree_leaves(mask)
    if len(specs) != len(keeps):
        raise ValueError(
            f"learner.should_update_with_optimizers gave {len(keeps)} leaves for "
            f"{len(specs)} parameters"
        )
    sizes = [int(np.prod(x.shape, dtype=np.int64)) for x in specs]
    trainable = sum(n for n, keep in zip(sizes, keeps) if keep)
    total = sum(sizes)
    optimizer_state = -1
    if learner_state_specs is not None:
        optimizer_state = utils.count_model_params(learner_state_specs.get("optimizer", {}))
    return dict(
        total=total, trainable=trainable, frozen=total - trainable, optimizer_state=optimizer_state
    )


def format_trainable_counts(counts: dict[str, int]) -> str:
    """One log line of `trainable_parameter_counts`'s result.

    Args:
        counts: The counts.

    Returns:
        E.g. "Trainable parameters: 1,024 of 10,240 (10.00%); frozen: 9,216; optimizer state:
        2,049 values".
    """
    share = 100.0 * counts["trainable"] / counts["total"] if counts["total"] else 0.0
    line = (
        f"Trainable parameters: {counts['trainable']:,} of {counts['total']:,} ({share:.2f}%); "
        f"frozen: {counts['frozen']:,}"
    )
    if counts["optimizer_state"] >= 0:
        line += f"; optimizer state: {counts['optimizer_state']:,} values"
    return line


class MetricsRecorder:
    """Turns each step's timing and scalars into the step record and reports it.

    A part that `SpmdTrainer` owns, built for each run (`run()`); see docs/trainer.md.
    Interface: `timer` (the run's StepTimer), `measure_peak()`, `log_model_analysis(model)`,
    `on_compiled(...)`, `count_nonfinite_step()`, `record_step(...)` and `write_run_summary(...)`.
    """

    def __init__(
        self,
        *,
        trainer_config: ConfigBase,
        mesh: jax.sharding.Mesh,
        model_param_specs: Any,
        summary_writer: Callable[[int, dict[str, Any]], None],
        jsonl_writer: Callable[[int, dict[str, Any]], None],
        skips_nonfinite: bool,
        verbose_start: bool,
        log: Callable[..., None],
    ):
        """Builds the recorder of one run.

        Args:
            trainer_config: The trainer config (dir, max_step, log_every_n_steps,
                peak_flops_per_device, train_dtype, model, name are read; its digest goes in the
                run summary).
            mesh: The device mesh.
            model_param_specs: The model's parameter specs.
            summary_writer: Writes a step's summaries (TensorBoard): `summary_writer(step, values)`.
            jsonl_writer: Writes a step's record to metrics.jsonl: `jsonl_writer(step, values)`.
            skips_nonfinite: Whether the learner skips non-finite steps (records then count them).
            verbose_start: Whether the parameter table is logged line by line.
            log: Logs a message (the trainer's step log: `log(msg, *args)`).
        """
        self._cfg = trainer_config
        self._mesh = mesh
        self._param_specs = model_param_specs
        self._summary_writer = summary_writer
        self._jsonl_writer = jsonl_writer
        self._skips_nonfinite = skips_nonfinite
        self._verbose_start = verbose_start
        self._log = log
        self.timer = StepTimer()
        self._records: list[dict[str, Any]] = []
        self._num_nonfinite_steps = 0
        self._num_params: Optional[int] = None
        self._pipeline_report = None
        self._peak = None
        self._peak_flops: Optional[float] = None
        self._num_devices = mesh.devices.size
        self._tokens_per_step = 0
        self._step_flops = None
        self._compiled_memory = None
        self._compile_seconds: Optional[float] = None

    def measure_peak(self) -> None:
        """Sets the peak FLOP/s per device for MFU (table, configured, or CPU matmul probe).

        Runs before the first step so the CPU probe's time is never charged to a step.
        """
        cfg = self._cfg
        if cfg.peak_flops_per_device:
            self._peak_flops = float(cfg.peak_flops_per_device)
            description = f"{self._peak_flops / 1e12:.4g} TFLOP/s per device (configured)"
        else:
            dtype = cfg.train_dtype
            if dtype is None or not isinstance(dtype, (str, type, np.dtype)):
                dtype = "float32"
            self._peak = device_peak_flops(list(self._mesh.devices.flat), dtype=dtype)
            self._peak_flops = self._peak.flops_per_s
            description = self._peak.describe()
        self._log("Peak for MFU: %s", description)

    def log_model_analysis(
        self,
        model: Any,
        *,
        learner: Optional[Any] = None,
        learner_state_specs: Optional[NestedTensor] = None,
        trainer_state: Optional[Any] = None,
    ) -> None:
        """Writes the parameter table, logs the parameter count and the pipeline report.

        With `trainer_state` given (a run's fresh start), also writes AXLearn's
        `trainer_state_tree.txt` (the state's tree structure) and `model_analysis.txt` (the table).

        With `learner` given, also logs how many parameters it trains and freezes (its update
        rules, e.g. LoRA's adapters only) and how many values its optimizer state holds.

        Args:
            model: The model module (for the pipeline report).
            learner: The learner (its `should_update_with_optimizers`), or None.
            learner_state_specs: The learner's state specs (the "optimizer" entry is counted).
            trainer_state: The initialized trainer state, or None.
        """
        num_params = utils.count_model_params(self._param_specs)
        self._num_params = num_params
        rows = [
            f"{path:<60} {str(tuple(spec.shape)):<20} {spec.mesh_axes}"
            for path, spec in utils.flatten_items(self._param_specs)
        ]
        header = f"Model parameters: {num_params:,}\n"
        if learner is not None:
            counts = trainable_parameter_counts(
                self._param_specs, learner=learner, learner_state_specs=learner_state_specs
            )
            header += format_trainable_counts(counts) + "\n"
        table_path = os.path.join(self._cfg.dir, PARAMETER_TABLE_FILE)
        if jax.process_index() == 0:
            write_text_file(table_path, header + "\n".join(rows))
            if trainer_state is not None:
                tree = str(jax.tree_util.tree_structure(trainer_state))
                write_text_file(os.path.join(self._cfg.dir, STATE_TREE_FILE), tree)
                write_text_file(
                    os.path.join(self._cfg.dir, MODEL_ANALYSIS_FILE), header + "\n".join(rows)
                )
        if learner is not None:
            self._log("%s", format_trainable_counts(counts))
        if self._verbose_start:
            self._log("Model parameters: %s", f"{num_params:,}")
            for row in rows:
                self._log("  %s", row)
        else:
            self._log(
                "Model parameters: %s (%d tensors; table in %s)",
                f"{num_params:,}",
                len(rows),
                table_path,
            )
        self._log_pipeline_report(model)

    def _log_pipeline_report(self, model: Any) -> None:
        """Logs bubble fraction and per-stage parameters/memory of pipelined layers, if any."""
        from axlearn.common.pipeline import (  # pylint: disable=import-outside-toplevel
            format_pipeline_report,
            pipeline_report,
        )

        self._pipeline_report = pipeline_report(model, self._param_specs, dict(self._mesh.shape))
        if self._pipeline_report is not None:
            for line in format_pipeline_report(self._pipeline_report):
                self._log("%s", line)

    def on_compiled(
        self, compiled: Any, global_batch: NestedTensor, *, compile_seconds: float
    ) -> None:
        """Logs FLOPs per step and the compiled memory analysis of the compiled train step.

        Args:
            compiled: The compiled train step.
            global_batch: The batch it was compiled for (its [B, T] gives the tokens per step).
            compile_seconds: How long compiling took (for the run summary).
        """
        cfg = self._cfg
        self._compile_seconds = compile_seconds
        batch_shape = _batch_shape(global_batch)
        self._tokens_per_step = int(np.prod(batch_shape)) if batch_shape else 0
        self._step_flops = _model_step_flops(cfg.model, self._param_specs, batch_shape)
        if self._step_flops is not None:
            self._log("%s", self._step_flops.describe())
        self._compiled_memory = compiled_memory_stats(compiled)
        if self._compiled_memory is not None:
            remats = remat_choices_of(cfg.model, "model")
            remat = ", ".join(f"{path}={name}" for path, name in sorted(remats.items()))
            self._log(
                "%s%s", self._compiled_memory.describe(), f" [remat: {remat}]" if remat else ""
            )

    def count_nonfinite_step(self) -> None:
        """Counts a step whose loss was not finite (and that the learner skipped)."""
        self._num_nonfinite_steps += 1

    def record_step(
        self,
        *,
        step: int,
        batch: NestedTensor,
        loss: float,
        scalars: dict[str, Any],
        timing: StepTiming,
        checkpoint: Optional[dict[str, Any]],
    ) -> dict[str, Any]:
        """Builds step `step`'s record and reports it (log line, TensorBoard, metrics.jsonl).

        Args:
            step: The finished step.
            batch: Its host batch (for the count of real tokens).
            loss: Its loss.
            scalars: Its summaries, flattened ('/'-joined paths).
            timing: Its interval (`StepTimer.end_step`).
            checkpoint: The parts of the save charged to it (`CheckpointDriver.take_split`).

        Returns:
            The record.
        """
        record = self._step_record(
            step=step, batch=batch, loss=loss, scalars=scalars, timing=timing, checkpoint=checkpoint
        )
        self._report_step(record, scalars=scalars)
        return record

    def _step_record(
        self,
        *,
        step: int,
        batch: NestedTensor,
        loss: float,
        scalars: dict[str, Any],
        timing: StepTiming,
        checkpoint: Optional[dict[str, Any]],
    ) -> dict[str, Any]:
        """The metrics of one finished step (what the log line, JSONL and summary show)."""
        cfg = self._cfg
        wall = timing.wall_s
        record: dict[str, Any] = dict(
            step=step,
            max_step=cfg.max_step,
            loss=loss,
            step_time_s=wall,
            overheads=dict(timing.overheads),
            excluded_reason=timing.excluded_reason,
        )
        if checkpoint is not None:
            record["checkpoint"] = checkpoint
        lr = applied_learning_rate(scalars)
        if lr is not None:
            record["learning_rate"] = lr
        grad_norm = _find_scalar(scalars, r"(.*/)?(gradient_norm|grad_norm|global_grad_norm)")
        if grad_norm is not None:
            record["gradient_norm"] = grad_norm
        loss_scale = _find_scalar(scalars, r"(.*/)?loss_scale(/scale)?")
        if loss_scale is not None:
            record["loss_scale"] = loss_scale
        skipped = _find_scalar(scalars, r"(.*/)?(nonvalid_count|num_skipped_steps)")
        nan_steps = _find_scalar(scalars, r"(.*/)?num_nan_steps")
        if skipped is not None or self._skips_nonfinite:
            record["skipped_steps"] = int(skipped) if skipped is not None else 0
            record["nonfinite_steps"] = (
                int(nan_steps) if nan_steps is not None else self._num_nonfinite_steps
            )
        tokens = self._tokens_per_step
        record["consumed_tokens"] = step * tokens
        real = _real_tokens(batch)
        if real is not None:
            # Each process counts its own slice; the slices are equal-sized, so scale up.
            record["real_tokens"] = real * jax.process_count()
        if wall > 0:
            record.update(
                step_throughput(
                    wall_s=wall,
                    num_devices=self._num_devices,
                    tokens_per_step=tokens,
                    real_tokens=record.get("real_tokens"),
                    flops_per_step=(
                        self._step_flops.total_flops if self._step_flops is not None else None
                    ),
                    peak_flops_per_device=self._peak_flops,
                )
            )
        self._records.append(record)
        steady = [r["step_time_s"] for r in self._records if not r["excluded_reason"]]
        avg = float(np.mean(steady)) if steady else wall
        if math.isfinite(cfg.max_step):
            record["eta_s"] = max(0.0, (cfg.max_step - step) * avg)
        return record

    def _report_step(self, record: dict[str, Any], *, scalars: dict[str, Any]) -> None:
        """Logs the step line; writes summaries (TensorBoard) and the JSONL record."""
        cfg = self._cfg
        step = record["step"]
        every = cfg.log_every_n_steps or 1
        if step % every == 0 or record["excluded_reason"] or step == cfg.max_step:
            logging.info("%s", format_step_line(record))
        perf = {
            k: record[k]
            for k in (
                "step_time_s",
                "tflops_per_device",
                "mfu",
                "tokens_per_s_per_device",
                "real_tokens_per_s_per_device",
                "consumed_tokens",
                "eta_s",
                "loss_scale",
                "skipped_steps",
                "nonfinite_steps",
            )
            if k in record
        }
        perf["overhead"] = dict(record["overheads"])
        extra = {}
        if record.get("checkpoint"):
            # The parts of the "checkpoint" overhead (seconds) and where the snapshot lived.
            split = record["checkpoint"]
            perf["checkpoint"] = {k: v for k, v in split.items() if isinstance(v, float)}
            extra["checkpoint_snapshot"] = str(split.get("snapshot", ""))
        values = dict(loss=record["loss"], **_unflatten(scalars), perf=perf)
        self._summary_writer(step, values)
        self._jsonl_writer(
            step, dict(values, excluded_reason=record["excluded_reason"] or "", **extra)
        )

    def write_run_summary(
        self,
        *,
        end_of_run_wait_s: Optional[float],
        skipped_steps: int,
        checkpoint_snapshot: Any,
    ) -> dict[str, Any]:
        """Logs the end-of-run summary block and writes <dir>/run_summary.json (process 0).

        Args:
            end_of_run_wait_s: Seconds the end of the run waited for the last save's write.
            skipped_steps: The learner's cumulative count of skipped steps.
            checkpoint_snapshot: The run's checkpoint snapshot choice (None: not made).

        Returns:
            The summary.
        """
        cfg = self._cfg
        memory = [m.to_dict() for m in live_memory_per_device()]
        flops = self._step_flops
        summary = build_run_summary(
            self._records,
            num_params=self._num_params,
            num_devices=self._num_devices,
            tokens_per_step=self._tokens_per_step,
            flops_per_step=flops.total_flops if flops else None,
            flops=flops.to_dict() if flops else None,
            peak=self._peak.to_dict() if self._peak else None,
            memory=memory,
            compiled_memory=self._compiled_memory.to_dict() if self._compiled_memory else None,
            environment=environment_info(list(self._mesh.devices.flat)),
            end_of_run_wait_s=end_of_run_wait_s,
            config_digest=config_hash(cfg),
            extra=dict(
                name=cfg.name,
                trainer_dir=cfg.dir,
                # The run's wall time over all its attempts, from <dir>/events (goodput.py).
                goodput=goodput_summary(cfg.dir) if jax.process_index() == 0 else None,
                mesh=dict(self._mesh.shape),
                compile_s=self._compile_seconds,
                # Cumulative counts (the learner's skip counter, which a restore carries over;
                # this run's non-finite losses).
                skipped_steps=skipped_steps,
                nonfinite_steps=self._num_nonfinite_steps,
                checkpoint_snapshot=(
                    checkpoint_snapshot.to_dict() if checkpoint_snapshot is not None else None
                ),
                **(dict(pipeline=self._pipeline_report) if self._pipeline_report else {}),
            ),
        )
        logging.info("\n%s", format_run_summary(summary))
        if jax.process_index() == 0:
            write_run_summary(cfg.dir, summary)
        return summary


def applied_learning_rate(scalars: dict[str, Any]) -> Optional[float]:
    """The learning rate a step applied, from its flattened summaries (None if absent).

    A decoupled optimizer's `learning_rate` summary is its constant alpha; its
    `effective_learning_rate` (alpha times the schedule) is preferred when present.

    Args:
        scalars: {'/'-joined summary path: value}.

    Returns:
        The rate, or None.
    """
    lr = _find_scalar(scalars, r"(.*/)?effective_learning_rate")
    if lr is None:
        lr = _find_scalar(scalars, r"(.*/)?(learning_rate|lr)")
    return lr


def _find_scalar(scalars: dict[str, Any], regex: str) -> Optional[float]:
    """The first scalar whose '/'-joined path fully matches `regex`, as a float."""
    for path, value in scalars.items():
        if re.fullmatch(regex, path):
            return float(value)
    return None


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    """{"a/b": v} -> {"a": {"b": v}}."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        parts = path.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _batch_shape(global_batch: NestedTensor) -> Optional[tuple]:
    """[B, T] of the batch's input ids (or its first 2-d leaf)."""
    if isinstance(global_batch, dict) and "input_ids" in global_batch:
        return tuple(global_batch["input_ids"].shape[:2])
    for leaf in jax.tree.leaves(global_batch):
        if len(leaf.shape) >= 2:
            return tuple(leaf.shape[:2])
    return None


def _real_tokens(host_batch: NestedTensor) -> Optional[int]:
    """Non-padding target tokens in this process's batch (labels > 0: -1 and pad id 0 excluded)."""
    if not isinstance(host_batch, dict) or "target_labels" not in host_batch:
        return None
    return int(np.sum(np.asarray(host_batch["target_labels"]) > 0))


def _model_step_flops(model_cfg: ConfigBase, param_specs: Any, batch_shape: Optional[tuple]):
    """Model FLOPs per step (flops.lm_training_flops) from the model config and batch shape."""
    if not batch_shape or len(batch_shape) < 2:
        return None
    flat = dict(model_cfg.to_flat_dict())
    num_layers = _first_int(flat, r"decoder\.transformer\.num_layers")
    num_heads = _first_int(flat, r"decoder\.transformer\..*attention\.num_heads")
    per_head_dim = _first_int(flat, r"decoder\.transformer\..*attention\.per_head_dim")
    dim = _first_int(flat, r"decoder\.dim")
    if per_head_dim is None and dim and num_heads:
        per_head_dim = dim // num_heads
    tied = flat.get("decoder.lm_head.klass") is None
    return lm_training_flops(
        matmul_params=matmul_param_count(param_specs, tied_embedding=tied),
        num_layers=num_layers or 0,
        num_heads=num_heads or 0,
        per_head_dim=per_head_dim or 0,
        seq_len=int(batch_shape[1]),
        global_batch_size=int(batch_shape[0]),
    )


def _first_int(flat: dict[str, Any], regex: str) -> Optional[int]:
    for key, value in flat.items():
        if re.fullmatch(regex, key) and isinstance(value, (int, np.integer)):
            return int(value)
    return None
