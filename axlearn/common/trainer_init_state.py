"""How `SpmdTrainer.init` applies `init_state_builder` (a `state_builder.Builder`).

The trainer runs its init state builder only when it starts without a checkpoint of its own
(a run that resumes restores its checkpoint instead), as AXLearn's trainer does:

- a builder of `StateType.TENSOR_SPECS` runs *before* the random initialization, on the state
  specs. If it built every leaf, its state is the trainer state; otherwise it may have built only
  model parameters (e.g. `ModelStateScopeConverter`), and the trainer initializes the others
  (with the same random values as without a builder) and the learner state from the merged
  parameters;
- a builder of `StateType.TENSORS` runs *after* it, on the initialized arrays, and its output is
  the trainer state.

Either way every array is placed on the trainer's shardings. `init` takes the builder's step
(AXLearn's semantics); a run (`SpmdTrainer.run`) that starts from a builder's state still counts
its own steps from 0.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
from absl import logging

from axlearn.common.state_builder import Builder
from axlearn.common.trainer_checkpointing import TrainerState
from axlearn.common.trainer_step import opt_params
from axlearn.common.utils import Tensor, flatten_items, tree_paths


def initial_state(
    builder: Optional[Builder],
    *,
    random_init: Callable[..., Any],
    state_specs: Any,
    shardings: Any,
    path: str,
) -> tuple[Any, Optional[int]]:
    """The trainer's initial state: a random one, or built by `builder` (see the module doc).

    Args:
        builder: The trainer's init state builder, or None.
        random_init: Returns a random trainer state; called with `prebuilt=` (a Builder.State)
            when a TENSOR_SPECS builder built only some model parameters.
        state_specs: The trainer state specs.
        shardings: The trainer state shardings.
        path: The trainer's module path (for logs and errors).

    Returns:
        (trainer_state, step): step is the builder's (None without a builder, or if it has none).
    """
    if builder is None:
        return random_init(), None
    if builder.input_state_type() == Builder.StateType.TENSORS:
        built = run_init_state_builder(builder, step=0, trainer_state=random_init(), path=path)
        state = place_complete_state(built, state_specs=state_specs, shardings=shardings)
        return state, built.step
    built = run_init_state_builder(builder, step=None, trainer_state=state_specs, path=path)
    if is_complete(built, state_specs=state_specs):
        state = place_complete_state(built, state_specs=state_specs, shardings=shardings)
    else:
        state = random_init(prebuilt=built)
    return state, built.step


def run_init_state_builder(
    builder: Builder, *, step: Optional[int], trainer_state: Any, path: str
) -> Builder.State:
    """Runs `builder` on `trainer_state` (specs or arrays, per its input state type).

    Args:
        builder: The trainer's init state builder.
        step: The trainer's step (None before the initialization).
        trainer_state: The trainer state specs, or the initialized trainer state.
        path: The trainer's module path (for logs).

    Returns:
        The built state.
    """
    logging.info("%s: building the initial state with %s", path, type(builder).__name__)
    built = builder(Builder.State(step=step, trainer_state=trainer_state, built_keys=set()))
    logging.info(
        "%s: init_state_builder built %d leaves (source step %s): %s",
        path,
        len(built.built_keys),
        built.step,
        sorted(built.built_keys)[:20],
    )
    return built


def _check_shapes(built: Any, specs: Any, *, prefix: str, only_arrays: bool) -> None:
    """Raises ValueError naming each leaf whose path set or shape differs from the specs."""
    built_items = dict(flatten_items(built))
    spec_items = dict(flatten_items(specs))
    if only_arrays:
        built_items = {k: v for k, v in built_items.items() if isinstance(v, Tensor)}
        extra = sorted(set(built_items) - set(spec_items))
        missing = []
    else:
        extra = sorted(set(built_items) - set(spec_items))
        missing = sorted(set(spec_items) - set(built_items))
    if extra or missing:
        raise ValueError(
            f"init_state_builder: the built state does not match the trainer state: "
            f"unexpected {[prefix + p for p in extra]}, missing {[prefix + p for p in missing]}"
        )
    for key, value in built_items.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"init_state_builder: {prefix}{key}={value!r} is not an array")
        want = tuple(spec_items[key].shape)
        if tuple(value.shape) != want:
            raise ValueError(
                f"init_state_builder: shape mismatch for {prefix}{key}: built "
                f"{tuple(value.shape)}, the trainer's is {want}"
            )


def place_complete_state(built: Builder.State, *, state_specs: Any, shardings: Any) -> Any:
    """Checks a completely built state against the specs and places it on the shardings.

    Args:
        built: The built state (every leaf an array).
        state_specs: The trainer state specs.
        shardings: The trainer state's NamedShardings.

    Returns:
        The trainer state on `shardings`.

    Raises:
        ValueError: If a leaf is missing, unexpected, not an array or of another shape.
    """
    _check_shapes(built.trainer_state, state_specs, prefix="", only_arrays=False)
    return jax.tree.map(lambda x, s: jax.device_put(x, s), built.trainer_state, shardings)


def is_complete(built: Builder.State, *, state_specs: Any) -> bool:
    """Whether `built` holds every leaf of the trainer state.

    Args:
        built: The built state.
        state_specs: The trainer state specs.

    Returns:
        True if `built.built_keys` names every leaf path of `state_specs`.
    """
    return built.built_keys == {path for path, _ in flatten_items(state_specs)}


def prebuilt_model(built: Builder.State, *, model_specs: Any) -> tuple[Any, Any]:
    """Splits a partially built state into what the model initialization needs.

    Args:
        built: The built state; only model parameters may be built.
        model_specs: The model parameter specs.

    Returns:
        (prebuilt specs: the tree of `model_specs` with the spec where a parameter is built and
        None elsewhere, for `initialize_parameters_recursively(prebuilt=...)`;
        prebuilt arrays: the built array where a parameter is built, None elsewhere).

    Raises:
        NotImplementedError: If a non-model leaf is built (only model parameters may be).
        ValueError: If a built parameter is not in the model or has another shape.
    """
    for key in sorted(built.built_keys):
        if not key.startswith("model/"):
            raise NotImplementedError(f"Partial initialization is not supported for: {key}")
    model = built.trainer_state.model
    _check_shapes(model, model_specs, prefix="model/", only_arrays=True)
    built_arrays = {k: v for k, v in flatten_items(model) if isinstance(v, Tensor)}

    def pick(path: str, spec: Any, want_array: bool) -> Any:
        if path not in built_arrays:
            return None
        return built_arrays[path] if want_array else spec

    paths = tree_paths(model_specs)
    specs = jax.tree.map(lambda p, s: pick(p, s, False), paths, model_specs)
    arrays = jax.tree.map(lambda p, s: pick(p, s, True), paths, model_specs)
    return specs, arrays


def merge_model_params(model_specs: Any, prebuilt_arrays: Any, initialized: Any) -> Any:
    """The model parameters: the prebuilt array where there is one, else the initialized one.

    Args:
        model_specs: The model parameter specs (the structure).
        prebuilt_arrays: Arrays where prebuilt, None elsewhere.
        initialized: The initialized parameters (None where prebuilt).

    Returns:
        The merged parameters.
    """
    return jax.tree.map(
        lambda _, prebuilt, init: init if prebuilt is None else prebuilt,
        model_specs,
        prebuilt_arrays,
        initialized,
    )


def random_state(
    model: Any,
    learner: Any,
    *,
    prng_key: Tensor,
    model_specs: Any,
    shardings: Any,
    prebuilt: Optional[Builder.State] = None,
) -> Any:
    """A randomly initialized trainer state, created sharded (one jitted init).

    The key is split once: the second half initializes the model
    (`initialize_parameters_recursively`, as AXLearn's trainer does), the first is the state's
    key. Model parameters `prebuilt` holds are taken from it instead (see `prebuilt_model`).

    Args:
        model: The model module.
        learner: The learner module.
        prng_key: The initialization key.
        model_specs: The model's parameter specs.
        shardings: The trainer state's shardings.
        prebuilt: A TENSOR_SPECS builder's state holding some model parameters, or None.

    Returns:
        The `TrainerState`.
    """
    prebuilt_specs, prebuilt_arrays = None, None
    if prebuilt is not None:
        prebuilt_specs, prebuilt_arrays = prebuilt_model(prebuilt, model_specs=model_specs)

    def init_fn(key, prebuilt_arrays):
        key, init_key = jax.random.split(key)
        params = model.initialize_parameters_recursively(init_key, prebuilt=prebuilt_specs)
        if prebuilt_arrays is not None:
            params = merge_model_params(model_specs, prebuilt_arrays, params)
        learner_state = learner.init(opt_params(params, model_specs))
        return TrainerState(prng_key=key, model=params, learner=learner_state)

    return jax.jit(init_fn, out_shardings=shardings)(prng_key, prebuilt_arrays)
