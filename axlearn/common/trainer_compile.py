"""Compiling SpmdTrainer's train step ahead of time (`SpmdTrainer.compile_train_step`).

Functions of what they are given (the train step, state specs and shardings, the checkpoint
driver and metrics recorder): nothing here reads the trainer's state.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from axlearn.common.compilation_cache import CacheLookups
from axlearn.common.trainer_step import TrainStep, abstract_step_inputs, batch_sharding_of
from axlearn.common.utils import NestedTensor


def compile_train_step(
    step: TrainStep,
    trainer_state_specs: Any,
    input_batch: NestedTensor,
    *,
    state_shardings: Any,
    compiler_options: Optional[dict[str, Any]] = None,
    donate_state: bool = True,
    input_finite: bool = False,
) -> Any:
    """Lowers and compiles `step` for these shapes (ahead of time: nothing runs).

    Args:
        step: The train step.
        trainer_state_specs: The trainer state's shapes (arrays, TensorSpecs or
            ShapeDtypeStructs).
        input_batch: The global input batch (arrays, or ShapeDtypeStructs with shardings).
        state_shardings: The trainer state's shardings.
        compiler_options: XLA compiler options for `Lowered.compile`.
        donate_state: Whether the step donates the trainer state's buffers.
        input_finite: Whether the step also returns whether its input state is all finite.

    Returns:
        The compiled step: (trainer_state, input_batch) -> `trainer_step.TrainStepResult`.
    """
    state, batch = abstract_step_inputs(trainer_state_specs, state_shardings, input_batch)
    jitted = step.jit(
        batch_sharding_of(batch), donate_state=donate_state, input_finite=input_finite
    )
    return jitted.lower(state, batch).compile(compiler_options)


def compile_for_run(
    compile_fn: Callable[..., Any],
    global_batch: NestedTensor,
    *,
    checkpoints: Any,
    metrics: Any,
    trainer_state: Any,
    log: Callable[..., None],
) -> tuple[Any, Optional[Any]]:
    """The run's first compile: the train step, and its non-donating variant if saves need it.

    Also picks where checkpoint snapshots live from the compiled step's memory, sets up their
    host transfers, and reports the compile (FLOPs, memory analysis, seconds) to `metrics`.

    Args:
        compile_fn: `SpmdTrainer.compile_train_step`.
        global_batch: The first global batch.
        checkpoints: The run's `CheckpointDriver`.
        metrics: The run's `MetricsRecorder`.
        trainer_state: The current trainer state.
        log: The trainer's step log function.

    Returns:
        (compiled step, compiled non-donating step or None).
    """
    start = time.perf_counter()
    keep_state = None
    with CacheLookups() as cache:  # Whether the step came from the persistent cache.
        compiled = compile_fn(global_batch)
        checkpoints.choose_snapshot(compiled)
        if checkpoints.saves_alias_state() or checkpoints.next_step_keeps_state:
            keep_state = compile_fn(global_batch, donate_state=False, input_finite=True)
    compile_seconds = time.perf_counter() - start
    log("Compiled the train step in %.2f s (%s).", compile_seconds, cache.describe())
    checkpoints.prepare_transfer(trainer_state)
    metrics.on_compiled(compiled, global_batch, compile_seconds=compile_seconds)
    return compiled, keep_state
