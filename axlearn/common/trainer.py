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
import re
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any, Callable, Literal, NamedTuple, Optional, Union

import jax
import numpy as np
from absl import logging
from jax import numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common import utils
from axlearn.common.checkpointer import Checkpointer
from axlearn.common.config import (
    REQUIRED,
    ConfigBase,
    ConfigModifier,
    InstantiableConfig,
    Required,
    config_class,
    maybe_instantiate,
)
from axlearn.common.device_memory import compiled_memory_stats, live_memory_per_device
from axlearn.common.device_peak import device_peak_flops
from axlearn.common.evaler import SpmdEvaler
from axlearn.common.flops import lm_training_flops, matmul_param_count
from axlearn.common.metrics import WeightedScalar
from axlearn.common.module import Module, child_context, new_output_collection
from axlearn.common.module import functional as F
from axlearn.common.preemption import PreemptionHandler
from axlearn.common.run_summary import (
    build_run_summary,
    config_hash,
    environment_info,
    format_run_summary,
    write_run_summary,
)
from axlearn.common.step_log import format_step_line, step_throughput
from axlearn.common.step_timer import StepTimer, StepTiming
from axlearn.common.summary_writer import BaseWriter, JsonlWriter, SummaryWriter
from axlearn.common.utils import NestedTensor, Tensor
from axlearn.common.utils_spmd import (
    HybridMeshShape,
    MeshShape,
    batch_partition_spec,
    create_device_mesh,
    host_to_global_array,
    infer_mesh_shape,
)


class TrainerState(NamedTuple):
    """The state the trainer trains and checkpoints."""

    # The PRNG key of the next step.
    prng_key: Any
    # The model parameters.
    model: Any
    # The learner (optimizer) state.
    learner: Any


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite at a step and the learner does not skip such steps."""


class NonFiniteStateError(RuntimeError):
    """The trainer state holds NaN/inf values; it is never checkpointed."""


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
        # On SIGTERM (a preemption notice), the step in flight is finished and saved and the
        # process exits with preemption.PREEMPTED_EXIT_CODE within this many seconds of the
        # signal; None: preemption.DEFAULT_PREEMPTION_TIMEOUT_SECONDS.
        preemption_timeout_seconds: Optional[float] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None, devices=None):
        super().__init__(cfg, parent=parent)
        cfg = self._config
        if not cfg.prune_empty_state_updates:
            raise ValueError(
                f"{self.path()}.prune_empty_state_updates must be True "
                "(keeping empty state updates is not supported)."
            )
        self._step: Optional[int] = None
        self._trainer_state: Optional[TrainerState] = None
        self._compiled_train_step = None
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
            self._add_child("input", _set_if_field(cfg.input, is_training=True))
            summary_cfg = cfg.summary_writer.clone()
            if _is_unset(getattr(summary_cfg, "dir", None)):
                summary_cfg.dir = os.path.join(cfg.dir, "summaries", "train_train")
            self._add_child("summary_writer", summary_cfg)
            # metrics.jsonl: one record per step, always written (not part of the config).
            self._jsonl_writer = self._add_child(
                "metrics_writer", JsonlWriter.default_config().set(dir=cfg.dir)
            )
            self._add_child("model", cfg.model)
            self._add_child("learner", cfg.learner)
            ckpt_cfg = cfg.checkpointer.clone()
            if _is_unset(getattr(ckpt_cfg, "dir", None)):
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
                model=_shardings(self._mesh, self._model_param_specs),
                learner=_shardings(self._mesh, self._learner_state_specs),
            )
            model_param_partition_specs = jax.tree.map(
                lambda s: s.spec, self._trainer_state_shardings.model
            )
            self._evalers: dict[str, SpmdEvaler] = {}
            for name, evaler_cfg in cfg.evalers.items():
                evaler_cfg = evaler_cfg.clone()
                if _is_unset(getattr(evaler_cfg.summary_writer, "dir", None)):
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
    def trainer_state_shardings(self) -> TrainerState:
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

    def restore_checkpoint(self, restore_step: Optional[int] = None) -> Optional[int]:
        """Restores the latest committed checkpoint (or `restore_step`) into the state shardings.

        If the checkpoint holds an input iterator position (and `save_input_iterator` is set),
        the input resumes from it; a checkpoint saved with the other `save_input_iterator`
        setting is restored too (the input then starts from its beginning).

        Args:
            restore_step: The step to restore; None: the latest committed one, if any.

        Returns:
            The restored step, or None if there was nothing to restore.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.checkpointer import StateMismatchError

        with_input = bool(self._config.save_input_iterator) and self._input_is_checkpointable()
        with self._mesh_context():
            try:
                step, state = self.checkpointer.restore(
                    step=restore_step, state=self._checkpoint_state_spec(with_input=with_input)
                )
            except StateMismatchError as e:
                logging.warning(
                    "Restoring with input iterator=%s failed (%s); retrying with %s.",
                    with_input,
                    e,
                    not with_input,
                )
                with_input = not with_input and self._input_is_checkpointable()
                step, state = self.checkpointer.restore(
                    step=restore_step, state=self._checkpoint_state_spec(with_input=with_input)
                )
        if step is None:
            return None
        self._step = int(step)
        self._trainer_state = TrainerState(
            **{k: v for k, v in state.items() if k in TrainerState._fields}
        )
        if self._config.save_input_iterator and "input_iter" in state:
            self._input_iter = self.input.restore_iterator(state["input_iter"])
            self._step_log("Restored the input iterator position.")
        self._step_log("Restored checkpoint at step %s.", step)
        return self._step

    def _input_is_checkpointable(self) -> bool:
        return hasattr(self.input, "iterator_state") and hasattr(self.input, "restore_iterator")

    def _checkpoint_state_spec(self, *, with_input: bool) -> dict[str, Any]:
        """The tree of (shape, dtype, sharding) the checkpointer restores into."""

        def spec(s, sharding):
            return jax.ShapeDtypeStruct(shape=tuple(s.shape), dtype=s.dtype, sharding=sharding)

        specs = jax.tree.map(
            spec,
            self._trainer_state_specs,
            self._trainer_state_shardings,
            is_leaf=lambda x: isinstance(x, (utils.TensorSpec, jax.ShapeDtypeStruct)),
        )
        state = specs._asdict()
        if with_input:
            state["input_iter"] = b""
        return state

    @staticmethod
    def _prng_key_shape() -> tuple:
        return tuple(jax.random.PRNGKey(0).shape)

    @staticmethod
    def _prng_key_dtype():
        return jax.random.PRNGKey(0).dtype

    def _save_checkpoint(
        self, evaler_summaries: Optional[dict[str, Any]], *, force: bool = False
    ) -> None:
        """Saves the current state (the caller checked the policy); refuses non-finite state."""
        self._check_state_finite()
        ckpt_state = self._trainer_state._asdict()
        if self._config.save_input_iterator and self._input_is_checkpointable():
            ckpt_state["input_iter"] = self.input.iterator_state(self._input_iter)
        with self._mesh_context():
            self.checkpointer.save(
                step=self._step, state=ckpt_state, evaler_summaries=evaler_summaries, force=force
            )
        self._last_saved_step = self._step

    def _checkpoint_due(self, evaler_summaries) -> bool:
        policy = getattr(self.checkpointer, "save_policy", None)
        if policy is None:
            policy = getattr(self.checkpointer, "_save_policy", None)
        if policy is None:
            return True
        return bool(policy(step=self._step, evaler_summaries=evaler_summaries))

    def _check_state_finite(self) -> None:
        """Raises NonFiniteStateError if any float leaf of the trainer state is NaN/inf."""
        finite = _all_finite(self._checkpointed_floats())
        if not bool(finite):
            raise NonFiniteStateError(
                f"Step {self._step}: the trainer state (parameters or optimizer state) holds "
                "NaN/inf values; refusing to checkpoint it. The last committed checkpoint is kept."
            )

    def _checkpointed_floats(self) -> Any:
        """The parts of the trainer state checked for NaN/inf before each save."""
        return (self._trainer_state.model, self._trainer_state.learner)

    def _stop_for_preemption(self, current: _PendingStep) -> None:
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
        self._stop_trace()
        if getattr(self, "_last_saved_step", None) != current.step:
            preemption.set_activity(f"saving step {current.step}")
            self._save_checkpoint(None, force=True)
        preemption.set_activity(f"committing step {current.step}")
        self.checkpointer.wait_until_finished()
        error = preemption.preempted(step=current.step, saved_step=current.step)
        self._step_log("%s", error)
        raise error

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

    def _jit_train_step(self, batch_sharding: Any) -> Callable:
        return jax.jit(
            self._train_step,
            in_shardings=(self._trainer_state_shardings, batch_sharding),
            out_shardings=(self._trainer_state_shardings, None),
            donate_argnums=(0,),
        )

    def compile_train_step(self, input_batch: NestedTensor) -> Any:
        """Lowers and compiles the train step for a global batch (arrays or ShapeDtypeStructs).

        Args:
            input_batch: The global input batch (or its shapes, with shardings).

        Returns:
            The compiled step: (trainer_state, input_batch) -> (trainer_state, outputs).
        """
        batch_sharding = jax.tree.map(lambda x: x.sharding, input_batch)
        state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            self._trainer_state,
            self._trainer_state_shardings,
        )
        batch = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), input_batch
        )
        with self._mesh_context():
            lowered = self._jit_train_step(batch_sharding).lower(state, batch)
            return lowered.compile()

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
            self._watchdog(),
            self._mesh_context(),
            PreemptionHandler(timeout_seconds=cfg.preemption_timeout_seconds) as self._preemption,
        ):
            self._input_iter = self._new_input_iterator()
            self._prepare_training(prng_key)
            if self._step >= cfg.max_step:
                self._step_log("Already reached max_step=%s; nothing to do.", cfg.max_step)
                return None
            with self.checkpointer:
                return self._train_loop()

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
                with timer.overhead("compile"):
                    self._compile(global_batch)
            self._step += 1
            self._trainer_state, outputs = self._compiled_train_step(
                self._trainer_state, global_batch
            )
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
        due = [name for name, evaler in self._evalers.items() if _eval_due(evaler, current.step)]
        evaler_summaries: dict[str, Any] = {name: None for name in self._evalers}
        if due:
            self._drain(current)
            with self._timer.overhead("eval"):
                evaler_summaries.update(self._run_eval(due))
        if self._checkpoint_due(evaler_summaries):
            self._drain(current)
            with self._timer.overhead("checkpoint"):
                self._save_checkpoint(evaler_summaries)

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

    def _run_eval(self, names: Sequence[str]) -> dict[str, Any]:
        """Runs the named evalers on the current parameters; returns their summaries."""
        summaries = {}
        prng_key = self._trainer_state.prng_key
        for name in names:
            prng_key, evaler_summaries, _ = self._evalers[name].eval_step(
                self._step,
                prng_key=prng_key,
                model_params=self._trainer_state.model,
                force_run=True,
            )
            summaries[name] = evaler_summaries
        return summaries

    def _finish_step(self, pending: _PendingStep) -> dict[str, Any]:
        """Reads step N's metrics (the host sync on its loss), closes its interval, reports it."""
        host = jax.device_get(
            dict(loss=pending.outputs["loss"], summaries=_scalar_tree(pending.outputs["summaries"]))
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
        self._num_nonfinite_steps = 0
        self._records: list[dict[str, Any]] = []
        if self.restore_checkpoint() is None:
            self.init(prng_key)
            # Policies with min_step=1 do nothing at step 0.
            due = [n for n, e in self._evalers.items() if _eval_due(e, self._step)]
            evaler_summaries = {n: None for n in self._evalers}
            if due:
                evaler_summaries.update(self._run_eval(due))
            if self._checkpoint_due(evaler_summaries):
                self._save_checkpoint(evaler_summaries)
        self._first_step = self._step
        # Compile the finiteness check of checkpointed state now, not inside a step's interval.
        jax.block_until_ready(_all_finite(self._checkpointed_floats()))
        self._skips_nonfinite = _learner_skips_nonfinite(cfg.learner)
        self._log_model_analysis()
        self._measure_peak()
        if hasattr(self.summary_writer, "log_config"):
            self.summary_writer.log_config(cfg, step=self._step)

    def _measure_peak(self) -> None:
        """Sets the peak FLOP/s per device for MFU (table, configured, or CPU matmul probe).

        Runs before the first step so the CPU probe's time is never charged to a step.
        """
        cfg = self._config
        self._peak = None
        if cfg.peak_flops_per_device:
            self._peak_flops = float(cfg.peak_flops_per_device)
            self._peak_description = (
                f"{self._peak_flops / 1e12:.4g} TFLOP/s per device (configured)"
            )
        else:
            dtype = cfg.train_dtype
            if dtype is None or not isinstance(dtype, (str, type, np.dtype)):
                dtype = "float32"
            self._peak = device_peak_flops(list(self._mesh.devices.flat), dtype=dtype)
            self._peak_flops = self._peak.flops_per_s
            self._peak_description = self._peak.describe()
        self._step_log("Peak for MFU: %s", self._peak_description)

    def _log_model_analysis(self) -> None:
        num_params = utils.count_model_params(self._model_param_specs)
        self._num_params = num_params
        self._step_log("Model parameters: %s", f"{num_params:,}")
        for path, spec in utils.flatten_items(self._model_param_specs):
            self._step_log("  %-60s %-20s %s", path, tuple(spec.shape), spec.mesh_axes)

    def _compile(self, global_batch: NestedTensor) -> None:
        """AOT-compiles the train step for this batch's shapes; logs memory analysis."""
        start = time.perf_counter()
        self._compiled_train_step = self.compile_train_step(global_batch)
        self._compile_seconds = time.perf_counter() - start
        self._step_log("Compiled the train step in %.2f s.", self._compile_seconds)
        self._on_compiled(self._compiled_train_step, global_batch)

    def _host_to_global(self, host_batch: NestedTensor) -> NestedTensor:
        """Turns this process's host batch into global arrays sharded over the batch axes."""
        if self._batch_spec is None:
            global_batch_size = _leading_dim(host_batch) * jax.process_count()
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

    # ------------------------------------------------------------------------------------------
    # Profiling and the watchdog.
    # ------------------------------------------------------------------------------------------

    def _should_trace_here(self) -> bool:
        indices = self._config.start_trace_process_indices
        return indices == "all" or jax.process_index() in indices

    def _maybe_trace(self, stop_trace_step: Optional[int], pending) -> Optional[int]:
        """Starts a 3-step jax.profiler trace at configured steps; stops it 3 steps later."""
        next_step = self._step + 1
        if stop_trace_step is not None and next_step >= stop_trace_step:
            with self._timer.overhead("profiler"):
                if pending is not None:
                    jax.block_until_ready(pending.outputs["loss"])
                self._stop_trace()
            stop_trace_step = None
        if next_step in self._config.start_trace_steps and self._should_trace_here():
            if stop_trace_step is not None:
                logging.warning("Not tracing at step %d: a trace is still running.", next_step)
            else:
                with self._timer.overhead("profiler"):
                    trace_dir = os.path.join(self._config.dir, "summaries", "train_train")
                    jax.profiler.start_trace(trace_dir)
                    self._tracing = True
                self._step_log("Started profiler trace for steps %d-%d.", next_step, next_step + 2)
                stop_trace_step = next_step + 3
        return stop_trace_step

    def _stop_trace(self) -> None:
        if getattr(self, "_tracing", False):
            jax.profiler.stop_trace()
            self._tracing = False
            self._step_log("Stopped profiler trace.")

    @contextlib.contextmanager
    def _watchdog(self):
        cfg = self._config
        if cfg.watchdog_timeout_seconds or cfg.crash_on_hang_timeout_seconds:
            self._watchdog_stop = threading.Event()
            self._watchdog_thread = threading.Thread(
                target=self._watchdog_loop, name=f"{self.path()}.watchdog", daemon=True
            )
            self._watchdog_thread.start()
        try:
            yield
        finally:
            if self._watchdog_thread is not None:
                self._watchdog_stop.set()
                self._watchdog_thread.join()
                self._watchdog_thread = None

    def _watchdog_loop(self) -> None:
        """Logs every thread's stack if the step does not advance; optionally kills the process."""
        cfg = self._config
        timeouts = [
            t for t in (cfg.watchdog_timeout_seconds, cfg.crash_on_hang_timeout_seconds) if t
        ]
        interval = min(min(timeouts), 60.0)
        last_step, last_change = self._step, time.monotonic()
        reported = False
        while not self._watchdog_stop.wait(interval):
            if self._step != last_step:
                last_step, last_change, reported = self._step, time.monotonic(), False
                continue
            stalled = time.monotonic() - last_change
            if (
                cfg.watchdog_timeout_seconds
                and stalled >= cfg.watchdog_timeout_seconds
                and not reported
            ):
                logging.warning(
                    "Watchdog: step %s has not advanced for %.0f s. Thread stacks:\n%s",
                    self._step,
                    stalled,
                    thread_stack_traces(),
                )
                reported = True
            if cfg.crash_on_hang_timeout_seconds and stalled >= cfg.crash_on_hang_timeout_seconds:
                logging.error(
                    "Watchdog: step %s has not advanced for %.0f s; exiting.", self._step, stalled
                )
                os._exit(1)  # pylint: disable=protected-access

    # ------------------------------------------------------------------------------------------
    # Metrics: FLOPs, peak, memory, per-step records, the run summary.
    # ------------------------------------------------------------------------------------------

    def _on_compiled(self, compiled: Any, global_batch: NestedTensor) -> None:
        """Logs FLOPs per step, the peak FLOP/s used for MFU, and the compiled memory analysis."""
        cfg = self._config
        self._num_devices = self._mesh.devices.size
        batch_shape = _batch_shape(global_batch)
        self._tokens_per_step = int(np.prod(batch_shape)) if batch_shape else 0
        self._step_flops = _model_step_flops(cfg.model, self._model_param_specs, batch_shape)
        if self._step_flops is not None:
            self._step_log("%s", self._step_flops.describe())
        self._compiled_memory = compiled_memory_stats(compiled)
        if self._compiled_memory is not None:
            self._step_log("%s", self._compiled_memory.describe())

    def _step_record(
        self, pending: _PendingStep, *, loss: float, scalars: dict[str, Any], timing: StepTiming
    ) -> dict[str, Any]:
        """The metrics of one finished step (what the log line, JSONL and summary show)."""
        cfg = self._config
        wall = timing.wall_s
        record: dict[str, Any] = dict(
            step=pending.step,
            max_step=cfg.max_step,
            loss=loss,
            step_time_s=wall,
            overheads=dict(timing.overheads),
            excluded_reason=timing.excluded_reason,
        )
        lr = _find_scalar(scalars, r"(.*/)?(learning_rate|lr)")
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
        record["consumed_tokens"] = pending.step * tokens
        real = _real_tokens(pending.batch)
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
            record["eta_s"] = max(0.0, (cfg.max_step - pending.step) * avg)
        return record

    def _report_step(self, record: dict[str, Any], *, scalars: dict[str, Any]) -> None:
        """Logs the step line; writes summaries (TensorBoard) and the JSONL record."""
        cfg = self._config
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
        values = dict(loss=record["loss"], **_unflatten(scalars), perf=perf)
        self.summary_writer(step, values)
        self._jsonl_writer(step, dict(values, excluded_reason=record["excluded_reason"] or ""))

    def _write_run_summary(self) -> dict[str, Any]:
        """Logs the end-of-run summary block and writes <dir>/run_summary.json (process 0)."""
        cfg = self._config
        memory = [m.to_dict() for m in live_memory_per_device()]
        summary = build_run_summary(
            self._records,
            num_params=self._num_params,
            num_devices=self._mesh.devices.size,
            tokens_per_step=getattr(self, "_tokens_per_step", 0),
            flops_per_step=(
                self._step_flops.total_flops if getattr(self, "_step_flops", None) else None
            ),
            flops=self._step_flops.to_dict() if getattr(self, "_step_flops", None) else None,
            peak=self._peak.to_dict() if getattr(self, "_peak", None) else None,
            memory=memory,
            compiled_memory=(
                self._compiled_memory.to_dict() if getattr(self, "_compiled_memory", None) else None
            ),
            environment=environment_info(list(self._mesh.devices.flat)),
            config_digest=config_hash(cfg),
            extra=dict(
                name=cfg.name,
                trainer_dir=cfg.dir,
                mesh=dict(self._mesh.shape),
                compile_s=getattr(self, "_compile_seconds", None),
            ),
        )
        logging.info("\n%s", format_run_summary(summary))
        if jax.process_index() == 0:
            write_run_summary(cfg.dir, summary)
        return summary


def thread_stack_traces() -> str:
    """Returns the current stack of every Python thread, as text."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():  # pylint: disable=protected-access
        parts.append(
            f"--- Thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
        )
    return "\n".join(parts)


class _PendingStep:
    """A dispatched step whose metrics have not been read yet."""

    def __init__(self, *, step: int, outputs: dict[str, Any], batch: NestedTensor):
        self.step = step
        self.outputs = outputs
        self.batch = batch
        self.drained = False


def _is_unset(value: Any) -> bool:
    return value is None or value is REQUIRED or not isinstance(value, str)


def _set_if_field(cfg: ConfigBase, **kwargs) -> ConfigBase:
    """Returns a copy of `cfg` with the given fields set where `cfg` has them."""
    cfg = cfg.clone()
    for k, v in kwargs.items():
        if k in cfg:
            setattr(cfg, k, v)
    return cfg


def _shardings(mesh: jax.sharding.Mesh, specs: Any) -> Any:
    """NamedShardings for a tree of TensorSpec-like leaves (with `.mesh_axes`; None: replicated).

    None subtrees (no state) stay None.

    Raises:
        ValueError: If a spec names an axis the mesh lacks (the message names the parameter).
    """
    axis_names = set(mesh.axis_names)

    def is_spec(x):
        return hasattr(x, "mesh_axes")

    def to_sharding(path, spec):
        axes = spec.mesh_axes
        partition = PartitionSpec() if axes is None else PartitionSpec(*axes)
        for entry in partition:
            for name in entry if isinstance(entry, (tuple, list)) else (entry,):
                if name is not None and name not in axis_names:
                    raise ValueError(
                        f"Partition spec {partition} of '{_path_str(path)}' names mesh "
                        f"axis '{name}', which is not among the mesh axes {tuple(mesh.axis_names)}."
                    )
        return NamedSharding(mesh, partition)

    return jax.tree_util.tree_map_with_path(to_sharding, specs, is_leaf=is_spec)


def _path_str(path: tuple) -> str:
    """'a/b/c' for a jax key path."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _leading_dim(tree: Any) -> int:
    sizes = {np.shape(x)[0] for x in jax.tree.leaves(tree) if np.ndim(x) > 0}
    if len(sizes) != 1:
        raise ValueError(f"Input batch leaves must share one leading (batch) dim; got {sizes}.")
    return int(sizes.pop())


def _scalar_tree(tree: Any) -> Any:
    """The 0-d array leaves of `tree` (others dropped), for one batched device-to-host transfer."""
    if isinstance(tree, dict):
        out = {k: _scalar_tree(v) for k, v in tree.items()}
        return {k: v for k, v in out.items() if v is not None and not _is_empty_dict(v)}
    if isinstance(tree, WeightedScalar):
        tree = tree.mean
    if hasattr(tree, "ndim") and tree.ndim == 0:
        return tree
    return None


def _is_empty_dict(x: Any) -> bool:
    return isinstance(x, dict) and not x


@jax.jit
def _all_finite(tree: Any) -> Tensor:
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def _eval_due(evaler: Any, step: int) -> bool:
    """Whether `evaler`'s policy fires at `step`."""
    for name in ("eval_policy", "_eval_policy"):
        policy = getattr(evaler, name, None)
        if policy is not None and callable(policy):
            return bool(policy(step=step, train_summaries=None))
    return False


def _learner_skips_nonfinite(learner_cfg: ConfigBase) -> bool:
    """Whether the learner skips non-finite steps (skip_and_clip_by_global_norm, loss scaling)."""
    text = learner_cfg.debug_string()
    return bool(re.search(r"skip_and_clip_by_global_norm|loss_scal", text))


def select_mesh_config(trainer_config: SpmdTrainer.Config, *, mesh_selector: str):
    """Applies the first of `trainer_config.mesh_rules` whose regex fully matches `mesh_selector`.

    A rule's value is either a mesh shape (or HybridMeshShape), which replaces `mesh_shape`, or a
    ConfigModifier config (or instance), which is applied to the whole trainer config. If no rule
    matches, the config is unchanged.

    Args:
        trainer_config: The trainer config (modified in place).
        mesh_selector: E.g. "tpu-v5litepod-256" or "gpu-p5.48xlarge-64".

    Returns:
        The (possibly modified) trainer config.
    """
    rules = trainer_config.mesh_rules
    if not rules:
        return trainer_config
    rule = utils.match_regex_rules(mesh_selector, rules=rules, default_value=REQUIRED)
    if rule is REQUIRED:
        logging.info(
            "Mesh selector %r matches no mesh rule; keeping the default mesh.", mesh_selector
        )
        return trainer_config
    logging.info("Mesh selector %r matches mesh rule %s.", mesh_selector, rule)
    if rule is None or isinstance(rule, (tuple, list, HybridMeshShape)):
        trainer_config.mesh_shape = rule
        return trainer_config
    modifier = maybe_instantiate(rule)
    if not isinstance(modifier, ConfigModifier):
        raise TypeError(
            f"Mesh rule for {mesh_selector!r} must be a mesh shape or a ConfigModifier config; "
            f"got {type(modifier).__name__}."
        )
    result = modifier(trainer_config)
    return trainer_config if result is None else result


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
