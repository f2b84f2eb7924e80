"""SpmdTrainer: trains a model on a device mesh with GSPMD (jit + shardings).

The loop, per step N:

    host batch -> global jax.Array (sharded over `batch_axis_names`)
    -> jitted train step (trainer state donated; `train_dtype` cast inside the loss)
    -> read step N-1's metrics (the host sync on step N-1's loss, while step N runs)
    -> evalers (their policies) -> checkpoint (its policy; never a non-finite state)

Timing. A step's time is the interval between two consecutive host syncs on the loss; dispatch
stays pipelined (step N-1's metrics are read while step N runs). Every host activity inside a
step's interval (compile, input wait, summaries, eval, checkpoint, profiler) is timed and charged
to that step as an overhead, so the log shows a step's wall time and what it was spent on. Eval
and checkpoint of step N run after step N is dispatched and before step N+1 is, so they land in
step N's interval. See docs/trainer.md and docs/metrics.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Literal, Optional, Union

import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common import utils
from axlearn.common.checkpointer import Checkpointer
from axlearn.common.compilation_cache import CacheLookups
from axlearn.common.config import (
    REQUIRED,
    InstantiableConfig,
    Required,
    config_class,
    maybe_instantiate,
)
from axlearn.common.config_ranges import validate_config_ranges
from axlearn.common.evaler import SpmdEvaler
from axlearn.common.measurement import EventType
from axlearn.common.mesh_resolution import apply_mesh_rule, match_mesh_rule
from axlearn.common.module import Module, child_context, new_output_collection
from axlearn.common.module import functional as F
from axlearn.common.preemption import PreemptionHandler
from axlearn.common.run_lock import RunLock, held_by_this_process
from axlearn.common.skip_streak import (  # noqa: F401 (public names)
    DEFAULT_MAX_CONSECUTIVE_SKIPPED_STEPS,
    SkipStreak,
    TooManySkippedStepsError,
)
from axlearn.common.step_timer import StepTimer
from axlearn.common.summary_writer import BaseWriter, JsonlWriter, SummaryWriter
from axlearn.common.trainer_checkpointing import (  # noqa: F401 (public names)
    NonFiniteStateError,
    SnapshotMemoryError,
    TrainerCheckpointMixin,
    TrainerState,
)
from axlearn.common.trainer_events import TrainerEvents
from axlearn.common.trainer_metrics import TrainerMetricsMixin
from axlearn.common.trainer_utils import (
    all_finite,
    check_token_ids,
    eval_due,
    global_batch_specs,
    is_unset,
    leading_dim,
    learner_skips_nonfinite,
    scalar_tree,
    set_if_field,
    shardings_of_specs,
)
from axlearn.common.trainer_watchdog import (
    TrainerWatchdogMixin,
    thread_stack_traces,  # noqa: F401 (public)
)
from axlearn.common.utils import NestedTensor, Tensor
from axlearn.common.utils_spmd import (
    HybridMeshShape,
    MeshShape,
    batch_partition_spec,
    create_device_mesh,
    host_to_global_array,
    infer_mesh_shape,
)


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite at a step and the learner does not skip such steps."""


# pylint: disable-next=too-many-instance-attributes
class SpmdTrainer(TrainerCheckpointMixin, TrainerMetricsMixin, TrainerWatchdogMixin, Module):
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
        # (regex, mesh shape or ConfigModifier config) pairs; the first regex that fully matches
        # --mesh_selector picks the mesh (see select_mesh_config).
        mesh_rules: Optional[Sequence[tuple[str, Any]]] = None
        # The model; forward(input_batch=...) returns (loss, aux).
        model: Required[InstantiableConfig] = REQUIRED
        # The learner (optimizer and update rules).
        learner: Required[InstantiableConfig] = REQUIRED
        # The checkpointer; dir defaults to <dir>/checkpoints.
        checkpointer: Module.Config = Checkpointer.default_config()
        # Evalers by name; each runs on its own policy.
        evalers: dict[str, SpmdEvaler.Config] = {}
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
        # Log the per-step line every this many steps (None: every step).
        log_every_n_steps: Optional[int] = None
        # Peak FLOP/s per device for MFU; None: the peak table, or a matmul probe on CPU.
        peak_flops_per_device: Optional[float] = None
        # The run stops (TooManySkippedStepsError, nothing checkpointed after the streak) when
        # this many consecutive steps are skipped by the learner or have a non-finite loss.
        # Steps where fp16 loss scaling lowers its scale do not count. None: 10.
        max_consecutive_skipped_steps: Optional[int] = None
        # If set, resume from this committed step instead of the newest (e.g. to go around a
        # corrupt or bad one; --restore_step): newer step directories are set aside, not deleted.
        restore_step: Optional[int] = None
        # On SIGTERM (a preemption notice), the step in flight is finished and saved and the
        # process exits with preemption.PREEMPTED_EXIT_CODE within this many seconds of the
        # signal; None: preemption.DEFAULT_PREEMPTION_TIMEOUT_SECONDS.
        preemption_timeout_seconds: Optional[float] = None

    # If set, called as `on_run_start(restored_step)` (-1: started from scratch) once the run is
    # known to train (restored or initialized, a step left to run), e.g. to write the run record.
    on_run_start: Optional[Callable[[int], None]] = None
    # If True, the step that reaches max_step is evaluated by every evaler and saved whatever the
    # policies say (set by launch_trainer when --config_override shortened max_step).
    save_and_eval_last_step: bool = False

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
        self._watchdog_stop: Optional[threading.Event] = None
        self._watchdog_thread: Optional[threading.Thread] = None
        self._init_time = time.perf_counter()

        # The device mesh.
        mesh_devices = devices if devices is not None else create_device_mesh(cfg.mesh_shape)
        if isinstance(cfg.mesh_shape, HybridMeshShape):
            num_axes = len(cfg.mesh_shape.ici_mesh_shape)
        else:
            num_axes = len(cfg.mesh_shape)
            cfg.mesh_shape = infer_mesh_shape(cfg.mesh_shape, num_devices=mesh_devices.size)
        if num_axes != len(cfg.mesh_axis_names):
            raise ValueError(
                f"{self.path()}: mesh_shape {cfg.mesh_shape} has {num_axes} axes but "
                f"mesh_axis_names {tuple(cfg.mesh_axis_names)} has {len(cfg.mesh_axis_names)}."
            )
        self._mesh = jax.sharding.Mesh(mesh_devices, tuple(cfg.mesh_axis_names))
        self._step_log("Mesh: %s", dict(self._mesh.shape))

        with self._mesh_context():
            self._add_child("input", set_if_field(cfg.input, is_training=True))
            summary_cfg = cfg.summary_writer.clone()
            if is_unset(getattr(summary_cfg, "dir", None)):
                summary_cfg.dir = os.path.join(cfg.dir, "summaries", "train_train")
            self._add_child("summary_writer", summary_cfg)
            # metrics.jsonl: one record per step, always written (not part of the config).
            self._jsonl_writer = self._add_child(
                "metrics_writer", JsonlWriter.default_config().set(dir=cfg.dir)
            )
            self._add_child("model", cfg.model)
            self._add_child("learner", cfg.learner)
            ckpt_cfg = cfg.checkpointer.clone()
            if is_unset(getattr(ckpt_cfg, "dir", None)):
                ckpt_cfg.dir = os.path.join(cfg.dir, "checkpoints")
            self._add_child("checkpointer", ckpt_cfg)

            self._model_param_specs = self.model.create_parameter_specs_recursively()
            self._learner_state_specs = self.learner.create_state_partition_specs(
                self._model_param_specs
            )
            self._trainer_state_specs = TrainerState(
                prng_key=utils.TensorSpec(
                    shape=self._prng_key_shape(),
                    dtype=self._prng_key_dtype(),
                    mesh_axes=PartitionSpec(),
                ),
                model=self._model_param_specs,
                learner=self._learner_state_specs,
            )
            self._trainer_state_shardings = TrainerState(
                prng_key=NamedSharding(self._mesh, PartitionSpec()),
                model=shardings_of_specs(self._mesh, self._model_param_specs),
                learner=shardings_of_specs(self._mesh, self._learner_state_specs),
            )
            model_param_partition_specs = jax.tree.map(
                lambda s: s.spec, self._trainer_state_shardings.model
            )
            self._evalers: dict[str, SpmdEvaler] = {}
            for name, evaler_cfg in cfg.evalers.items():
                evaler_cfg = evaler_cfg.clone()
                if is_unset(getattr(evaler_cfg.summary_writer, "dir", None)):
                    evaler_cfg.summary_writer.dir = os.path.join(cfg.dir, "summaries", name)
                self._evalers[name] = self._add_child(
                    name,
                    evaler_cfg,
                    model=self.model,
                    model_param_partition_specs=model_param_partition_specs,
                )
        self._per_param_train_dtype = maybe_instantiate(cfg.train_dtype)

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
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.optimizer_base import OptParam

        def wrap(value, spec):
            return OptParam(
                value=value,
                factorization_spec=getattr(spec, "factorization", None),
                weight_decay_scale=getattr(spec, "weight_decay_scale", None),
            )

        return jax.tree.map(wrap, model_params, self._model_param_specs)

    def init(self, prng_key: Tensor):
        """Initializes the trainer state (sharded on creation) and sets the step to 0.

        Args:
            prng_key: The initialization key.
        """

        def init_state(key):
            key, init_key = jax.random.split(key)
            model_params = self.model.initialize_parameters_recursively(init_key)
            learner_state = self.learner.init(self._opt_params(model_params))
            return TrainerState(prng_key=key, model=model_params, learner=learner_state)

        self._step_log("Initializing trainer state.")
        with self._mesh_context():
            self._trainer_state = jax.jit(init_state, out_shardings=self._trainer_state_shardings)(
                prng_key
            )
        self._step = 0

    # ------------------------------------------------------------------------------------------
    # The train step.
    # ------------------------------------------------------------------------------------------

    def _train_cast(self, tree: NestedTensor) -> NestedTensor:
        """Casts float leaves of `tree` to `train_dtype` (no-op when unset)."""
        dtype = self._per_param_train_dtype
        if dtype is None:
            return tree
        if callable(dtype) and not isinstance(dtype, (type, np.dtype)):
            return dtype(tree)
        return utils.cast_floats(tree, dtype)

    def _train_step(
        self, state: TrainerState, input_batch: NestedTensor
    ) -> tuple[TrainerState, dict[str, Any]]:
        """One training step: forward, backward and update, as a pure function (jitted)."""
        new_prng_key, forward_key, learner_key = jax.random.split(state.prng_key, 3)

        def _forward(*, model_params: NestedTensor, inputs: NestedTensor) -> Any:
            # The train_dtype cast happens here, inside the loss: gradients flow back to the
            # stored (e.g. fp32) parameters through the cast.
            params = self._train_cast(model_params)
            model_collection = new_output_collection()
            with child_context(
                "model",
                module=self.model,
                state=params,
                prng_key=inputs["forward_key"],
                output_collection=model_collection,
            ):
                loss, aux = self.model(input_batch=self._train_cast(inputs["input_batch"]))
            return loss, aux, model_collection

        outputs, learner_collection = self._learner_forward_and_backward(
            learner_state=state.learner,
            model_params=state.model,
            forward_fn=_forward,
            inputs=dict(input_batch=input_batch, forward_key=forward_key),
            prng_key=learner_key,
        )
        new_state = TrainerState(
            prng_key=new_prng_key,
            model=outputs["updated_params"],
            learner=learner_collection.state_updates,
        )
        summaries = dict(
            model=outputs["model_summaries"],
            learner=learner_collection.summaries,
        )
        return new_state, dict(loss=outputs["loss"], aux=outputs["aux"], summaries=summaries)

    def _learner_forward_and_backward(
        self,
        *,
        learner_state: NestedTensor,
        model_params: NestedTensor,
        forward_fn: Callable,
        inputs: NestedTensor,
        prng_key: Tensor,
    ) -> tuple[dict[str, Any], Any]:
        """Runs Learner.forward_and_backward functionally; returns (outputs, learner collection).

        `outputs` holds loss, aux, model_summaries and updated_params; the learner's output
        collection holds its new state (state_updates) and its summaries.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.learner import ForwardOutputs

        def fn(*, model_params: NestedTensor, inputs: NestedTensor) -> ForwardOutputs:
            loss, aux, collection = forward_fn(model_params=model_params, inputs=inputs)
            return ForwardOutputs(loss=loss, aux=aux, output_collection=collection)

        fwd_bwd, learner_collection = F(
            self.learner,
            method="forward_and_backward",
            prng_key=prng_key,
            state=learner_state,
            inputs=dict(fn=fn, opt_params=self._opt_params(model_params), inputs=inputs),
            is_training=True,
        )
        forward_outputs = fwd_bwd.forward_outputs
        return (
            dict(
                loss=forward_outputs.loss,
                aux=forward_outputs.aux,
                model_summaries=forward_outputs.output_collection.summaries,
                updated_params=fwd_bwd.backward_outputs.updated_params,
            ),
            learner_collection,
        )

    def _train_step_and_input_finite(
        self, state: TrainerState, input_batch: NestedTensor
    ) -> tuple[TrainerState, dict[str, Any], Tensor]:
        """The train step, plus whether the input state's checkpointed floats are all finite."""
        new_state, outputs = self._train_step(state, input_batch)
        return new_state, outputs, all_finite(self._checkpointed_floats(state))

    def _jit_train_step(
        self, batch_sharding: Any, *, donate_state: bool = True, input_finite: bool = False
    ) -> Callable:
        fn = self._train_step_and_input_finite if input_finite else self._train_step
        return jax.jit(
            fn,
            in_shardings=(self._trainer_state_shardings, batch_sharding),
            out_shardings=(self._trainer_state_shardings, None) + ((None,) if input_finite else ()),
            donate_argnums=(0,) if donate_state else (),
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
            compiler_options: XLA compiler options for `Lowered.compile`
                (see `axlearn.common.compiler_options`).
            donate_state: Whether the step donates the trainer state's buffers (reuses them for
                the new state). The trainer compiles a non-donating variant too when saves
                reference the state (CPU), for the step after each save.
            input_finite: Whether the step also returns whether its input state's parameters
                and optimizer state are all finite (that variant checks the state just saved,
                fused with the step).

        Returns:
            The compiled step: (trainer_state, input_batch) -> (trainer_state, outputs), or
            -> (trainer_state, outputs, input_finite) with `input_finite`.
        """
        if input_batch is None:
            input_batch = global_batch_specs(
                self.input, mesh=self._mesh, batch_axis_names=self._config.batch_axis_names
            )
        if trainer_state_specs is None:
            trainer_state_specs = self._trainer_state
            if trainer_state_specs is None:
                trainer_state_specs = self._trainer_state_specs
        batch_sharding = jax.tree.map(lambda x: x.sharding, input_batch)
        state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            trainer_state_specs,
            self._trainer_state_shardings,
            is_leaf=lambda x: isinstance(x, (utils.TensorSpec, jax.ShapeDtypeStruct)),
        )
        batch = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), input_batch
        )
        with self._mesh_context():
            lowered = self._jit_train_step(
                batch_sharding, donate_state=donate_state, input_finite=input_finite
            ).lower(state, batch)
            return lowered.compile(compiler_options)

    # ------------------------------------------------------------------------------------------
    # The loop.
    # ------------------------------------------------------------------------------------------

    def run(self, prng_key: Tensor) -> Optional[dict[str, Any]]:
        """Trains until `max_step` or the end of the input.

        Args:
            prng_key: The key for initialization (when no checkpoint is restored) and training.

        Returns:
            None if no step ran; otherwise {"loss": final loss, "step": final step,
            "run_summary": the run summary dict}.

        Raises:
            NonFiniteLossError: If a loss is NaN/inf and the learner does not skip such steps.
            NonFiniteStateError: If a checkpoint of non-finite parameters was about to be saved.
        """
        cfg = self._config
        with (
            self._run_lock(),
            self._watchdog(),
            self._mesh_context(),
            PreemptionHandler(timeout_seconds=cfg.preemption_timeout_seconds) as self._preemption,
        ):
            with self._events.span(EventType.DATA_LOADING):
                self._input_iter = self._new_input_iterator()
            with self._events.span(EventType.TRAINING_PREPARATION):
                self._prepare_training(prng_key)
            if self._step >= cfg.max_step:
                self._step_log("Already reached max_step=%s; nothing to do.", cfg.max_step)
                return None
            if self.on_run_start is not None:
                self.on_run_start(self._restored_step)
            try:
                with self.checkpointer:
                    try:
                        return self._train_loop()
                    finally:
                        # Before the checkpointer waits for its last save's write.
                        self._resolve_pending_finite()
            finally:
                self._resolve_pending_finite()  # E.g. a save before an early return.

    @contextlib.contextmanager
    def _run_lock(self):
        """Holds `<dir>/run.lock` for the run on process 0 (see axlearn/common/run_lock.py)."""
        if jax.process_index() != 0 or held_by_this_process(self._config.dir):
            yield  # Other processes share the dir; or the launcher took the lock already.
            return
        with RunLock(self._config.dir):
            yield

    def _train_loop(self) -> Optional[dict[str, Any]]:
        """The pipelined loop; see the module docstring for the order of operations."""
        cfg = self._config
        timer = self._timer
        timer.start()
        pending: Optional[_PendingStep] = None
        last_record = None
        stop_trace_step = None
        while self._step < cfg.max_step:
            with timer.overhead("input"):
                try:
                    host_batch = next(self._input_iter)
                except StopIteration:
                    self._step_log("Reached the end of the input; stopping.")
                    break
                global_batch = self._host_to_global(host_batch)
            stop_trace_step = self._maybe_trace(stop_trace_step, pending)
            if self._compiled_train_step is None:
                check_token_ids(host_batch, self._config.model, path=f"{self.path()}.model")
                with timer.overhead("compile"):
                    self._compile(global_batch)
            self._step += 1
            self._events.step_started(self._step)
            outputs = self._dispatch_train_step(global_batch)
            current = _PendingStep(step=self._step, outputs=outputs, batch=host_batch)
            if pending is not None:
                last_record = self._finish_step(pending)
            pending = current
            self._after_step_dispatch(current)
            if self._preemption.requested(step=self._step):
                self._stop_for_preemption(current)
        if pending is not None:
            last_record = self._finish_step(pending)
        if stop_trace_step is not None:
            self._stop_trace()
        try:
            with self._events.span(
                EventType.CUSTOM_BADPUT_EVENT, custom_badput_event_type="checkpoint"
            ):
                self._finish_saves()  # The last save's write: its wait goes in the run summary.
        finally:
            self._write_run_summary()
        if last_record is None:
            return None
        return dict(loss=last_record["loss"], step=last_record["step"], record=last_record)

    def _after_step_dispatch(self, current: _PendingStep) -> None:
        """Runs step N's evalers and checkpoint (if their policies fire) in step N's interval.

        Before either runs, the pipeline is drained (step N's loss is ready) so that the measured
        eval/checkpoint overhead excludes step N's own compute, and a non-finite loss is caught
        before anything is saved.
        """
        due = [name for name, evaler in self._evalers.items() if eval_due(evaler, current.step)]
        last = self.save_and_eval_last_step and current.step == self._config.max_step
        due = list(self._evalers) if last else due
        evaler_summaries: dict[str, Any] = {name: None for name in self._evalers}
        if due:
            self._drain(current)
            with self._timer.overhead("eval"):
                evaler_summaries.update(self._run_eval(due))
        if last or self._checkpoint_due(evaler_summaries):
            self._drain(current)
            self._save_checkpoint_timed(evaler_summaries, force=last)

    def _drain(self, current: _PendingStep) -> None:
        """Waits for step `current` to finish; stops on a non-finite loss (unless skipped)."""
        if current.drained:
            return
        loss = float(jax.device_get(current.outputs["loss"]))
        current.drained = True
        if not math.isfinite(loss) and not self._skips_nonfinite:
            raise NonFiniteLossError(
                f"Step {current.step}: the loss is {loss}. The learner does not skip non-finite "
                "steps (use skip_and_clip_by_global_norm or fp16 loss scaling to skip them); "
                "stopping without saving this state."
            )
        # Before anything of this step is saved: stop if it ends a streak of skipped steps.
        scalars = dict(
            utils.flatten_items(jax.device_get(scalar_tree(current.outputs["summaries"])))
        )
        self._skip_streak.note(current.step, loss=loss, scalars=scalars)

    def model_params_for_eval(self) -> NestedTensor:
        """Parameters for evalers: the parameter EMA if the learner keeps one, else the model."""
        learner_state = self._trainer_state.learner
        if isinstance(learner_state, dict) and "ema" in learner_state:
            ema = getattr(learner_state["ema"], "ema", None)
            if ema is not None:
                return ema
        return self._trainer_state.model

    def _run_eval(self, names: Sequence[str]) -> dict[str, Any]:
        """Runs the named evalers on the current parameters; returns their summaries."""
        summaries = {}
        prng_key = self._trainer_state.prng_key
        for name in names:
            prng_key, evaler_summaries, _ = self._evalers[name].eval_step(
                self._step,
                prng_key=prng_key,
                model_params=self.model_params_for_eval(),
                force_run=True,
            )
            summaries[name] = evaler_summaries
        return summaries

    def _finish_step(self, pending: _PendingStep) -> dict[str, Any]:
        """Reads step N's metrics (the host sync on its loss), closes its interval, reports it."""
        host = jax.device_get(
            dict(loss=pending.outputs["loss"], summaries=scalar_tree(pending.outputs["summaries"]))
        )
        timing = self._timer.end_step(pending.step)
        self._last_step_time = time.time()
        loss = float(host["loss"])
        scalars = dict(utils.flatten_items(host["summaries"]))
        if not math.isfinite(loss):
            if not self._skips_nonfinite:
                raise NonFiniteLossError(
                    f"Step {pending.step}: the loss is {loss}. The learner does not skip "
                    "non-finite steps (use skip_and_clip_by_global_norm or fp16 loss scaling to "
                    "skip them); stopping. No state of this step or later is checkpointed."
                )
            self._num_nonfinite_steps += 1
        self._skip_streak.note(pending.step, loss=loss, scalars=scalars)
        with self._timer.overhead("summary"):
            record = self._step_record(pending, loss=loss, scalars=scalars, timing=timing)
            self._report_step(record, scalars=scalars)
        return record

    # ------------------------------------------------------------------------------------------
    # Preparation: restore or init, model analysis, compile.
    # ------------------------------------------------------------------------------------------

    def _prepare_training(self, prng_key: Tensor) -> None:
        """Restores the latest checkpoint or initializes the state; logs the model analysis."""
        cfg = self._config
        self._timer = StepTimer()
        self._timer.add_listener(self._events)
        self._num_nonfinite_steps = 0
        self._skip_streak = SkipStreak(
            limit=cfg.max_consecutive_skipped_steps, config_path=self.path()
        )
        self._records: list[dict[str, Any]] = []
        restored = self.restore_checkpoint(self._restore_step_to_apply())
        self._restored_step = -1 if restored is None else restored
        if restored is None:
            self.init(prng_key)
            # Policies with min_step=1 do nothing at step 0.
            due = [n for n, e in self._evalers.items() if eval_due(e, self._step)]
            evaler_summaries = {n: None for n in self._evalers}
            if due:
                evaler_summaries.update(self._run_eval(due))
            if self._checkpoint_due(evaler_summaries):
                self._save_checkpoint(evaler_summaries)
        self._first_step = self._step
        if not self._saves_alias_state():
            # Compile the finiteness check of saves now, not inside a step's interval. (On CPU
            # the step after a save computes it; see _DeferredFinite.)
            jax.block_until_ready(all_finite(self._checkpointed_floats()))
        self._skips_nonfinite = learner_skips_nonfinite(cfg.learner)
        self._log_model_analysis()
        self._measure_peak()
        if hasattr(self.summary_writer, "log_config"):
            self.summary_writer.log_config(cfg, step=self._step)

    def _compile(self, global_batch: NestedTensor) -> None:
        """AOT-compiles the train step for this batch's shapes; logs memory analysis."""
        start = time.perf_counter()
        with CacheLookups() as cache:  # Whether the step came from the persistent cache.
            self._compiled_train_step = self.compile_train_step(global_batch)
            self._choose_checkpoint_snapshot(self._compiled_train_step)
            if self._saves_alias_state() or self._state_held_by_save:
                self._compiled_train_step_keep_state = self.compile_train_step(
                    global_batch, donate_state=False, input_finite=True
                )
        self._compile_seconds = time.perf_counter() - start
        self._step_log(
            "Compiled the train step in %.2f s (%s).", self._compile_seconds, cache.describe()
        )
        self._prepare_checkpoint_transfer()
        self._on_compiled(self._compiled_train_step, global_batch)

    def _host_to_global(self, host_batch: NestedTensor) -> NestedTensor:
        """Turns this process's host batch into global arrays sharded over the batch axes."""
        if self._batch_spec is None:
            global_batch_size = leading_dim(host_batch) * jax.process_count()
            self._batch_spec = batch_partition_spec(
                global_batch_size, mesh=self._mesh, batch_axis_names=self._config.batch_axis_names
            )
            self._global_batch_size = global_batch_size
            self._step_log(
                "Global batch %d sharded as %s over mesh %s.",
                global_batch_size,
                self._batch_spec,
                dict(self._mesh.shape),
            )
        return host_to_global_array(host_batch, mesh=self._mesh, partition=self._batch_spec)

    def _new_input_iterator(self):
        """An iterator of host batches (dicts of NumPy arrays) from the start of the input.

        Inputs that can save their position (`iter(input)` + `iterator_state`) are iterated
        directly so the iterator can be checkpointed; others through `dataset()`.
        """
        self._batch_spec = None
        input_module = self.input
        if self._input_is_checkpointable():
            return iter(input_module)
        dataset = input_module.dataset() if hasattr(input_module, "dataset") else input_module
        if hasattr(dataset, "as_numpy_iterator"):
            return dataset.as_numpy_iterator()
        return iter(dataset)


class _PendingStep:
    """A dispatched step whose metrics have not been read yet."""

    def __init__(self, *, step: int, outputs: dict[str, Any], batch: NestedTensor):
        self.step = step
        self.outputs = outputs
        self.batch = batch
        self.drained = False


def select_mesh_config(trainer_config: SpmdTrainer.Config, *, mesh_selector: str):
    """Applies the first of `trainer_config.mesh_rules` whose regex fully matches `mesh_selector`.

    A rule's value is either a mesh shape (or HybridMeshShape), which replaces `mesh_shape`, or a
    ConfigModifier config (or instance), which is applied to the whole trainer config. If no rule
    matches, the config is unchanged (launches go through `mesh_resolution.resolve_mesh`, which
    refuses an unmatched selector).

    Args:
        trainer_config: The trainer config (modified in place).
        mesh_selector: E.g. "tpu-v5litepod-256" or "gpu-p5.48xlarge-64".

    Returns:
        The (possibly modified) trainer config.
    """
    match = match_mesh_rule(trainer_config, mesh_selector)
    if match is None:
        if trainer_config.mesh_rules:
            logging.info(
                "Mesh selector %r matches no mesh rule; keeping the default mesh.", mesh_selector
            )
        return trainer_config
    logging.info("Mesh selector %r matches mesh rule %s.", mesh_selector, match[2])
    return apply_mesh_rule(trainer_config, match[2], mesh_selector=mesh_selector)
