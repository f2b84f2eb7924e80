"""Compiling SpmdTrainer's train step ahead of time: `compile_train_step` and the first compile.

A mixin of `SpmdTrainer` (the methods use its mesh, state specs and shardings, model and
learner); public under the trainer as AXLearn's `SpmdTrainer.compile_train_step`.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from axlearn.common.compilation_cache import CacheLookups
from axlearn.common.trainer_checkpointing import TrainerState
from axlearn.common.trainer_step import TrainStep, abstract_step_inputs, batch_sharding_of
from axlearn.common.trainer_utils import global_batch_specs
from axlearn.common.utils import NestedTensor


class TrainStepCompiler:
    """`SpmdTrainer`'s train-step compilation (see the module docstring)."""

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
            The compiled step: (trainer_state, input_batch) -> `trainer_step.TrainStepResult`
            (trainer_state, outputs, input_finite; the last None unless `input_finite`).
        """
        if input_batch is None:
            input_batch = global_batch_specs(
                self.input, mesh=self._mesh, batch_axis_names=self._config.batch_axis_names
            )
        if trainer_state_specs is None:
            trainer_state_specs = self._trainer_state
            if trainer_state_specs is None:
                trainer_state_specs = self._trainer_state_specs
        state, batch = abstract_step_inputs(
            trainer_state_specs, self._trainer_state_shardings, input_batch
        )
        step = TrainStep(
            model=self.model,
            learner=self.learner,
            param_specs=self._model_param_specs,
            state_shardings=self._trainer_state_shardings,
            train_dtype=self._per_param_train_dtype,
        )
        with self._mesh_context():
            jitted = step.jit(
                batch_sharding_of(batch), donate_state=donate_state, input_finite=input_finite
            )
            return jitted.lower(state, batch).compile(compiler_options)

    def _compile(self, global_batch: NestedTensor) -> None:
        """AOT-compiles the train step for this batch's shapes; logs memory analysis."""
        start = time.perf_counter()
        with CacheLookups() as cache:  # Whether the step came from the persistent cache.
            self._compiled_train_step = self.compile_train_step(global_batch)
            checkpoints = self._checkpoints
            checkpoints.choose_snapshot(self._compiled_train_step)
            if checkpoints.saves_alias_state() or checkpoints.next_step_keeps_state:
                self._compiled_train_step_keep_state = self.compile_train_step(
                    global_batch, donate_state=False, input_finite=True
                )
        compile_seconds = time.perf_counter() - start
        self._step_log("Compiled the train step in %.2f s (%s).", compile_seconds, cache.describe())
        checkpoints.prepare_transfer(self._trainer_state)
        self._metrics.on_compiled(
            self._compiled_train_step, global_batch, compile_seconds=compile_seconds
        )
