"""The trainer's train step: a pure function of (trainer state, global batch), and its AOT
compilation. `SpmdTrainer.compile_train_step` builds it (see docs/trainer.md).

The step casts float parameters and inputs to `train_dtype` inside the loss (gradients flow
back to the stored parameters through the cast), runs the learner's forward and backward and
returns a `TrainStepResult`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np
from absl import logging

from axlearn.common import utils
from axlearn.common.compiler_options import infer_xsc_compiler_options
from axlearn.common.module import Module, child_context, new_output_collection
from axlearn.common.module import functional as F
from axlearn.common.trainer_checkpointing import TrainerState, checkpointed_floats
from axlearn.common.trainer_utils import all_finite
from axlearn.common.utils import NestedTensor, Tensor


class TrainStepResult(NamedTuple):
    """What a compiled train step returns."""

    # The updated trainer state.
    trainer_state: TrainerState
    # {"loss": scalar, "aux": the model's aux outputs, "summaries": {"model", "learner"}}.
    outputs: dict[str, Any]
    # Whether the input state's parameters and optimizer state are all finite (a device
    # boolean); None unless the step was compiled with `input_finite=True`.
    input_finite: Optional[Tensor] = None


def opt_params(model_params: NestedTensor, param_specs: NestedTensor) -> Any:
    """Wraps parameters in OptParams carrying their specs' metadata for the learner.

    Args:
        model_params: The model parameters.
        param_specs: Their specs (`create_parameter_specs_recursively`).

    Returns:
        The tree of `optimizer_base.OptParam`.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.optimizer_base import OptParam

    def wrap(value, spec):
        return OptParam(
            value=value,
            factorization_spec=getattr(spec, "factorization", None),
            weight_decay_scale=getattr(spec, "weight_decay_scale", None),
        )

    return jax.tree.map(wrap, model_params, param_specs)


def train_cast(tree: NestedTensor, dtype: Any) -> NestedTensor:
    """Casts float leaves of `tree` to `dtype` (no-op when None).

    Args:
        tree: Parameters or inputs.
        dtype: A dtype, a callable applied to the tree (a per-parameter cast), or None.

    Returns:
        The cast tree.
    """
    if dtype is None:
        return tree
    if callable(dtype) and not isinstance(dtype, (type, np.dtype)):
        return dtype(tree)
    return utils.cast_floats(tree, dtype)


class TrainStep:
    """The train step of a model and learner, as pure functions to jit and compile."""

    def __init__(
        self,
        *,
        model: Module,
        learner: Module,
        param_specs: NestedTensor,
        state_shardings: TrainerState,
        train_dtype: Any,
    ):
        """Builds the step.

        Args:
            model: The model module; forward(input_batch=...) returns (loss, aux).
            learner: The learner module.
            param_specs: The model's parameter specs.
            state_shardings: The trainer state's NamedShardings (the step's in/out shardings).
            train_dtype: The instantiated `train_dtype` (see `train_cast`), or None.
        """
        self._model = model
        self._learner = learner
        self._param_specs = param_specs
        self._state_shardings = state_shardings
        self._train_dtype = train_dtype

    def __call__(
        self, state: TrainerState, input_batch: NestedTensor, *, input_finite: bool = False
    ) -> TrainStepResult:
        """One training step: forward, backward and update, as a pure function (jitted).

        Args:
            state: The trainer state.
            input_batch: The global batch.
            input_finite: Whether to also return whether `state` is all finite.

        Returns:
            The new state and the step's outputs.
        """
        new_prng_key, forward_key, learner_key = jax.random.split(state.prng_key, 3)
        outputs, learner_collection = self._forward_and_backward(
            learner_state=state.learner,
            model_params=state.model,
            inputs=dict(input_batch=input_batch, forward_key=forward_key),
            prng_key=learner_key,
        )
        new_state = TrainerState(
            prng_key=new_prng_key,
            model=outputs["updated_params"],
            learner=learner_collection.state_updates,
        )
        summaries = dict(model=outputs["model_summaries"], learner=learner_collection.summaries)
        return TrainStepResult(
            trainer_state=new_state,
            outputs=dict(loss=outputs["loss"], aux=outputs["aux"], summaries=summaries),
            input_finite=all_finite(checkpointed_floats(state)) if input_finite else None,
        )

    def _forward(self, *, model_params: NestedTensor, inputs: NestedTensor) -> Any:
        # The train_dtype cast happens here, inside the loss: gradients flow back to the
        # stored (e.g. fp32) parameters through the cast.
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.learner import ForwardOutputs

        params = train_cast(model_params, self._train_dtype)
        model_collection = new_output_collection()
        with child_context(
            "model",
            module=self._model,
            state=params,
            prng_key=inputs["forward_key"],
            output_collection=model_collection,
        ):
            loss, aux = self._model(
                input_batch=train_cast(inputs["input_batch"], self._train_dtype)
            )
        return ForwardOutputs(loss=loss, aux=aux, output_collection=model_collection)

    def _forward_and_backward(
        self,
        *,
        learner_state: NestedTensor,
        model_params: NestedTensor,
        inputs: NestedTensor,
        prng_key: Tensor,
    ) -> tuple[dict[str, Any], Any]:
        """Runs Learner.forward_and_backward functionally; returns (outputs, learner collection).

        `outputs` holds loss, aux, model_summaries and updated_params; the learner's output
        collection holds its new state (state_updates) and its summaries.
        """
        fwd_bwd, learner_collection = F(
            self._learner,
            method="forward_and_backward",
            prng_key=prng_key,
            state=learner_state,
            inputs=dict(
                fn=self._forward,
                opt_params=opt_params(model_params, self._param_specs),
                inputs=inputs,
            ),
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

    def jit(
        self, batch_sharding: Any, *, donate_state: bool = True, input_finite: bool = False
    ) -> Callable:
        """The jitted step: (state, batch) -> TrainStepResult.

        Args:
            batch_sharding: The batch's shardings.
            donate_state: Whether the step donates the state's buffers.
            input_finite: Whether the result carries the input state's finiteness.

        Returns:
            The jitted function (lower and compile it for AOT).
        """
        return jax.jit(
            lambda state, batch: self(state, batch, input_finite=input_finite),
            in_shardings=(self._state_shardings, batch_sharding),
            out_shardings=TrainStepResult(
                trainer_state=self._state_shardings, outputs=None, input_finite=None
            ),
            donate_argnums=(0,) if donate_state else (),
        )


class PendingStep:
    """A dispatched train step whose metrics the trainer has not read yet."""

    def __init__(self, *, step: int, outputs: dict[str, Any], batch: Any):
        self.step = step  # The step number.
        self.outputs = outputs  # The step's outputs (loss, summaries) as device arrays.
        self.batch = batch  # The host batch it ran on.
        self.drained = False  # Whether the trainer waited for (and checked) its loss.
        # Host scalars of the step (a batch processor's), added to its summaries.
        self.extra_scalars: dict[str, float] = {}


def abstract_step_inputs(trainer_state_specs: Any, state_shardings: Any, input_batch: Any) -> tuple:
    """The train step's inputs as ShapeDtypeStructs with shardings, for lowering.

    Args:
        trainer_state_specs: The trainer state's shapes (arrays, TensorSpecs or ShapeDtypeStructs).
        state_shardings: The trainer state's shardings (same structure).
        input_batch: The global input batch (arrays, or ShapeDtypeStructs with shardings).

    Returns:
        (state, batch): abstract values to `lower` the step with.
    """
    state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        trainer_state_specs,
        state_shardings,
        is_leaf=lambda x: isinstance(x, (utils.TensorSpec, jax.ShapeDtypeStruct)),
    )
    batch = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), input_batch
    )
    return state, batch


def batch_sharding_of(batch: Any) -> Any:
    """The shardings of a (global or abstract) input batch, leaf by leaf.

    Args:
        batch: Arrays or ShapeDtypeStructs with shardings.

    Returns:
        The same structure of shardings.
    """
    return jax.tree.map(lambda x: x.sharding, batch)


class XscSteps:
    """The steps `SpmdTrainer.Config.xsc_check_policy` runs under XLA's silent-data-corruption
    checker (XSC), and the train step compiled for them (with `infer_xsc_compiler_options`).

    XSC exists only on TPU: elsewhere a set policy is logged as ignored (as AXLearn does).
    """

    def __init__(self, policy: Optional[Callable[[int], bool]], *, path: str):
        """Builds the policy's state.

        Args:
            policy: step -> whether it runs under XSC; None: never.
            path: The trainer's path (for the log line).
        """
        backend = jax.default_backend()
        if policy is not None and backend != "tpu":
            logging.warning(
                "%s.xsc_check_policy is set, but XLA's silent-data-corruption checker runs only "
                "on TPU (backend: %s): training without it.",
                path,
                backend,
            )
            policy = None
        self._policy = policy
        self._compiled = None
        self.checked_steps: list[int] = []  # The steps that ran under XSC.

    def step_fn(self, step: int, global_batch: Any, *, compile_fn: Callable[..., Any]) -> Any:
        """The compiled XSC train step if `step` runs under XSC, else None.

        Args:
            step: The step about to be dispatched.
            global_batch: Its global input batch (for the first XSC compile).
            compile_fn: `SpmdTrainer.compile_train_step`.

        Returns:
            The compiled step, or None (run the ordinary one).
        """
        if self._policy is None or not self._policy(step):
            return None
        if self._compiled is None:
            options = infer_xsc_compiler_options(device_kind=jax.devices()[0].device_kind)
            self._compiled = compile_fn(global_batch, compiler_options=options)
        self.checked_steps.append(step)
        return self._compiled
