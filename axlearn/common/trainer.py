"""SpmdTrainer: trains a model on a device mesh with GSPMD (jit + shardings).

The loop, per step N:

    host batch -> global jax.Array (sharded over `batch_axis_names`)
    -> jitted train step (trainer state donated; `train_dtype` cast inside the loss)
    -> read step N-1's metrics (the host sync on step N-1's loss, while step N runs)
    -> evalers (their policies) -> checkpoint (its policy; never a non-finite state)

Parts. The trainer owns its parts, each in its own file with a small interface, none reading
the trainer's private state: `CheckpointDriver` (trainer_checkpointing.py), `MetricsRecorder`
(trainer_metrics.py), `Watchdog` (trainer_watchdog.py), `Profiler` (trainer_profiler.py),
`BatchFeeder` (trainer_batches.py) and `TrainerEvents` (trainer_events.py).
The loop (`run -> _train_loop -> _dispatch_train_step -> _drain`) is here.

Timing. A step's time is the interval between two consecutive host syncs on the loss; dispatch
stays pipelined (step N-1's metrics are read while step N runs). Every host activity inside a
step's interval (compile, input wait, summaries, eval, checkpoint, profiler) is timed and charged
to that step as an overhead, so the log shows a step's wall time and what it was spent on. Eval
and checkpoint of step N run after step N is dispatched and before step N+1 is, so they land in
step N's interval. See docs/trainer.md and docs/metrics.md. With a `batch_processor` (GRPO's
rollouts, `grpo.rollout`) steps are not pipelined: the processor makes the step's batch from the
host batch and the current state, then the step runs and is waited for (`_process_batch`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections.abc import Sequence
from typing import Any, Callable, ContextManager, Literal, Optional, Union

import jax
from absl import logging

from axlearn.common import trainer_compile, utils
from axlearn.common import trainer_init_state as init_state
from axlearn.common.aot_results import aot_model_analysis  # noqa: F401 (AXLearn: trainer.aot_model_analysis)
from axlearn.common.checkpointer import Checkpointer
from axlearn.common.config import (
    REQUIRED,
    ConfigOr,
    InstantiableConfig,
    Required,
    config_class,
    maybe_instantiate,
)
from axlearn.common.config_ranges import validate_config_ranges
from axlearn.common.evaler import SpmdEvaler
from axlearn.common.measurement import EventType
from axlearn.common.mesh_resolution import (  # noqa: F401 (public name)
    build_mesh,
    select_mesh_config,
)
from axlearn.common.module import Module
from axlearn.common.monitoring.device_monitor import DeviceMonitor
from axlearn.common.preemption import PreemptionHandler
from axlearn.common.run_lock import hold_run_dirs
from axlearn.common.skip_streak import (  # noqa: F401 (public names)
    DEFAULT_MAX_CONSECUTIVE_SKIPPED_STEPS,
    SkipStreak,
    TooManySkippedStepsError,
)
from axlearn.common.state_builder import Builder
from axlearn.common.summary_writer import BaseWriter, JsonlWriter, SummaryWriter
from axlearn.common.trainer_batches import BatchFeeder
from axlearn.common.trainer_checkpointing import (  # noqa: F401 (public names)
    CheckpointDriver,
    NonFiniteStateError,
    SnapshotMemoryError,
    TrainerState,
    checkpointed_floats,
    trainer_state_layout,
)
from axlearn.common.trainer_events import TrainerEvents
from axlearn.common.trainer_metrics import MetricsRecorder
from axlearn.common.trainer_profiler import Profiler
from axlearn.common.trainer_step import (  # noqa: F401 (public names)
    PendingStep,
    TrainStep,
    TrainStepResult,
    XscSteps,
    opt_params,
)
from axlearn.common.trainer_utils import (  # noqa: F401 (NonFiniteLossError: public name)
    NonFiniteLossError,
    UndefinedLossException,
    all_finite,
    check_token_ids,
    eval_due,
    evalers_to_force,
    global_batch_specs,
    learner_skips_nonfinite,
    params_for_eval,
    run_evalers,
    scalar_tree,
    set_if_field,
    with_default_dirs,
)
from axlearn.common.trainer_watchdog import (
    Watchdog,
    thread_stack_traces,  # noqa: F401 (public)
)
from axlearn.common.utils import NestedTensor, Tensor
from axlearn.common.utils_spmd import HybridMeshShape, MeshShape

# The config fields that only the launcher sets (left out of the config digest and TensorBoard).
LAUNCH_FIELDS = ("on_run_start", "verbose_start", "save_and_eval_last_step")


# pylint: disable-next=too-many-instance-attributes
class SpmdTrainer(Module):
    """Trains `model` with `learner` on `input` over a device mesh; see the module docstring."""

    @config_class
    class Config(Module.Config):  # pylint: disable=too-many-instance-attributes
        """Configures SpmdTrainer."""

        # The training input; its batches are host-local slices of the global batch.
        input: Required[InstantiableConfig] = REQUIRED
        # The training summary writer (TensorBoard); dir defaults to <dir>/summaries/train_train.
        summary_writer: BaseWriter.Config = SummaryWriter.default_config()
        # The trainer root directory (checkpoints/, summaries/, metrics.jsonl, run_summary.json).
        dir: Required[str] = REQUIRED
        # The step at which training stops.
        max_step: Union[int, float] = math.inf
        # The mesh shape (one -1 is inferred from the device count), or a HybridMeshShape.
        mesh_shape: Required[Union[MeshShape, HybridMeshShape]] = REQUIRED
        # The mesh axis names, one per mesh_shape entry; partition specs refer to them.
        mesh_axis_names: Required[Sequence[str]] = REQUIRED
        # The mesh axes over which input batches are split (see utils_spmd.batch_partition_spec).
        batch_axis_names: Optional[Union[str, Sequence[str]]] = "data"
        # (regex, mesh shape or ConfigModifier) pairs; the first full match of --mesh_selector wins.
        mesh_rules: Optional[Sequence[tuple[str, Any]]] = None
        # The model; forward(input_batch=...) returns (loss, aux).
        model: Required[InstantiableConfig] = REQUIRED
        # The learner (optimizer and update rules).
        learner: Required[InstantiableConfig] = REQUIRED
        # The checkpointer; dir defaults to <dir>/checkpoints.
        checkpointer: Module.Config = Checkpointer.default_config()
        # If set, builds the state of a run that starts without its own checkpoint (state_builder).
        init_state_builder: Optional[Builder.Config] = None
        # Evalers by name; each runs on its own policy.
        evalers: dict[str, SpmdEvaler.Config] = {}
        # If set, a host stage (with model=) from each input batch to the step's (GRPO rollouts).
        batch_processor: Optional[InstantiableConfig] = None
        # Whether checkpoints include the input iterator position.
        save_input_iterator: bool = False
        # Steps at which to start a 3-step jax.profiler trace (written under the summary dir).
        start_trace_steps: Sequence[int] = []
        # Processes that trace: a list of process indices or "all".
        start_trace_process_indices: Union[Literal["all"], Sequence[int]] = [0]
        # Must be True: state updates that are empty are dropped from the trainer state.
        prune_empty_state_updates: bool = True
        # If set, float parameters and inputs are cast to this dtype inside the loss.
        train_dtype: Optional[Any] = None
        # If set, log every thread's stack when the step has not advanced for this many seconds.
        watchdog_timeout_seconds: Optional[float] = None
        # If set, kill the process when the step has not advanced for this many seconds.
        crash_on_hang_timeout_seconds: Optional[float] = None
        # If set, samples the devices; a stall while they are idle is logged as a hang at once.
        device_monitor: Optional[DeviceMonitor.Config] = None
        # A thunk returning a context manager that init, compile and the training loop run in.
        context_manager: Optional[ConfigOr[Callable[[], ContextManager]]] = None
        # step -> whether it runs under XLA's silent-data-corruption checker (TPU only).
        xsc_check_policy: Optional[ConfigOr[Callable[[int], bool]]] = None
        # Log the per-step line every this many steps (None: every step).
        log_every_n_steps: Optional[int] = None
        # Peak FLOP/s per device for MFU; None: the peak table, or a matmul probe on CPU.
        peak_flops_per_device: Optional[float] = None
        # Stop after this many consecutive skipped/non-finite steps (see skip_streak); None: 10.
        max_consecutive_skipped_steps: Optional[int] = None
        # Resume from this committed step, not the newest (newer ones are set aside, not deleted).
        restore_step: Optional[int] = None
        # Seconds from SIGTERM to the saved exit (preemption.py); None: its default timeout.
        preemption_timeout_seconds: Optional[float] = None
        # Launcher only (LAUNCH_FIELDS): called as on_run_start(restored_step, -1: none) to train.
        on_run_start: Optional[Callable[[int], None]] = None
        # If True, the parameter table is logged line by line (--verbose_start); None: False.
        verbose_start: Optional[bool] = None
        # If True, the step reaching max_step is evaluated and saved whatever the policies say.
        save_and_eval_last_step: Optional[bool] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None, devices=None):
        super().__init__(cfg, parent=parent)
        cfg = self._config
        validate_config_ranges(cfg, root=self.path())
        if not cfg.prune_empty_state_updates:
            raise ValueError(
                f"{self.path()}.prune_empty_state_updates must be True "
                "(keeping empty state updates is not supported)."
            )
        self._step: Optional[int] = None
        self._events = TrainerEvents()  # Run events for goodput (trainer_events.py).
        self._trainer_state: Optional[TrainerState] = None
        self._compiled_train_step = None
        self._compiled_train_step_keep_state = None
        self._init_time = time.perf_counter()

        # The device mesh (its -1 resolved in the config).
        self._mesh, cfg.mesh_shape = build_mesh(
            cfg.mesh_shape, cfg.mesh_axis_names, devices=devices, config_path=self.path()
        )
        self._step_log("Mesh: %s", dict(self._mesh.shape))

        with self._mesh_context():
            self._add_child("input", set_if_field(cfg.input, is_training=True))
            child_cfgs = with_default_dirs(cfg)  # Summary and checkpoint dirs under cfg.dir.
            self._add_child("summary_writer", child_cfgs["summary_writer"])
            # metrics.jsonl: one record per step, always written (not part of the config).
            self._jsonl_writer = self._add_child(
                "metrics_writer", JsonlWriter.default_config().set(dir=cfg.dir)
            )
            self._add_child("model", cfg.model)
            self._add_child("learner", cfg.learner)
            if cfg.batch_processor is not None:
                self._add_child("batch_processor", cfg.batch_processor, model=self.model)
            self._add_child("checkpointer", child_cfgs["checkpointer"])
            if cfg.init_state_builder is not None:
                self._add_child("init_state_builder", cfg.init_state_builder)

            self._model_param_specs = self.model.create_parameter_specs_recursively()
            self._learner_state_specs = self.learner.create_state_partition_specs(
                self._model_param_specs
            )
            self._trainer_state_specs, self._trainer_state_shardings = trainer_state_layout(
                self._mesh, model=self._model_param_specs, learner=self._learner_state_specs
            )
            model_param_partition_specs = jax.tree.map(
                lambda s: s.spec, self._trainer_state_shardings.model
            )
            self._evalers: dict[str, SpmdEvaler] = {}
            for name, evaler_cfg in child_cfgs["evalers"].items():
                self._evalers[name] = self._add_child(
                    name,
                    evaler_cfg,
                    model=self.model,
                    model_param_partition_specs=model_param_partition_specs,
                )
        self._per_param_train_dtype = maybe_instantiate(cfg.train_dtype)
        self._context_manager = maybe_instantiate(cfg.context_manager) or contextlib.nullcontext
        self._xsc = XscSteps(maybe_instantiate(cfg.xsc_check_policy), path=self.path())
        self._input_iter = None
        # The parts (see docs/trainer.md); the metrics recorder is built for each run.
        self._batches = BatchFeeder(
            self.input, mesh=self._mesh, batch_axis_names=cfg.batch_axis_names, log=self._step_log
        )
        self._checkpoints = CheckpointDriver(
            self.checkpointer,
            mesh=self._mesh,
            state_specs=self._trainer_state_specs,
            state_shardings=self._trainer_state_shardings,
            input_module=self.input,
            save_input_iterator=cfg.save_input_iterator,
            restore_step=cfg.restore_step,
            config_path=self.path(),
            log=self._step_log,
        )
        self._watchdog = Watchdog(
            current_step=lambda: self._step,
            timeout_seconds=cfg.watchdog_timeout_seconds,
            crash_timeout_seconds=cfg.crash_on_hang_timeout_seconds,
            name=f"{self.path()}.watchdog",
            device_monitor=maybe_instantiate(cfg.device_monitor),
        )
        self._profiler = Profiler(
            start_steps=cfg.start_trace_steps,
            process_indices=cfg.start_trace_process_indices,
            trace_dir=os.path.join(cfg.dir, "summaries", "train_train"),
            log=self._step_log,
        )
        self._metrics: Optional[MetricsRecorder] = None
        self._skip_streak: Optional[SkipStreak] = None  # Built for each run.

    # ------------------------------------------------------------------------------------------
    # Properties.
    # ------------------------------------------------------------------------------------------

    @property
    def step(self) -> Optional[int]:
        """The step of the current trainer state (None before init/restore)."""
        return self._step

    @property
    def trainer_state(self) -> Optional[TrainerState]:
        """The current trainer state."""
        return self._trainer_state

    @property
    def trainer_state_specs(self) -> TrainerState:
        """The specs (shape, dtype, mesh_axes) of the trainer state."""
        return self._trainer_state_specs

    @property
    def trainer_stateshardings_of_specs(self) -> TrainerState:
        """The NamedShardings of the trainer state on the mesh."""
        return self._trainer_state_shardings

    def mesh(self) -> jax.sharding.Mesh:
        """The device mesh."""
        return self._mesh

    def _mesh_context(self):
        """Makes the mesh current (for sharding constraints and `utils.current_mesh()`)."""
        return jax.set_mesh(self._mesh)

    def _launch_free_config(self) -> Config:
        """The config without the launcher's fields (for the digest and TensorBoard)."""
        return self._config.clone(**{name: None for name in LAUNCH_FIELDS})

    def _step_log(self, msg: str, *args):
        logging.info(
            "%s process %d step %s] " + msg,
            self.path(),
            jax.process_index(),
            -1 if self._step is None else self._step,
            *args,
        )

    # ------------------------------------------------------------------------------------------
    # Initialization, restore, checkpoint.
    # ------------------------------------------------------------------------------------------

    def _opt_params(self, model_params: NestedTensor) -> Any:
        """Wraps parameters in OptParams carrying their specs' metadata for the learner."""
        return opt_params(model_params, self._model_param_specs)

    def init(self, prng_key: Tensor):
        """Initializes the trainer state (sharded on creation) and sets the step.

        With `init_state_builder`, the builder's state is used and the step is the builder's
        (as in AXLearn; `run` then starts its own step count at 0); see trainer_init_state.py.
        Without one, the step is 0.

        Args:
            prng_key: The initialization key.
        """
        with self._mesh_context():
            self._trainer_state, step = init_state.initial_state(
                self._children.get("init_state_builder"),
                random_init=functools.partial(self._init_state, prng_key),
                state_specs=self._trainer_state_specs,
                shardings=self._trainer_state_shardings,
                path=self.path(),
            )
        self._step = 0 if step is None else step

    def _init_state(self, prng_key: Tensor, prebuilt: Optional[Any] = None) -> TrainerState:
        """A random state, except the model parameters `prebuilt` (a Builder.State) holds."""
        self._step_log("Initializing trainer state.")
        with self._mesh_context():
            return init_state.random_state(
                self.model,
                self.learner,
                prng_key=prng_key,
                model_specs=self._model_param_specs,
                shardings=self._trainer_state_shardings,
                prebuilt=prebuilt,
            )

    def restore_checkpoint(self, restore_step: Optional[int] = None) -> Optional[int]:
        """Restores the latest committed checkpoint (or `restore_step`) into the state shardings.

        If the checkpoint holds an input iterator position (and `save_input_iterator` is set),
        the input resumes from it (see `CheckpointDriver.restore`).

        Args:
            restore_step: The step to restore; None: the latest committed one, if any.

        Returns:
            The restored step, or None if there was nothing to restore.
        """
        restored = self._checkpoints.restore(restore_step)
        if restored is None:
            return None
        self._step = restored.step
        self._trainer_state = restored.trainer_state
        if restored.input_iterator is not None:
            self._input_iter = restored.input_iterator
            self._step_log("Restored the input iterator position.")
        self._step_log("Restored checkpoint at step %s.", restored.step)
        return self._step

    def save_checkpoint(self, evaler_summaries: Optional[dict[str, Any]]) -> None:
        """Saves the current step's state if the checkpointer's policy says so (AXLearn's API).

        Args:
            evaler_summaries: {evaler name: its summaries, or None if it did not run}.
        """
        with self._mesh_context():
            self._checkpoints.save(**self._save_args(evaler_summaries))

    def _save_args(
        self, evaler_summaries: Optional[dict[str, Any]], *, force: bool = False
    ) -> dict[str, Any]:
        """The arguments of `CheckpointDriver.save` for the current step and state."""
        return dict(
            step=self._step,
            state=self._trainer_state,
            input_iterator=self._input_iter,
            evaler_summaries=evaler_summaries,
            force=force,
            streak=0 if self._skip_streak is None else self._skip_streak.streak,
        )

    def compile_train_step(
        self,
        input_batch: Optional[NestedTensor] = None,
        *,
        trainer_state_specs: Optional[TrainerState] = None,
        compiler_options: Optional[dict[str, Any]] = None,
        donate_state: bool = True,
        input_finite: bool = False,
    ) -> Any:
        """Lowers and compiles the train step (ahead of time: nothing runs).

        Args:
            input_batch: The global input batch (arrays, or ShapeDtypeStructs with shardings).
                None: the shapes come from the input's `element_spec()`
                (`trainer_utils.global_batch_specs`), so a trainer built on devices this process
                cannot run on (AOT compilation for a TPU topology) compiles without data.
            trainer_state_specs: The trainer state's shapes (arrays or ShapeDtypeStructs). None:
                the current state if initialized, else `self.trainer_state_specs`.
            compiler_options: XLA compiler options for `Lowered.compile`.
            donate_state: Whether the step donates the trainer state's buffers. The trainer
                compiles a non-donating variant too when saves reference the state (CPU).
            input_finite: Whether the step also returns whether its input state's parameters
                and optimizer state are all finite (checking the state just saved).

        Returns:
            The compiled step: (trainer_state, input_batch) -> `trainer_step.TrainStepResult`.
        """
        if input_batch is None:
            input_batch = global_batch_specs(
                self.input, mesh=self._mesh, batch_axis_names=self._config.batch_axis_names
            )
        if trainer_state_specs is None:
            trainer_state_specs = self._trainer_state or self._trainer_state_specs
        step = TrainStep(
            model=self.model,
            learner=self.learner,
            param_specs=self._model_param_specs,
            state_shardings=self._trainer_state_shardings,
            train_dtype=self._per_param_train_dtype,
        )
        with self._mesh_context(), self._context_manager():
            return trainer_compile.compile_train_step(
                step,
                trainer_state_specs,
                input_batch,
                state_shardings=self._trainer_state_shardings,
                compiler_options=compiler_options,
                donate_state=donate_state,
                input_finite=input_finite,
            )

    # ------------------------------------------------------------------------------------------
    # The loop.
    # ------------------------------------------------------------------------------------------

    def run(
        self, prng_key: Tensor, *, return_evaler_summaries: Union[None, bool, set[str]] = None
    ) -> Optional[dict[str, Any]]:
        """Trains until `max_step` or the end of the input.

        Args:
            prng_key: The key for initialization (when no checkpoint is restored) and training.
            return_evaler_summaries: True (all) or a set of evaler names to force-run at max_step,
                adding "evaler_summaries" ({name: summaries, None if not run}) to the result.

        Returns:
            None if no step ran; otherwise {"loss": the final loss (a NumPy scalar of the step's
            dtype), "aux": the final step's aux outputs (device arrays), "step": final step,
            "record": the final step's record} (and "evaler_summaries", see above).

        Raises:
            NonFiniteLossError: If a loss is NaN/inf and the learner does not skip such steps.
            NonFiniteStateError: If a checkpoint of non-finite parameters was about to be saved.
            ValueError: If `return_evaler_summaries` names an unknown evaler.
        """
        cfg = self._config
        self._forced_evals = evalers_to_force(return_evaler_summaries, self._evalers, self.path())
        self._forced_out = {}  # {"evaler_summaries": ...} once the forced evalers ran.
        with (
            self._run_lock(),
            self._watchdog.running(),
            self._mesh_context(),
            self._context_manager(),
            PreemptionHandler(timeout_seconds=cfg.preemption_timeout_seconds) as self._preemption,
        ):
            with self._events.span(EventType.DATA_LOADING):
                self._input_iter = self._batches.new_iterator()
            with self._events.span(EventType.TRAINING_PREPARATION):
                self._prepare_training(prng_key)
            if self._step >= cfg.max_step:
                self._step_log("Already reached max_step=%s; nothing to do.", cfg.max_step)
                return None
            if cfg.on_run_start is not None:
                cfg.on_run_start(self._restored_step)
            try:
                with self.checkpointer:
                    try:
                        return self._train_loop()
                    finally:
                        # Before the checkpointer waits for its last save's write.
                        self._checkpoints.resolve_pending_finite()
            finally:
                self._checkpoints.resolve_pending_finite()  # E.g. a save before an early return.

    @contextlib.contextmanager
    def _run_lock(self):
        """Holds the run locks of `dir` and the checkpointer's dir on process 0 (run_lock.py)."""
        ckpt_dir = getattr(self.checkpointer.config, "dir", None)
        with contextlib.ExitStack() as stack:
            if jax.process_index() == 0:  # Others share the dirs; a lock held here is not retaken.
                stack.enter_context(hold_run_dirs(self._config.dir, ckpt_dir))
            yield

    def _train_loop(self) -> Optional[dict[str, Any]]:
        """The pipelined loop; see the module docstring for the order of operations."""
        cfg = self._config
        timer = self._metrics.timer
        profiler_overhead = functools.partial(timer.overhead, "profiler")
        timer.start()
        pending: Optional[PendingStep] = None
        last_record = None
        while self._step < cfg.max_step:
            with timer.overhead("input"):
                try:
                    host_batch = next(self._input_iter)
                except StopIteration:
                    self._step_log("Reached the end of the input; stopping.")
                    break
                if cfg.batch_processor is None:
                    global_batch = self._batches.to_global(host_batch)
            in_flight = None if pending is None else pending.outputs["loss"]
            self._profiler.before_step(
                self._step + 1, in_flight=in_flight, overhead=profiler_overhead
            )
            if cfg.batch_processor is not None:
                current = self._process_batch(host_batch)
            else:
                self._compile(host_batch, global_batch)
                self._step += 1
                self._events.step_started(self._step)
                outputs = self._dispatch_train_step(global_batch)
                current = PendingStep(step=self._step, outputs=outputs, batch=host_batch)
            if pending is not None:
                last_record = self._finish_step(pending)
            pending = current
            self._after_step_dispatch(current)
            if self._preemption.requested(step=self._step):
                self._stop_for_preemption(current)
            if cfg.batch_processor is not None:  # Not pipelined: the step ends here.
                last_record, pending = self._finish_step(current), None
        if pending is not None:
            last_record = self._finish_step(pending)
        self._profiler.stop()
        try:
            with self._events.span(
                EventType.CUSTOM_BADPUT_EVENT, custom_badput_event_type="checkpoint"
            ):
                self._checkpoints.finish()  # The last save's write: its wait goes in the summary.
        finally:
            self._write_run_summary()
        if last_record is None:
            return None
        # The loss as the step computed it (a NumPy scalar of its dtype, as AXLearn's is an array).
        loss, aux, step = self._last_loss, self._last_aux, last_record["step"]
        return dict(loss=loss, aux=aux, step=step, record=last_record, **self._forced_out)

    def _process_batch(self, host_batch: NestedTensor) -> PendingStep:
        """Runs a step through `batch_processor`: process(host batch, trainer_state=) inside the
        step's interval (its spans are phases of the step), then the train step on the result,
        waited for (the next batch needs its parameters); the processor's
        `step_summaries(training_seconds=)` join the step's summaries.
        """
        processor = self.batch_processor
        self._step += 1
        self._events.step_started(self._step)
        batch = processor.process(host_batch, trainer_state=self._trainer_state)
        global_batch = self._batches.to_global(batch)
        self._compile(batch, global_batch, in_step=True)
        start = time.perf_counter()
        current = PendingStep(
            step=self._step, outputs=self._dispatch_train_step(global_batch), batch=batch
        )
        self._drain(current)
        current.extra_scalars = processor.step_summaries(
            training_seconds=time.perf_counter() - start
        )
        return current

    def _dispatch_train_step(self, global_batch: NestedTensor) -> dict[str, Any]:
        """Dispatches the next train step (updating the state); returns its outputs.

        After a save that references the state (CPU) the step does not donate it and checks it
        for NaN/inf for the save's writer. A step that cannot allocate device memory while a
        checkpoint snapshot holds some raises SnapshotMemoryError naming both numbers.
        """
        checkpoints = self._checkpoints
        with checkpoints.memory_guard(self._step):
            if checkpoints.take_state_hold():
                # The last save still reads the state's arrays: do not donate them. This step
                # also checks that they (the saved state) are finite, for the save's writer.
                result = self._compiled_train_step_keep_state(self._trainer_state, global_batch)
                checkpoints.resolve_pending_finite(result.input_finite)
            else:
                step_fn = self._xsc.step_fn(
                    self._step, global_batch, compile_fn=self.compile_train_step
                )
                result = (step_fn or self._compiled_train_step)(self._trainer_state, global_batch)
        self._trainer_state = result.trainer_state
        return result.outputs

    def _after_step_dispatch(self, current: PendingStep) -> None:
        """Runs step N's evalers and checkpoint (if their policies fire) in step N's interval.

        Before either runs, the pipeline is drained (step N's loss is ready) so that the measured
        eval/checkpoint overhead excludes step N's own compute, and a non-finite loss is caught
        before anything is saved.
        """
        cfg = self._config
        forced = self._forced_evals if current.step == cfg.max_step else set()
        due = [n for n, e in self._evalers.items() if n in forced or eval_due(e, current.step)]
        last = bool(cfg.save_and_eval_last_step) and current.step == cfg.max_step
        due = list(self._evalers) if last else due
        evaler_summaries: dict[str, Any] = {name: None for name in self._evalers}
        if due:
            self._drain(current)
            with self._metrics.timer.overhead("eval"):
                evaler_summaries.update(self._run_eval(due))
        if forced:  # For run(return_evaler_summaries=...).
            self._forced_out = dict(evaler_summaries=evaler_summaries)
        if last or self._checkpoints.due(current.step, evaler_summaries):
            self._drain(current)
            self._checkpoints.save_timed(
                self._metrics.timer, **self._save_args(evaler_summaries, force=last)
            )

    def _read_step(self, pending: PendingStep) -> tuple[dict[str, Any], float, dict[str, Any]]:
        """Waits for a step's loss and summaries; stops on a non-finite loss (unless the learner
        skips such steps) and notes the skip streak. Returns (host values, loss, scalars)."""
        outputs = pending.outputs
        host = jax.device_get(
            dict(loss=outputs["loss"], summaries=scalar_tree(outputs["summaries"]))
        )
        loss = float(host["loss"])
        if not math.isfinite(loss) and not self._skips_nonfinite:
            raise NonFiniteLossError(step=pending.step, loss=loss)
        scalars = dict(utils.flatten_items(host["summaries"]), **pending.extra_scalars)
        # Before anything of this step is saved: stop if it ends a streak of skipped steps.
        self._skip_streak.note(pending.step, loss=loss, scalars=scalars)
        return host, loss, scalars

    def _drain(self, current: PendingStep) -> None:
        """Waits for step `current` to finish (see `_read_step`), once."""
        if not current.drained:
            self._read_step(current)
            current.drained = True

    def _finish_step(self, pending: PendingStep) -> dict[str, Any]:
        """Reads step N's metrics (the host sync on its loss), closes its interval, reports it."""
        host, loss, scalars = self._read_step(pending)
        metrics = self._metrics
        timing = metrics.timer.end_step(pending.step)
        self._last_loss, self._last_aux = host["loss"], pending.outputs["aux"]
        if not math.isfinite(loss):
            metrics.count_nonfinite_step()
        with metrics.timer.overhead("summary"):
            return metrics.record_step(
                step=pending.step,
                batch=pending.batch,
                loss=loss,
                scalars=scalars,
                timing=timing,
                checkpoint=self._checkpoints.take_split(),
            )

    def _stop_for_preemption(self, current: PendingStep) -> None:
        """After a preemption notice: finishes step `current`, saves it, waits, exits.

        The step is saved unless its save policy just did; see axlearn/common/preemption.py.

        Raises:
            TrainingPreempted: Always, once the save is committed (a SystemExit whose code is
                preemption.PREEMPTED_EXIT_CODE).
        """
        preemption = self._preemption
        preemption.set_activity(f"finishing step {current.step}")
        self._drain(current)
        self._finish_step(current)
        self._profiler.stop()
        self._checkpoints.save_for_preemption(
            step=current.step,
            state=self._trainer_state,
            input_iterator=self._input_iter,
            set_activity=preemption.set_activity,
        )
        error = preemption.preempted(step=current.step, saved_step=current.step)
        self._step_log("%s", error)
        raise error

    def model_params_for_eval(self) -> NestedTensor:
        """Parameters for evalers: the parameter EMA if the learner keeps one, else the model."""
        return params_for_eval(self._trainer_state)

    def _run_eval(self, names: Sequence[str]) -> dict[str, Any]:
        """Runs the named evalers on the current parameters; returns their summaries."""
        return run_evalers(
            {name: self._evalers[name] for name in names},
            step=self._step,
            prng_key=self._trainer_state.prng_key,
            model_params=self.model_params_for_eval(),
        )

    def _write_run_summary(self) -> dict[str, Any]:
        """Logs the end-of-run summary block and writes <dir>/run_summary.json (process 0)."""
        return self._metrics.write_run_summary(
            end_of_run_wait_s=self._checkpoints.end_of_run_wait_s,
            skipped_steps=self._skip_streak.skip_counter,
            checkpoint_snapshot=self._checkpoints.snapshot_choice,
        )

    # ------------------------------------------------------------------------------------------
    # Preparation: restore or init, model analysis, compile.
    # ------------------------------------------------------------------------------------------

    def _prepare_training(self, prng_key: Tensor) -> None:
        """Restores the latest checkpoint or initializes the state; logs the model analysis."""
        cfg = self._config
        launch_free_cfg = self._launch_free_config()
        self._skips_nonfinite = (
            learner_skips_nonfinite(cfg.learner) or self.learner.handles_undefined_loss()
        )
        self._metrics = MetricsRecorder(
            trainer_config=launch_free_cfg,
            mesh=self._mesh,
            model_param_specs=self._model_param_specs,
            summary_writer=self.summary_writer,
            jsonl_writer=self._jsonl_writer,
            skips_nonfinite=self._skips_nonfinite,
            verbose_start=bool(cfg.verbose_start),
            log=self._step_log,
        )
        self._metrics.timer.add_listener(self._events)
        self._skip_streak = SkipStreak(
            limit=cfg.max_consecutive_skipped_steps, config_path=self.path()
        )
        restored = self.restore_checkpoint(self._checkpoints.restore_step_to_apply())
        self._restored_step = -1 if restored is None else restored
        if restored is None:
            self.init(prng_key)
            self._step = 0  # A run starts its step count at 0, whatever a builder restored.
            # Policies with min_step=1 do nothing at step 0.
            due = [n for n, e in self._evalers.items() if eval_due(e, self._step)]
            evaler_summaries = {n: None for n in self._evalers}
            if due:
                evaler_summaries.update(self._run_eval(due))
            if self._checkpoints.due(self._step, evaler_summaries):
                self._checkpoints.save(**self._save_args(evaler_summaries))
        if not self._checkpoints.saves_alias_state():
            # Compile the finiteness check of saves now, not inside a step's interval. (On CPU
            # the step after a save computes it; see trainer_checkpointing._DeferredFinite.)
            jax.block_until_ready(all_finite(checkpointed_floats(self._trainer_state)))
        learner_kw = dict(learner=self.learner, learner_state_specs=self._learner_state_specs)
        state = self._trainer_state if self._step == 0 else None  # A fresh start (AXLearn's files).
        self._metrics.log_model_analysis(self.model, trainer_state=state, **learner_kw)
        self._metrics.measure_peak()
        if hasattr(self.summary_writer, "log_config"):
            self.summary_writer.log_config(launch_free_cfg, step=self._step)

    def _compile(self, host_batch: NestedTensor, global_batch: NestedTensor, *, in_step=False):
        """The run's first compile (trainer_compile.compile_for_run), after checking the token
        ids; a no-op once compiled. Inside a step's interval (`in_step`) it is a badput span."""
        if self._compiled_train_step is not None:
            return
        check_token_ids(host_batch, self._config.model, path=f"{self.path()}.model")
        span = functools.partial(self._events.span, EventType.CUSTOM_BADPUT_EVENT)
        with span(custom_badput_event_type="compile") if in_step else contextlib.nullcontext():
            with self._metrics.timer.overhead("compile"):
                self._compiled_train_step, self._compiled_train_step_keep_state = (
                    trainer_compile.compile_for_run(
                        self.compile_train_step,
                        global_batch,
                        checkpoints=self._checkpoints,
                        metrics=self._metrics,
                        trainer_state=self._trainer_state,
                        log=self._step_log,
                    )
                )
