"""Checkpointer: when to save (policy), where (`dir/step_%08d`), what to keep (GC), resume."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any, Callable, Optional

import jax
from absl import logging

from axlearn.common.checkpointer import (
    layout,
    metadata,
    multihost,
    recovery,
    tensorstore_save,
    tf_iterators,
    verify,
)
from axlearn.common.checkpointer.base import BaseCheckpointer
from axlearn.common.checkpointer.policies import CheckpointPolicy, every_n_steps_policy
from axlearn.common.checkpointer.storage import (
    SaveResult,
    SaveStats,
    StateStorage,
    TensorStoreStateStorage,
)
from axlearn.common.checkpointer.tensorstore_restore import CheckpointCorruptionError
from axlearn.common.config import (
    REQUIRED,
    InstantiableConfig,
    Required,
    config_class,
    config_for_function,
)
from axlearn.common.module import Module, nowrap


class Checkpointer(BaseCheckpointer):
    """Saves state trees by policy, asynchronously; restores the newest committed one.

    Usage:

        cfg = Checkpointer.default_config().set(name="checkpointer", dir="/tmp/run/checkpoints")
        ckpt = cfg.instantiate(parent=None)
        with ckpt:  # Starts the GC thread; waits for the last save on exit.
            step, state = ckpt.restore(state=abstract_state)  # step None: nothing to resume.
            ...
            stats = ckpt.save(step=step, state=state)  # None if the policy says no.
    """

    @config_class
    class Config(BaseCheckpointer.Config):
        """Configures Checkpointer."""

        # The checkpoint directory; step `s` goes to `dir/step_%08d`.
        dir: Required[str] = REQUIRED
        # How many of the newest committed checkpoints GC keeps (>= 1).
        keep_last_n: int = 1
        # If set, GC also keeps every committed checkpoint whose step is a multiple of this.
        keep_every_n_steps: Optional[int] = None
        # Seconds between runs of the GC thread (GC also runs after each commit).
        gc_loop_interval_seconds: float = 60
        # A config that instantiates to a CheckpointPolicy: whether to save at a step.
        save_policy: InstantiableConfig = config_for_function(every_n_steps_policy)
        # A config that instantiates to a StateStorage.
        storage: StateStorage.Config = TensorStoreStateStorage.default_config()
        # None or True: `save` returns after the snapshot and writes in the background;
        # False: `save` returns once the checkpoint is committed.
        async_save: Optional[bool] = None
        # What `restore()` does when the newest committed checkpoint is corrupt (unreadable index
        # or a chunk failing its checksum): None or "none" refuses, naming the file; "previous"
        # sets it aside as step_%08d.corrupt-<time> and restores the newest intact older step.
        # Nothing is ever deleted (see checkpointer/recovery.py).
        restore_fallback: Optional[str] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None):
        super().__init__(cfg, parent=parent)
        cfg = self._config
        if not isinstance(cfg.keep_last_n, int) or cfg.keep_last_n < 1:
            raise ValueError(f"{self.path()}.keep_last_n must be >= 1, got {cfg.keep_last_n!r}")
        if cfg.keep_every_n_steps is not None and cfg.keep_every_n_steps < 1:
            raise ValueError(
                f"{self.path()}.keep_every_n_steps must be None or >= 1, got "
                f"{cfg.keep_every_n_steps!r}"
            )
        if cfg.restore_fallback is not None and cfg.restore_fallback not in (
            recovery.RESTORE_FALLBACKS
        ):
            raise ValueError(
                f"{self.path()}.restore_fallback must be one of {recovery.RESTORE_FALLBACKS} "
                f"(or None), got {cfg.restore_fallback!r}"
            )
        if "://" in cfg.dir:
            raise ValueError(
                f"{self.path()}.dir={cfg.dir!r}: only local or mounted filesystem paths are "
                "supported (mount the bucket, e.g. with gcsfuse, and pass the mount path)"
            )
        self._storage: StateStorage = cfg.storage.instantiate()
        self._save_policy: CheckpointPolicy = cfg.save_policy.instantiate()
        self._gc_lock = threading.Lock()
        self._gc_stopping: Optional[threading.Event] = None
        self._gc_thread: Optional[threading.Thread] = None
        self._within_context = False
        self._restore_count = 0

    @property
    def storage(self) -> StateStorage:
        """The state storage."""
        return self._storage

    @property
    def save_policy(self) -> CheckpointPolicy:
        """The save policy: `policy(step=..., evaler_summaries=...)` -> whether to save."""
        return self._save_policy

    @nowrap
    def ckpt_dir(self, step: int) -> str:
        """Returns the directory of `step`: `dir/step_%08d`."""
        return f"{self._config.dir.rstrip('/')}/{layout.step_dir_name(step)}"

    def __enter__(self) -> Checkpointer:
        if self._within_context:
            raise ValueError(
                f"Already in a context: {self.path()} is already in a `with` block (nested "
                "`with checkpointer:` blocks are not supported)"
            )
        self._within_context = True
        self.start_gc_thread()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self._within_context = False
        self.stop()

    @nowrap
    def start_gc_thread(self) -> None:
        """Starts the GC thread on process 0 (it runs every `gc_loop_interval_seconds`)."""
        if self._gc_thread is not None or jax.process_index() != 0:
            return
        self._gc_stopping = threading.Event()
        self._gc_thread = threading.Thread(
            name=f"{self.path()}.gc_loop", target=self._gc_loop, daemon=True
        )
        self._gc_thread.start()

    def _gc_loop(self) -> None:
        while not self._gc_stopping.wait(timeout=self._config.gc_loop_interval_seconds):
            try:
                self.run_garbage_collection()
            except Exception as e:  # pylint: disable=broad-except
                logging.warning("Checkpoint garbage collection failed: %s", e)

    @nowrap
    def stop(self) -> Optional[SaveResult]:
        """Waits for the save in flight (re-raising its error) and stops the GC thread.

        Returns:
            The result of the save that was in flight, if any.
        """
        try:
            return self.wait_until_finished()
        finally:
            if self._gc_thread is not None:
                self._gc_stopping.set()
                self._gc_thread.join()
                self._gc_thread = None

    @nowrap
    def wait_until_finished(self) -> Optional[SaveResult]:
        """Waits for the save in flight, if any, and re-raises its error.

        Returns:
            The result of the save that finished, or None if none was in flight.
        """
        return self._storage.wait_until_finished()

    @nowrap
    def save(
        self,
        *,
        step: int,
        state: Any,
        evaler_summaries: Optional[dict[str, Any]] = None,
        force: bool = False,
        precondition: Optional[Callable[[], None]] = None,
        alias_arrays: bool = False,
    ) -> Optional[SaveStats]:
        """Saves `state` as `step` if the save policy (or `force`) says so.

        With async saves (the default) it waits for the previous save if one is still in flight,
        takes a snapshot of `state` and returns; the state's buffers may be donated right after.
        Call on every process with the same step.

        Args:
            step: The step, in [0, 10**8).
            state: A pytree of jax.Arrays (any sharding), numpy arrays, bytes (saved per process,
                e.g. input iterator state) and bool/int/float/str values.
            evaler_summaries: Passed to the save policy.
            force: Save even if the policy says no (e.g. on preemption).
            precondition: If set, called before anything is written (in the writer thread for
                async saves), e.g. to wait for an on-device check of the snapshot without
                blocking the caller; if it raises, nothing is written and the error is raised
                by the next `save`, `wait_until_finished` or `restore`.
            alias_arrays: If True, the save takes no snapshot copy of the state's jax.Arrays: it
                reads them while it writes (in the background), so the caller must never donate
                or modify them after this call. SpmdTrainer does this on CPU, running the step
                after a save without donation; see docs/checkpoints.md.

        Returns:
            The cost to the caller (`blocking_s`, `wait_for_previous_s`, ...), or None if not saved
            (the policy said no, or `step` is already committed: a committed step is never
            rewritten).

        Raises:
            Exception: The error of the previous async save, if it failed.
        """
        if not force and not self._save_policy(step=step, evaler_summaries=evaler_summaries or {}):
            return None
        cfg = self._config
        ckpt_dir = self.ckpt_dir(step)
        if self._storage.writing_dir() == ckpt_dir:
            self.wait_until_finished()
        if layout.is_committed(ckpt_dir):
            # Rewriting it in place could lose the newest good checkpoint if this process died
            # mid-way (e.g. a preemption save of a step the policy just saved).
            logging.info("Step %d is already committed in %s: not saving it again.", step, ckpt_dir)
            return None
        stats = self._storage.save_to_dir(
            step=step,
            state=tf_iterators.to_saved_state(state),
            ckpt_dir=ckpt_dir,
            on_commit_callback=self._on_commit,
            async_save=cfg.async_save is None or bool(cfg.async_save),
            precondition=precondition,
            alias_arrays=alias_arrays,
        )
        mode = stats.choice.short() if stats.choice is not None else stats.snapshot
        wait = stats.describe_wait()
        # A long wait means saves come more often than the disk writes them: say it loudly.
        (logging.warning if stats.wait_for_previous_s >= 1.0 else logging.info)(
            "Checkpoint of step %d: caller blocked %.3fs (waiting for the previous save %.3fs, "
            "%s snapshot %.3fs, rest %.3fs), %.3f GB from this process, host memory bound "
            "%.3f GB.%s",
            step,
            stats.blocking_s,
            stats.wait_for_previous_s,
            mode,
            stats.snapshot_s,
            stats.other_s,
            stats.num_bytes / 1e9,
            stats.host_bytes / 1e9,
            f" It {wait}." if wait else "",
        )
        return stats

    def _on_commit(self, step: int, ckpt_dir: str) -> None:
        del step, ckpt_dir
        try:
            self.run_garbage_collection()
        except Exception as e:  # pylint: disable=broad-except
            logging.warning("Checkpoint garbage collection failed: %s", e)

    @nowrap
    def run_garbage_collection(self) -> list[str]:
        """Removes old checkpoints and abandoned partial directories (on process 0 only).

        Keeps the newest `keep_last_n` committed checkpoints and those whose step is a multiple
        of `keep_every_n_steps`; never removes the newest committed checkpoint or the directory
        being written. A committed checkpoint is removed only after it verifies (every chunk's
        checksum and its metadata); one that fails is set aside as step_%08d.corrupt-<time>.
        Uncommitted directories older than the newest committed one are abandoned saves and are
        removed, except those whose chunks are complete (an interrupted save after its chunks,
        or an index lost after the save), which are set aside as step_%08d.unindexed-<time>;
        such a set-aside directory is removed only once the keep policy would not keep its step
        if it were committed (`recovery.kept_as_if_committed`).

        Returns:
            The directories removed.
        """
        if jax.process_index() != 0:
            return []
        cfg = self._config
        with self._gc_lock:
            dirs = layout.step_dirs(cfg.dir)
            committed = [step for step, path in dirs if layout.is_committed(path)]
            if not committed:
                return []
            if not _index_readable(dict(dirs)[committed[-1]]):
                # A corrupt newest checkpoint must not count as the one to keep: removing older
                # ones could leave nothing intact. Leave everything for restore's policy.
                logging.error(
                    "The newest checkpoint %s has an unreadable index: garbage collection "
                    "removes nothing until it is dealt with (see `axlearn checkpoint verify`).",
                    dict(dirs)[committed[-1]],
                )
                return []
            keep = set(committed[-cfg.keep_last_n :])
            if cfg.keep_every_n_steps:
                keep.update(s for s in committed if s % cfg.keep_every_n_steps == 0)
            newest = committed[-1]
            writing = self._storage.writing_dir()
            committed_set = set(committed)
            removed = []
            for step, path in dirs:
                if writing is not None and layout.parse_step_from_dir(writing) == step:
                    continue
                if step in committed_set:
                    if step in keep:
                        continue
                    # Only a step that verifies is removed: a corrupt one is kept for inspection.
                    result = verify.verify_checkpoint(path)
                    if not result.ok:
                        logging.error(
                            "Garbage collection does not remove %s: it fails verification (%s); "
                            "setting it aside instead.",
                            path,
                            "; ".join(result.errors[:3]),
                        )
                        recovery.set_aside(path, reason=recovery.REASON_CORRUPT)
                        continue
                elif step > newest:
                    continue
                elif metadata.chunks_complete(path):
                    recovery.set_aside(path, reason=recovery.REASON_UNINDEXED)
                    continue
                logging.info("Removing checkpoint directory %s", path)
                try:
                    tensorstore_save.remove_step_dir(path)
                    removed.append(path)
                except OSError as e:
                    logging.warning("Failed to remove %s: %s", path, e)
            removed.extend(
                recovery.remove_unindexed_older_than(
                    cfg.dir,
                    newest,
                    keep_last_n=cfg.keep_last_n,
                    keep_every_n_steps=cfg.keep_every_n_steps,
                )
            )
            return removed

    @staticmethod
    def checkpoint_paths(base_dir: str) -> list[str]:
        """The committed step directories under `base_dir` (see `layout.checkpoint_paths`)."""
        return layout.checkpoint_paths(base_dir)

    @staticmethod
    def latest_checkpoint_path(base_dir: str) -> str:
        """The newest committed step directory under `base_dir` (AXLearn's static method).

        Args:
            base_dir: The checkpointer's `dir`.

        Returns:
            The step directory's path.

        Raises:
            ValueError: If `base_dir` holds no committed checkpoint.
        """
        path = layout.latest_checkpoint_path(base_dir)
        if path is None:
            raise ValueError(f"No committed checkpoint under {base_dir}")
        return path

    @nowrap
    def latest_step(self) -> Optional[int]:
        """The newest committed step under `dir` (see `latest_checkpoint_step`)."""
        return layout.latest_checkpoint_step(self._config.dir)

    @nowrap
    def restore(self, *, step: Optional[int] = None, state: Any) -> tuple[Optional[int], Any]:
        """Restores a committed checkpoint into the structure, shardings and dtypes of `state`.

        Waits for a save in flight first. Call on every process.

        Args:
            step: The step to restore; None: the newest committed one (uncommitted directories
                are skipped with a warning that names them; a corrupt one is handled by
                `restore_fallback`: refused, or set aside for the newest intact older step).
            state: The target tree: jax.Arrays, or jax.ShapeDtypeStructs with shardings (any mesh
                or device count: the saved shards are resharded), numpy arrays for host arrays,
                and values/bytes of the same kinds as saved.

        Returns:
            (step, restored state), or (None, `state`) if `step` is None and nothing is committed.

        Raises:
            ValueError: If `step` is given but not committed.
            StateMismatchError: If the target's structure, shapes or dtypes differ (naming leaves).
            CorruptCheckpointError: (a CheckpointCorruptionError) If the index or a file is
                corrupt (naming the file and leaf, and the flags that choose what to do).
        """
        cfg = self._config
        self.wait_until_finished()
        if step is not None:
            return step, self._restore_step(step, state)
        while True:
            step = self._choose_restore_step()
            if step is None:
                logging.info("No committed checkpoint under %s: nothing to restore.", cfg.dir)
                return None, state
            try:
                return step, self._restore_step(step, state)
            except recovery.CorruptCheckpointError as e:
                # Chunk-level damage found while reading (every chunk's CRC is checked).
                if cfg.restore_fallback != recovery.FALLBACK_PREVIOUS:
                    raise
                if jax.process_count() > 1:
                    raise recovery.CorruptCheckpointError(
                        recovery.fallback_not_applied_message(self.ckpt_dir(step), e)
                    ) from e
                logging.error("Checkpoint of step %d is corrupt; falling back.", step)
                recovery.set_aside(self.ckpt_dir(step), reason=recovery.REASON_CORRUPT)

    def _choose_restore_step(self) -> Optional[int]:
        """Process 0 picks the step (applying `restore_fallback`); every process gets it."""
        cfg = self._config
        self._restore_count += 1
        value = None
        if jax.process_index() == 0:
            try:
                latest = recovery.choose_restore_step(cfg.dir, fallback=cfg.restore_fallback)
                value = "" if latest is None else str(latest)
            except recovery.CorruptCheckpointError as e:
                value = f"!{e}"
        value = multihost.broadcast_from_process_0(
            f"axlearn_ckpt_restore/{self._restore_count}/{cfg.dir}",
            value,
            timeout_s=float(getattr(self._storage.config, "timeout_secs", 3600)),
        )
        if value.startswith("!"):
            raise recovery.CorruptCheckpointError(value[1:])
        return None if value == "" else int(value)

    def _restore_step(self, step: int, state: Any) -> Any:
        ckpt_dir = self.ckpt_dir(step)
        try:
            index = layout.read_index_file(ckpt_dir)
        except layout.CheckpointIndexError as e:
            if layout.is_committed(ckpt_dir):
                raise recovery.CorruptCheckpointError(recovery.corrupt_message(ckpt_dir, e)) from e
            raise ValueError(
                f"{self.path()}: Cannot restore step {step} from {ckpt_dir}: {e}. Restore a "
                "committed step (`axlearn checkpoint list` shows them)."
            ) from e
        problems = metadata.check_metadata(ckpt_dir, index)
        if problems:
            # Checked before the target: a damaged index must not read as a model mismatch.
            raise recovery.CorruptCheckpointError(
                recovery.corrupt_message(ckpt_dir, "; ".join(problems))
            )
        start = time.perf_counter()
        try:
            restored = self._storage.restore_from_dir(
                step, tf_iterators.to_restore_target(state), ckpt_dir=ckpt_dir, index=index
            )
            restored = tf_iterators.restore_iterators(state, restored)
        except recovery.CorruptCheckpointError:
            raise
        except CheckpointCorruptionError as e:
            raise recovery.CorruptCheckpointError(recovery.corrupt_message(ckpt_dir, e)) from e
        logging.info("Restored %s in %.2fs.", ckpt_dir, time.perf_counter() - start)
        return restored


def _index_readable(step_dir: str) -> bool:
    try:
        layout.read_index_file(step_dir)
    except layout.CheckpointIndexError:
        return False
    return True
