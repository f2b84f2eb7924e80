"""The trainer's checkpoint driver: restore, save (never a non-finite state), preemption save.

`CheckpointDriver` is a part that `SpmdTrainer` owns (see docs/trainer.md); it is the only part
that talks to the trainer's checkpointer. `TrainerState`, `NonFiniteStateError` and
`SnapshotMemoryError` are also importable from `axlearn.common.trainer`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional

import jax
from absl import logging

from axlearn.common import file_access, utils
from axlearn.common.trainer_utils import all_finite

# In the checkpointer dir: the `restore_step` already applied (JSON {"step": N}).
RESTORE_STEP_MARKER = "restore_step_applied"


class TrainerState(NamedTuple):
    """The state the trainer trains and checkpoints."""

    # The PRNG key of the next step.
    prng_key: Any
    # The model parameters.
    model: Any
    # The learner (optimizer) state.
    learner: Any


class NonFiniteStateError(RuntimeError):
    """The trainer state holds NaN/inf values; it is never checkpointed."""


class SnapshotMemoryError(RuntimeError):
    """A train step could not allocate device memory while a checkpoint snapshot held some."""


def _is_resource_exhausted(error: BaseException) -> bool:
    return "RESOURCE_EXHAUSTED" in str(error) or "Out of memory" in str(error)


def snapshot_memory_message(
    *,
    step: int,
    error: BaseException,
    held_bytes: int,
    saved_step: Optional[int],
    peak_bytes: Optional[int],
    limit_bytes: Optional[int],
) -> str:
    """The one-line message of a `SnapshotMemoryError` (both numbers and the fixes).

    Args:
        step: The step that failed.
        error: The allocation error.
        held_bytes: Bytes per device the snapshot held on the device when the step started.
        saved_step: The step whose snapshot it is.
        peak_bytes: The step's compiled peak per device, if known.
        limit_bytes: The device memory limit, if known.

    Returns:
        The message.
    """
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    need = f"{peak_bytes / 1e9:.2f} GB" if peak_bytes else "an unknown amount"
    limit = f" of the {limit_bytes / 1e9:.2f} GB limit" if limit_bytes else ""
    return (
        f"Step {step} could not allocate device memory ({first}) while the checkpoint snapshot "
        f"of step {saved_step} held {held_bytes / 1e9:.2f} GB per device on the device; the "
        f"step needs {need} (compiled peak){limit}. Set checkpointer.storage.snapshot='host' "
        "(or 'partial'), or leave more device memory to JAX (XLA_PYTHON_CLIENT_MEM_FRACTION)."
    )


class _DeferredFinite:
    """The finiteness flag of a saved state, computed by the next step (fused with it).

    On CPU a save references the state and the step after it runs without donation; that step
    also reduces its input state (the saved one) to one finiteness flag, which costs almost
    nothing inside the step but ~16 ms (a full read of a P1-sized state) as a computation of
    its own. The checkpointer's writer waits for the flag before writing anything. If no step
    follows the save (end of run, preemption, an error), `resolve` computes the flag directly.
    """

    def __init__(self, tree: Any):
        self._tree = tree  # The saved floats, for `resolve` (held by the save anyway).
        self._event = threading.Event()
        self._value: Any = None

    def set(self, value: Any) -> None:
        """Sets the flag (a device boolean) from the step that read the saved state."""
        if not self._event.is_set():
            self._value, self._tree = value, None
            self._event.set()

    def resolve(self) -> None:
        """Computes the flag directly if no step has set it."""
        if not self._event.is_set():
            self.set(all_finite(self._tree))

    def get(self) -> bool:
        """Waits for the flag (set by the next step's dispatch or `resolve`); returns it."""
        self._event.wait()
        return bool(self._value)


def input_is_checkpointable(input_module: Any) -> bool:
    """Whether `input_module` can save and restore its iterator's position.

    Args:
        input_module: The trainer's input.

    Returns:
        True if it has `iterator_state` and `restore_iterator`.
    """
    return hasattr(input_module, "iterator_state") and hasattr(input_module, "restore_iterator")


def new_input_iterator(input_module: Any) -> Any:
    """An iterator of host batches (dicts of NumPy arrays) from the start of `input_module`.

    Inputs that can save their position (`iter(input)` + `iterator_state`) are iterated
    directly so the iterator can be checkpointed; others through `dataset()`.

    Args:
        input_module: The trainer's input.

    Returns:
        The iterator.
    """
    if input_is_checkpointable(input_module):
        return iter(input_module)
    dataset = input_module.dataset() if hasattr(input_module, "dataset") else input_module
    if hasattr(dataset, "as_numpy_iterator"):
        return dataset.as_numpy_iterator()
    return iter(dataset)


def checkpointed_floats(state: TrainerState) -> Any:
    """The parts of `state` checked for NaN/inf before each save (parameters, learner state).

    Args:
        state: A trainer state.

    Returns:
        (model, learner).
    """
    return (state.model, state.learner)


class RestoredState(NamedTuple):
    """What `CheckpointDriver.restore` read."""

    # The restored step.
    step: int
    # The restored trainer state.
    trainer_state: TrainerState
    # The input iterator, resumed at the saved position (None: not in the checkpoint, or not
    # asked for).
    input_iterator: Optional[Any]


class CheckpointDriver:
    """Drives the trainer's checkpointer: save policy, snapshot, restore, preemption save.

    A part that `SpmdTrainer` owns (see docs/trainer.md). The trainer passes it the state and
    step to save; it never reads the trainer. Interface: `restore`, `restore_step_to_apply`,
    `due`, `save`, `save_timed`, `take_split`, `finish`, `save_for_preemption`,
    `choose_snapshot`, `prepare_transfer`, `saves_alias_state`, `take_state_hold`,
    `resolve_pending_finite`, `memory_guard`; and the read-only `snapshot_choice`,
    `end_of_run_wait_s`, `next_step_keeps_state`.
    """

    def __init__(
        self,
        checkpointer: Any,
        *,
        mesh: jax.sharding.Mesh,
        state_specs: TrainerState,
        state_shardings: TrainerState,
        input_module: Any,
        save_input_iterator: bool,
        restore_step: Optional[int],
        config_path: str,
        log: Callable[..., None],
    ):
        """Builds the driver.

        Args:
            checkpointer: The trainer's checkpointer (a child module).
            mesh: The device mesh.
            state_specs: The trainer state's specs (TensorSpecs).
            state_shardings: The trainer state's NamedShardings.
            input_module: The trainer's input (its iterator position may be saved).
            save_input_iterator: Whether checkpoints include the input iterator position.
            restore_step: The trainer's `restore_step` (None: the newest committed step).
            config_path: The trainer's config path (named in errors).
            log: Logs a message (the trainer's step log: `log(msg, *args)`).
        """
        self._checkpointer = checkpointer
        self._mesh = mesh
        self._state_specs = state_specs
        self._state_shardings = state_shardings
        self._input = input_module
        self._save_input_iterator = bool(save_input_iterator)
        self._restore_step = restore_step
        self._path = config_path
        self._log = log
        # The checkpoint snapshot chosen for this run (see `choose_snapshot`).
        self.snapshot_choice: Any = None
        # The step of the last save (None: none in this process).
        self.last_saved_step: Optional[int] = None
        # Seconds the end of the run waited for the last save's write.
        self.end_of_run_wait_s: Optional[float] = None
        # Set by a save that referenced the state (CPU): the next step must not donate it.
        self._state_held_by_save = False
        # That save's finiteness flag, set by the next step (see _DeferredFinite).
        self._pending_finite: Optional[_DeferredFinite] = None
        # The parts of the last save's blocking time, for the next step record.
        self._pending_split: Optional[dict[str, Any]] = None
        # The compiled step's peak bytes per device (for SnapshotMemoryError).
        self._snapshot_peak_bytes: Optional[int] = None
        # Seconds the last save spent reading the input iterator's position.
        self._input_state_s = 0.0

    def _with_mesh(self):
        return jax.set_mesh(self._mesh)

    def _storage(self) -> Any:
        return getattr(self._checkpointer, "storage", None)

    # ------------------------------------------------------------------------------------------
    # Restore.
    # ------------------------------------------------------------------------------------------

    def restore(self, restore_step: Optional[int] = None) -> Optional[RestoredState]:
        """Restores the latest committed checkpoint (or `restore_step`) into the state shardings.

        If the checkpoint holds an input iterator position (and `save_input_iterator` is set),
        the input resumes from it; a checkpoint saved with the other `save_input_iterator`
        setting is restored too (the input then starts from its beginning).

        Args:
            restore_step: The step to restore; None: the latest committed one, if any.

        Returns:
            The restored step, state and input iterator, or None if there was nothing to restore.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.checkpointer import StateMismatchError

        checkpointable = input_is_checkpointable(self._input)
        with_input = self._save_input_iterator and checkpointable
        with self._with_mesh():
            try:
                step, state = self._checkpointer.restore(
                    step=restore_step, state=self.state_spec(with_input=with_input)
                )
            except StateMismatchError as e:
                if e.paths - {"input_iter"}:
                    raise  # The model differs: the input iterator is not the cause.
                # Not a failure: e.g. an imported (hf import) or AXLearn checkpoint has no input
                # position, or this run does not restore the one it has.
                logging.info(
                    "%s: restoring the model and optimizer state; the input starts from its "
                    "beginning.",
                    "The checkpoint holds no input position (imported, or saved with "
                    "save_input_iterator=False)"
                    if with_input
                    else "The checkpoint holds an input position this run does not restore "
                    "(save_input_iterator=False)",
                )
                with_input = not with_input and checkpointable
                step, state = self._checkpointer.restore(
                    step=restore_step, state=self.state_spec(with_input=with_input)
                )
        if step is None:
            return None
        trainer_state = TrainerState(
            **{k: v for k, v in state.items() if k in TrainerState._fields}
        )
        input_iterator = None
        if self._save_input_iterator and "input_iter" in state:
            # pylint: disable-next=import-outside-toplevel
            from axlearn.common.input_iterator import InputStateError

            try:
                input_iterator = self._input.restore_iterator(state["input_iter"])
            except InputStateError as e:  # Name where the state was read from.
                where = getattr(self._checkpointer, "ckpt_dir", None)
                where = where(int(step)) if callable(where) else f"step {int(step)}"
                raise InputStateError(
                    f"{where} (leaf 'input_iter', process {jax.process_index()}): {e}"
                ) from None
        return RestoredState(
            step=int(step), trainer_state=trainer_state, input_iterator=input_iterator
        )

    def restore_step_to_apply(self) -> Optional[int]:
        """The step `restore_step` asks for, the first time only (None: the newest one).

        Applying it sets every newer step directory aside (nothing is deleted) and records the
        step in `<checkpointer dir>/restore_step_applied`, so that a restart with the same flag
        resumes from the run's newer checkpoints instead of discarding them again.

        Returns:
            The step to restore, or None for the newest committed one.

        Raises:
            ValueError: If `restore_step` is not a committed checkpoint.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.checkpointer import layout, recovery

        step = self._restore_step
        if step is None:
            return None
        ckpt_dir = self._checkpointer.config.dir
        marker = os.path.join(ckpt_dir, RESTORE_STEP_MARKER)
        try:
            applied = file_access.read_json(
                ckpt_dir, RESTORE_STEP_MARKER, max_bytes=4096, max_depth=4
            )
            if isinstance(applied, dict) and applied.get("step") == step:
                self._log(
                    "restore_step=%d was applied by an earlier start (%s); resuming from "
                    "the newest checkpoint.",
                    step,
                    marker,
                )
                return None
        except (OSError, ValueError):
            pass
        step_dir = self._checkpointer.ckpt_dir(step)
        if not layout.is_committed(step_dir):
            raise recovery.RestoreStepError(
                recovery.restore_step_message(f"{self._path}.restore_step", ckpt_dir, step)
            )
        if jax.process_index() == 0:
            # Read the chosen step's index before anything is renamed.
            try:
                layout.read_index_file(step_dir)
            except layout.CheckpointIndexError as e:
                raise recovery.CorruptCheckpointError(recovery.corrupt_message(step_dir, e)) from e
            recovery.supersede_newer(ckpt_dir, step)
            layout.write_json_atomically(marker, {"step": step}, root=ckpt_dir)
        return step

    def state_spec(self, *, with_input: bool) -> dict[str, Any]:
        """The tree of (shape, dtype, sharding) the checkpointer restores into.

        Args:
            with_input: Whether the tree has the input iterator position.

        Returns:
            {prng_key, model, learner[, input_iter]}.
        """

        def spec(s, sharding):
            return jax.ShapeDtypeStruct(shape=tuple(s.shape), dtype=s.dtype, sharding=sharding)

        specs = jax.tree.map(
            spec,
            self._state_specs,
            self._state_shardings,
            is_leaf=lambda x: isinstance(x, (utils.TensorSpec, jax.ShapeDtypeStruct)),
        )
        state = specs._asdict()
        if with_input:
            state["input_iter"] = b""
        return state

    # ------------------------------------------------------------------------------------------
    # Save.
    # ------------------------------------------------------------------------------------------

    def due(self, step: int, evaler_summaries: Optional[dict[str, Any]]) -> bool:
        """Whether the checkpointer's save policy saves `step` (True if it has no policy).

        Args:
            step: The step.
            evaler_summaries: The step's evaler summaries ({name: None} for evalers that did
                not run).

        Returns:
            Whether to save.
        """
        policy = getattr(self._checkpointer, "save_policy", None)
        if policy is None:
            return True
        return bool(policy(step=step, evaler_summaries=evaler_summaries))

    def save(
        self,
        *,
        step: int,
        state: TrainerState,
        input_iterator: Any,
        evaler_summaries: Optional[dict[str, Any]],
        force: bool = False,
        streak: int = 0,
    ) -> Any:
        """Saves `state` (the caller checked the policy); never a non-finite state.

        On CPU the save references the state's arrays instead of copying them, and the next
        step runs without donation (see `saves_alias_state`).

        The state's finiteness is reduced to one flag on the device (on CPU by the next step,
        see `_DeferredFinite`); the checkpointer's writer reads it before writing anything
        (`precondition`), so the loop does not wait for it. A non-finite state is not written:
        NonFiniteStateError is raised by the next save or at the end of the run (at once for
        synchronous saves).

        Args:
            step: The state's step.
            state: The trainer state.
            input_iterator: The input iterator (its position is saved if configured).
            evaler_summaries: The step's evaler summaries (for the checkpointer).
            force: Save whatever the policy says (and even within a streak of skipped steps).
            streak: The length of the current streak of skipped steps (0: none).

        Returns:
            The checkpointer's `SaveStats`, or None if it did not save.
        """
        if streak and not force:
            # The skipped steps left the parameters as they were before the streak; a streak
            # that reaches its limit stops the run, and none of its steps is a checkpoint.
            logging.info(
                "Not saving step %d: it is step %d of a streak of skipped steps.", step, streak
            )
            return None
        self.resolve_pending_finite()
        alias = self.saves_alias_state()
        if alias:
            # The next step (non-donating) computes the flag of its input, this state.
            finite = self._pending_finite = _DeferredFinite(checkpointed_floats(state))
        else:
            # Dispatched before the state's buffers can be donated to the next step.
            finite = all_finite(checkpointed_floats(state))

        def require_finite():
            if not (finite.get() if alias else bool(finite)):
                raise NonFiniteStateError(
                    f"Step {step}: the trainer state (parameters or optimizer state) holds "
                    "NaN/inf values; refusing to checkpoint it. The last committed checkpoint "
                    "is kept."
                )

        ckpt_state = state._asdict()
        start = time.perf_counter()
        if self._save_input_iterator and input_is_checkpointable(self._input):
            ckpt_state["input_iter"] = self._input.iterator_state(input_iterator)
        self._input_state_s = time.perf_counter() - start
        with self._with_mesh():
            stats = self._checkpointer.save(
                step=step,
                state=ckpt_state,
                evaler_summaries=evaler_summaries,
                force=force,
                precondition=require_finite,
                alias_arrays=alias,
            )
        # The save may read these arrays until its write is done: the next step keeps them.
        self._state_held_by_save = alias
        self.last_saved_step = step
        return stats

    def save_timed(self, timer: Any, **save_kwargs) -> None:
        """`save` as the step's "checkpoint" overhead, split into its parts for the step record:
        the snapshot, waiting for the previous save, and the rest (see `take_split`).

        Args:
            timer: The run's `StepTimer`.
            **save_kwargs: The arguments of `save`.
        """
        before = timer.pending_overheads().get("checkpoint", 0.0)
        with timer.overhead("checkpoint"):
            stats = self.save(**save_kwargs)
        total = timer.pending_overheads().get("checkpoint", 0.0) - before
        if stats is None:
            return
        snapshot = stats.snapshot
        if stats.choice is not None:
            snapshot = stats.choice.short()
        elif self.snapshot_choice is not None and stats.snapshot == "reference":
            snapshot = "reference (CPU: no copy, the next step keeps the state)"
        split = dict(
            blocking_s=total,
            snapshot_s=stats.snapshot_s,
            wait_for_previous_s=stats.wait_for_previous_s,
            other_s=max(0.0, total - stats.snapshot_s - stats.wait_for_previous_s),
            # Part of the rest: reading the input iterator's position.
            input_position_s=self._input_state_s,
            snapshot=snapshot,
        )
        split["waited"] = bool(stats.waited)
        if stats.waited and stats.previous is not None:
            split["previous_write_gb_per_s"] = stats.previous.write_gb_per_s
            split["previous_write_s"] = stats.previous.write_s
        self._pending_split = split

    def take_split(self) -> Optional[dict[str, Any]]:
        """The parts of the save charged to the step being recorded (then cleared)."""
        split, self._pending_split = self._pending_split, None
        return split

    def finish(self) -> None:
        """At the end of the run: waits for the last save's write; records the wait."""
        self.resolve_pending_finite()
        start = time.perf_counter()
        try:
            self._checkpointer.wait_until_finished()
        finally:
            self.end_of_run_wait_s = time.perf_counter() - start

    def save_for_preemption(
        self,
        *,
        step: int,
        state: TrainerState,
        input_iterator: Any,
        set_activity: Callable[[str], None],
    ) -> None:
        """Saves step `step` (unless its save policy just did) and waits until it is committed.

        Args:
            step: The finished step.
            state: Its trainer state.
            input_iterator: The input iterator.
            set_activity: Tells the preemption handler what the process is doing.
        """
        if self.last_saved_step != step:
            set_activity(f"saving step {step}")
            self.save(
                step=step,
                state=state,
                input_iterator=input_iterator,
                evaler_summaries=None,
                force=True,
            )
        set_activity(f"committing step {step}")
        self.resolve_pending_finite()
        self._checkpointer.wait_until_finished()

    # ------------------------------------------------------------------------------------------
    # Snapshot and the train step.
    # ------------------------------------------------------------------------------------------

    def choose_snapshot(self, compiled: Any) -> None:
        """Chooses where this run's checkpoint snapshots live, from the compiled step's peak
        memory, the state's bytes per device and each device's limit (logged once).

        Args:
            compiled: The compiled train step.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.device_memory import compiled_memory_stats

        choose = getattr(self._storage(), "choose_snapshot", None)
        if choose is None:
            return
        memory = compiled_memory_stats(compiled)
        peak = None
        if memory is not None:
            # XLA's peak estimate can be below argument + output + temp (on CPU it reports the
            # arguments alone): take the larger, so a device copy is never planned into memory
            # the step needs.
            peak = max(memory.peak_bytes or 0, memory.total_bytes)
        self._snapshot_peak_bytes = peak
        with self._with_mesh():
            self.snapshot_choice = choose(self.state_spec(with_input=False), step_peak_bytes=peak)
        if self.snapshot_choice is None:
            return
        # The storage logged the choice and its numbers (once, when it changes).
        if self.saves_alias_state():
            self._log(
                "checkpoint snapshot on CPU: no copy at all; the step after a save keeps (does "
                "not donate) the saved state until its write ends."
            )

    def prepare_transfer(self, state: TrainerState) -> None:
        """Before the first step, sets up the host memory the first save's transfer would
        allocate while steps run (see `StateStorage.prepare_host_transfer`; logged there).

        Args:
            state: The trainer state.
        """
        storage = self._storage()
        if self.snapshot_choice is not None and hasattr(storage, "prepare_host_transfer"):
            storage.prepare_host_transfer(state._asdict())

    def saves_alias_state(self) -> bool:
        """Whether saves reference the state instead of copying it (on CPU meshes).

        On CPU the snapshot copy would be a host memcpy of the whole state in the step's time;
        instead the step after a save runs without donating the state (one extra compiled
        variant, compiled with the train step), so the saved arrays stay unchanged while the
        checkpointer writes them. That costs one state's worth of memory for a step, as a device
        snapshot would: so only while the snapshot choice (if made) is "device". On
        accelerators the state stays donated and the snapshot is a copy.
        """
        if not all(d.platform == "cpu" for d in self._mesh.devices.flat):
            return False
        choice = self.snapshot_choice
        return choice is None or choice.mode == "device"

    @property
    def next_step_keeps_state(self) -> bool:
        """Whether the last save still reads the state's arrays (the next step must not donate
        them)."""
        return self._state_held_by_save

    def take_state_hold(self) -> bool:
        """Whether the next step must not donate the state (the last save still reads it);
        called as that step is dispatched (clears the hold).

        Returns:
            True if the step must run without donation and report its input's finiteness to
            `resolve_pending_finite`.
        """
        held, self._state_held_by_save = self._state_held_by_save, False
        return held

    def resolve_pending_finite(self, value: Any = None) -> None:
        """Sets the last aliased save's finiteness flag: `value` from the step after it, or
        (None) computed now when no such step will run. Idempotent.

        Args:
            value: The flag (a device boolean) computed by the step after the save, or None.
        """
        pending, self._pending_finite = self._pending_finite, None
        if pending is not None:
            if value is None:
                pending.resolve()
            else:
                pending.set(value)

    @contextlib.contextmanager
    def memory_guard(self, step: int) -> Iterator[None]:
        """Turns a step's failure to allocate device memory while a snapshot holds some into
        SnapshotMemoryError naming both numbers; other errors propagate unchanged.

        Args:
            step: The step being dispatched.
        """
        storage = self._storage()
        held = storage.device_snapshot_bytes() if hasattr(storage, "device_snapshot_bytes") else 0
        try:
            yield
        except Exception as e:
            if held and _is_resource_exhausted(e):
                choice = self.snapshot_choice
                raise SnapshotMemoryError(
                    snapshot_memory_message(
                        step=step,
                        error=e,
                        held_bytes=held,
                        saved_step=self.last_saved_step,
                        peak_bytes=self._snapshot_peak_bytes,
                        limit_bytes=choice.limit_bytes if choice is not None else None,
                    )
                ) from e
            raise
