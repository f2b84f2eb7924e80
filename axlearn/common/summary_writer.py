"""Summary writers: TensorBoard event files, a JSONL metrics log, and a composite of writers.

A writer is a `Module` child of the trainer/evaler, called as `writer(step, values)` where
`values` is a nested dict of scalars, strings, arrays and `WeightedScalar`s (possibly on device).
Device values are fetched to the host in ONE batched transfer (`fetch_to_host`) per call.

- `SummaryWriter`: TensorBoard event files via `tf.summary` (TensorFlow is imported when a writer
  is built, never at module import): numbers and 0-d arrays and `WeightedScalar`s as scalars
  (their mean), strings as text, arrays of rank >= 1 as histograms. `log_config` writes the whole
  config dump once, as text under the tag "trainer_config". Only process 0 writes.
- `JsonlWriter`: appends one JSON object per call to `<dir>/metrics.jsonl`:
  `{"step": N, "time": <unix seconds>, "<tag>": value, ...}` with '/'-joined tags as in
  TensorBoard; scalars and strings only (arrays of rank >= 1 go to TensorBoard, not here);
  non-finite floats are written as the strings "NaN", "Infinity", "-Infinity" so every line stays
  strict JSON. Only process 0 writes.
- `CompositeWriter`: several named writers; a child whose `dir` is unset gets `<dir>/<name>`.
- `WandBWriter`: Weights & Biases (the optional `wandb` package, `pip install 'axlearn[wandb]'`):
  scalars and histograms, the config dump as the run config, the run resumed by the id kept in
  its `dir`.

Interface for the trainer:

    writer = SummaryWriter.default_config().set(name="summary_writer", dir=d).instantiate(
        parent=None)
    writer.log_config(trainer_cfg)                 # once
    writer(step, {"loss": loss, "learner": {"lr": lr}})   # every step; writes when due
"""

from __future__ import annotations

import enum
import json
import math
import numbers
import os
import secrets
import time
from collections.abc import Sequence
from functools import wraps
from typing import Any, Callable, Optional

import jax
import numpy as np
from absl import logging

from axlearn.common.config import REQUIRED, ConfigBase, Required, RequiredFieldValue, config_class
from axlearn.common.config_diff import parse_config_dump
from axlearn.common.jsonl_records import (  # noqa: F401 (re-exported: the public path)
    append_whole_line,
    cut_torn_tail,
    move_redone_records,
    redone_path,
)
from axlearn.common.metrics import WeightedSummary
from axlearn.common.module import Module
from axlearn.common.summary import AudioSummary, ImageSummary, Summary
from axlearn.common.utils import NestedTensor, flatten_items


class CheckpointerAction(enum.StrEnum):
    """The checkpointer action a checkpoint summary records.

    Attributes:
        RESTORE: The model was restored from the checkpoint.
        SAVE: The model was saved to the checkpoint.
    """

    RESTORE = "RESTORE"
    SAVE = "SAVE"


def processor_zero_only(fn: Callable) -> Callable:
    """Decorates `fn` to run only on process 0 (elsewhere it returns None).

    Args:
        fn: The function.

    Returns:
        The wrapped function.
    """

    @wraps(fn)
    def wrapper(*args, **kwargs):
        if jax.process_index() == 0:
            return fn(*args, **kwargs)
        return None

    return wrapper


def _is_summary_leaf(x: Any) -> bool:
    return isinstance(x, (WeightedSummary, Summary))


def _average_step_time(step_times: Sequence[float], window: int) -> Optional[float]:
    """The mean of the last `window` step times (all of them if fewer).

    Args:
        step_times: Step durations in seconds, oldest first.
        window: How many of the latest to average.

    Returns:
        The mean, or None when there are no step times or `window` is not positive.
    """
    if window <= 0 or not step_times:
        return None
    recent = list(step_times)[-window:]
    return sum(recent) / len(recent)


def fetch_to_host(values: NestedTensor) -> NestedTensor:
    """Returns `values` with every device array replaced by a NumPy array, in one transfer.

    All device leaves are fetched by a single `jax.device_get` call (which starts every copy
    before waiting on any). Arrays that this process cannot read (sharded over other processes'
    devices and not replicated) become None, with a warning.

    Args:
        values: A tree of arrays, numbers, strings, `WeightedScalar`s, ...

    Returns:
        The same tree with host values.
    """
    leaves, treedef = jax.tree.flatten(values)
    to_fetch, where = [], []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, jax.Array):
            if leaf.is_fully_addressable:
                to_fetch.append(leaf)
            elif leaf.is_fully_replicated:
                to_fetch.append(leaf.addressable_data(0))
            else:
                logging.warning("fetch_to_host: leaf %d is not addressable here; dropped.", i)
                leaves[i] = None
                continue
            where.append(i)
    if to_fetch:
        for i, host in zip(where, jax.device_get(to_fetch)):
            leaves[i] = host
    return jax.tree.unflatten(treedef, leaves)


def _is_unset(value: Any) -> bool:
    return value is None or isinstance(value, RequiredFieldValue)


def _open_for_append(path: str):
    """Opens a local or remote ("scheme://") file for appending text."""
    if "://" in path:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        return tf.io.gfile.GFile(path, "a")
    return open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with


def _makedirs(path: str) -> None:
    if "://" in path:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        tf.io.gfile.makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


class BaseWriter(Module):
    """Base summary writer: `writer(step, values)` writes a tree of values for `step`."""

    @config_class
    class Config(Module.Config):
        """Configures BaseWriter."""

        # The output directory.
        dir: Required[str] = REQUIRED

    def log_config(self, config: ConfigBase, step: int = 0) -> None:
        """Writes `config` (its dump) once.

        Args:
            config: The config to log.
            step: The step to log it at.
        """
        raise NotImplementedError(type(self))

    def log_checkpoint(
        self, ckpt_dir: str, *, state: NestedTensor, action: CheckpointerAction, step: int = 0
    ) -> None:
        """Records a checkpoint save/restore. The default does nothing.

        Args:
            ckpt_dir: The checkpoint directory.
            state: The checkpointed state.
            action: SAVE or RESTORE.
            step: The step.
        """
        del ckpt_dir, state, action, step

    def writing_at_step(self, step: int) -> bool:
        """Whether `__call__` writes at `step` (the trainer skips building values otherwise)."""
        del step
        return True

    def flush(self) -> None:
        """Flushes buffered output. The default does nothing."""

    def _average_step_time_window(self) -> int:
        """Steps between `average_step_time` records, and how many step times each averages."""
        return getattr(self.config, "write_every_n_steps", None) or 100

    def log_average_step_time(self, *, step: int, step_times: Sequence[float]) -> None:
        """Writes "average_step_time", the mean of the latest step times, every N steps.

        N is the writer's `write_every_n_steps` (100 for writers without one); the mean is over
        the last N entries of `step_times`.

        Args:
            step: The current step (a record is written when it is a multiple of N).
            step_times: Recent step durations in seconds, oldest first.
        """
        window = self._average_step_time_window()
        if step % window != 0:
            return
        average = _average_step_time(step_times, window)
        if average is not None:
            self(step, {"average_step_time": average})

    # pylint: disable-next=arguments-differ
    def __call__(self, step: int, values: dict[str, Any]) -> None:
        """Writes `values` for `step`.

        Args:
            step: The step.
            values: A nested dict of values.
        """
        raise NotImplementedError(type(self))


class NoOpWriter(BaseWriter):
    """A writer that writes nothing."""

    def log_config(self, config: ConfigBase, step: int = 0) -> None:
        del config, step

    def __call__(self, step: int, values: dict[str, Any]) -> None:
        del step, values


class CompositeWriter(BaseWriter):
    """Writes to several named writers; a child without `dir` writes under `<dir>/<name>`.

    Device values are fetched once here and the host tree is passed to every child.
    """

    @config_class
    class Config(BaseWriter.Config):
        """Configures CompositeWriter."""

        # The writers by name (each name a valid module name).
        writers: Required[dict[str, BaseWriter.Config]] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._writers: list[BaseWriter] = []
        for name, writer_cfg in cfg.writers.items():
            writer_cfg = writer_cfg.clone()
            if _is_unset(writer_cfg.dir):
                writer_cfg.dir = os.path.join(cfg.dir, name)
            self._writers.append(self._add_child(name, writer_cfg))

    @property
    def writers(self) -> list[BaseWriter]:
        """The child writers, in config order."""
        return self._writers

    def log_config(self, config: ConfigBase, step: int = 0) -> None:
        for writer in self._writers:
            writer.log_config(config, step=step)

    def log_checkpoint(
        self, ckpt_dir: str, *, state: NestedTensor, action: CheckpointerAction, step: int = 0
    ) -> None:
        for writer in self._writers:
            writer.log_checkpoint(ckpt_dir, state=state, action=action, step=step)

    def writing_at_step(self, step: int) -> bool:
        return any(w.writing_at_step(step) for w in self._writers)

    def log_average_step_time(self, *, step: int, step_times: Sequence[float]) -> None:
        for writer in self.writers:
            writer.log_average_step_time(step=step, step_times=step_times)

    def flush(self) -> None:
        for writer in self._writers:
            writer.flush()

    def __call__(self, step: int, values: dict[str, Any]) -> None:
        if not self.writing_at_step(step):
            return
        values = fetch_to_host(values)
        for writer in self._writers:
            writer(step, values)


def _host_value(value: Any) -> Any:
    """Unwraps a WeightedSummary to its mean; converts 0-d arrays to NumPy scalars."""
    if isinstance(value, WeightedSummary):
        value = value.mean
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    return value


def _summary_pb2():
    """TensorBoard's Summary protos (imported when first needed: tensorboard comes with TF)."""
    from tensorboard.compat.proto import summary_pb2  # pylint: disable=import-outside-toplevel

    return summary_pb2


def _add_scalar(summary: Any, tag: str, value: Any) -> None:
    """Adds `value` to `summary` as `tf.summary.scalar(tag, value)` writes it.

    That is a 0-d float32 tensor (its bytes in `tensor_content`) with the "scalars" plugin's
    metadata.
    """
    entry = summary.value.add(tag=tag)
    entry.metadata.plugin_data.plugin_name = "scalars"
    entry.tensor.dtype = 1  # DT_FLOAT.
    entry.tensor.tensor_shape.SetInParent()
    entry.tensor.tensor_content = np.asarray(value, dtype=np.float32).tobytes()


class SummaryWriter(BaseWriter):
    """Writes TensorBoard event files with `tf.summary` (process 0 only).

    Scalars (numbers, 0-d arrays, WeightedScalar means) are written as `tf.summary.scalar`
    writes them (all of a step's in one Summary), strings with `tf.summary.text`, arrays of
    rank >= 1 with `tf.summary.histogram`.
    """

    @config_class
    class Config(BaseWriter.Config):
        """Configures SummaryWriter (see tf.summary.create_file_writer)."""

        # Write summaries only at steps divisible by this.
        write_every_n_steps: int = 1
        # Summaries buffered before a flush; None: the tf.summary default (10).
        max_queue: Optional[int] = None
        # Longest interval between flushes in milliseconds; None: the tf.summary default (2 min).
        flush_ms: Optional[float] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.write_every_n_steps < 1:
            raise ValueError(
                f"{self.path()}.write_every_n_steps must be >= 1, got {cfg.write_every_n_steps}"
            )
        from tensorflow import summary as tf_summary  # pylint: disable=import-outside-toplevel

        self._tf_summary = tf_summary
        if jax.process_index() == 0:
            self._writer = tf_summary.create_file_writer(
                cfg.dir, max_queue=cfg.max_queue, flush_millis=cfg.flush_ms
            )
        else:
            self._writer = tf_summary.create_noop_writer()

    def writing_at_step(self, step: int) -> bool:
        return step % self.config.write_every_n_steps == 0

    def log_config(self, config: ConfigBase, step: int = 0) -> None:
        """Writes the config dump as text: "trainer_config" (one row per line), and one
        "trainer_config/<path>" summary per field holding the value's repr (as AXLearn does)."""
        dump = config.debug_string()
        lines = dump.split("\n")
        with self._writer.as_default():
            self._tf_summary.text("trainer_config", lines, step=step)
            for path, value in parse_config_dump(dump, strict=False).items():
                self._tf_summary.text(f"trainer_config/{path}", value, step=step)
        self._writer.flush()

    def flush(self) -> None:
        self._writer.flush()

    def __call__(self, step: int, values: dict[str, Any]) -> None:
        if not self.writing_at_step(step):
            return
        values = fetch_to_host(values)
        tf_summary = self._tf_summary
        # All scalars of a step go out as ONE Summary proto in one op: `tf.summary.scalar` runs
        # an eager TF op per scalar (~0.5 ms of host CPU each, ~10 ms per step for the trainer's
        # two dozen scalars). The proto is what `tf.summary.scalar` writes (a float32 tensor with
        # the "scalars" plugin's metadata), so readers see the same events.
        scalars = _summary_pb2().Summary()
        with self._writer.as_default(step=step):
            for path, value in flatten_items(values, is_leaf=_is_summary_leaf):
                if isinstance(value, AudioSummary):
                    audio = np.asarray(value.value(), dtype=np.float32)
                    tf_summary.audio(path, audio[None], value.sample_rate, step=step)
                    continue
                if isinstance(value, ImageSummary):
                    tf_summary.image(path, np.asarray(value.value()), step=step)
                    continue
                value = _host_value(value)
                if value is None or isinstance(value, Summary):
                    continue
                if isinstance(value, (str, bytes)):
                    tf_summary.text(path, value, step=step)
                elif isinstance(value, (numbers.Number, np.generic)):
                    _add_scalar(scalars, path, value)
                elif isinstance(value, np.ndarray):
                    tf_summary.histogram(path, value, step=step)
                else:
                    logging.warning(
                        "SummaryWriter %s: does not know how to write %s (%s).",
                        self.path(),
                        path,
                        type(value).__name__,
                    )
            if scalars.value:
                tf_summary.experimental.write_raw_pb(scalars.SerializeToString(), step=step)
        self._writer.flush()


def _json_value(value: Any) -> Any:
    """Returns a JSON-ready scalar, or `_SKIP` for values that do not belong in the JSONL."""
    value = _host_value(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (numbers.Integral, np.integer)):
        return int(value)
    if isinstance(value, (numbers.Real, np.floating)):
        value = float(value)
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    return _SKIP


_SKIP = object()


class JsonlWriter(BaseWriter):
    """Appends one JSON record per call to `<dir>/<filename>` (process 0 only).

    A record is `{"step": N, "time": unix_seconds, "<tag>": value, ...}` with '/'-joined tags;
    scalars and strings only. On a resumed run, the records of the steps computed again (those
    after the restored checkpoint) are moved to `<filename stem>.redone.jsonl` before the first
    append (`move_redone_records`), so the file holds one record per step: the one whose result
    counts. Lines are appended whole (`append_whole_line`: a write
    that fails, e.g. on a full disk, leaves no part of its line, and the error names the file);
    a torn last line left by an earlier process is cut, with a warning, before the first append.
    """

    @config_class
    class Config(BaseWriter.Config):
        """Configures JsonlWriter."""

        # Write a record only at steps divisible by this.
        write_every_n_steps: int = 1
        # The file name inside `dir`.
        filename: str = "metrics.jsonl"

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.write_every_n_steps < 1:
            raise ValueError(
                f"{self.path()}.write_every_n_steps must be >= 1, got {cfg.write_every_n_steps}"
            )
        self._path = os.path.join(cfg.dir, cfg.filename)
        # Whether a torn last line left by an earlier run has been cut (before the first append).
        self._tail_checked = False
        if jax.process_index() == 0:
            _makedirs(cfg.dir)

    @property
    def file_path(self) -> str:
        """The JSONL file's path."""
        return self._path

    def writing_at_step(self, step: int) -> bool:
        return step % self.config.write_every_n_steps == 0

    def log_config(self, config: ConfigBase, step: int = 0) -> None:
        """Does nothing: the launcher writes the config dump to the trainer directory."""
        del config, step

    def __call__(self, step: int, values: dict[str, Any]) -> None:
        if not self.writing_at_step(step) or jax.process_index() != 0:
            return
        values = fetch_to_host(values)
        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        for path, value in flatten_items(values, is_leaf=_is_summary_leaf):
            converted = _json_value(value)
            if converted is not _SKIP:
                record[path] = converted
        line = json.dumps(record, allow_nan=False) + "\n"
        if "://" in self._path:
            with _open_for_append(self._path) as f:
                f.write(line)
            return
        if not self._tail_checked:
            cut_torn_tail(self._path)
            move_redone_records(self._path, first_step=int(step))
            self._tail_checked = True
        append_whole_line(self._path, line, what=f"the step {step} record")


# The file in a WandBWriter's `dir` holding its W&B run id, so that a restarted job resumes the run.
WANDB_RUN_ID_FILE = "wandb_run_id"


def _import_wandb():
    try:
        import wandb  # pylint: disable=import-outside-toplevel
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "WandBWriter needs the `wandb` package: pip install 'axlearn[wandb]'"
        ) from e
    return wandb


class WandBWriter(BaseWriter):
    """Logs to Weights & Biases with the `wandb` package (process 0 only; the [wandb] extra).

    Scalars (numbers, 0-d arrays, WeightedScalar means) are logged with `wandb.log(..., step=)`
    under their '/'-joined paths, arrays of rank >= 1 as `wandb.Histogram`s, strings are skipped.
    `log_config` sets the flattened config (`path: repr`) as the run config. The run id is kept in
    `<dir>/wandb_run_id`: a restarted job with the same `dir` resumes the same run. The W&B mode
    (online, offline, disabled) is `mode` or, if unset, the `WANDB_MODE` environment variable.
    """

    @config_class
    class Config(BaseWriter.Config):
        """Configures WandBWriter (see `wandb.init`)."""

        # The run's display name; None: a name chosen by W&B.
        exp_name: Optional[str] = None
        # The W&B project; None: wandb's default (WANDB_PROJECT or "uncategorized").
        project: Optional[str] = None
        # The W&B entity (user or team); None: the account's default.
        entity: Optional[str] = None
        # The run's group; None: no group.
        group: Optional[str] = None
        # Tags of the run.
        tags: Optional[list[str]] = None
        # "online", "offline" or "disabled"; None: WANDB_MODE or wandb's default (online).
        mode: Optional[str] = None
        # Log only at steps divisible by this.
        write_every_n_steps: int = 1

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.write_every_n_steps < 1:
            raise ValueError(
                f"{self.path()}.write_every_n_steps must be >= 1, got {cfg.write_every_n_steps}"
            )
        if cfg.mode not in (None, "online", "offline", "disabled"):
            raise ValueError(
                f"{self.path()}.mode must be online, offline or disabled, got {cfg.mode!r}"
            )
        self._run = None
        if jax.process_index() == 0:
            self._wandb = _import_wandb()
            self._run = self._init_run()

    @property
    def run(self) -> Any:
        """The `wandb` run (None on processes other than 0)."""
        return self._run

    def _init_run(self):
        cfg = self.config
        _makedirs(cfg.dir)
        id_path = os.path.join(cfg.dir, WANDB_RUN_ID_FILE)
        if os.path.exists(id_path):
            with open(id_path, encoding="utf-8") as f:
                run_id = f.read().strip()
        else:
            run_id = secrets.token_hex(6)  # W&B ids: lowercase letters and digits.
            with open(id_path, "w", encoding="utf-8") as f:
                f.write(run_id + "\n")
        return self._wandb.init(
            id=run_id,
            resume="allow",
            # Several writers (trainer, evalers) may each hold a run in one process.
            reinit="create_new",
            name=cfg.exp_name,
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group,
            tags=cfg.tags,
            mode=cfg.mode,
            dir=cfg.dir,
        )

    def writing_at_step(self, step: int) -> bool:
        return step % self.config.write_every_n_steps == 0

    def log_config(self, config: ConfigBase, step: int = 0) -> None:
        """Sets the run config to `config`'s flattened fields (`path: repr(value)`)."""
        del step
        if self._run is None:
            return
        flat = parse_config_dump(config.debug_string(), strict=False)
        self._run.config.update(flat, allow_val_change=True)

    def __call__(self, step: int, values: dict[str, Any]) -> None:
        if self._run is None or not self.writing_at_step(step):
            return
        values = fetch_to_host(values)
        record = {}
        for path, value in flatten_items(values, is_leaf=_is_summary_leaf):
            value = _host_value(value)
            if isinstance(value, (bool, np.bool_)):
                record[path] = int(value)
            elif isinstance(value, (numbers.Number, np.generic)):
                record[path] = value.item() if isinstance(value, np.generic) else value
            elif isinstance(value, np.ndarray) and value.size:
                record[path] = self._wandb.Histogram(np.asarray(value, np.float64))
        if record:
            self._run.log(record, step=int(step))

    def finish(self) -> None:
        """Ends the run (flushes everything to disk or the server). Further calls do nothing."""
        if self._run is not None:
            self._run.finish()
            self._run = None
