"""Starting a run from another run's checkpoint (post-training from a pretrained or SFT model).

`init_from_trainer_dir(source_dir, trainer_cfg)` reads the model parameters of a checkpoint of
the run in `source_dir` and writes a step-0 checkpoint of `trainer_cfg` (its dir) holding them,
with the optimizer state initialized for them, as `axlearn hf import` does for a Hugging Face
model. `python -m axlearn.common.launch_trainer_main` (or `SpmdTrainer.run`) with that trainer
dir then restores step 0 and trains from there.

The parameters are mapped by path prefixes, `{target prefix: source prefix}`: `{"": ""}` (the
default) for the same model, `DPO_FROM_CAUSAL_LM` to start both the policy and the frozen
reference of a `dpo.DpoModel` from a causal LM. Every target parameter must be mapped, with the
source's shape and dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import jax
import numpy as np

from axlearn.common.checkpointer import Checkpointer, layout
from axlearn.common.config import ConfigBase
from axlearn.common.utils import NestedTensor, flatten_items, tree_paths

# The prefix map that starts a DpoModel's policy and reference from a causal LM's parameters.
DPO_FROM_CAUSAL_LM = {"policy/": "", "reference/": ""}


def map_parameters(
    source: NestedTensor, target: NestedTensor, prefixes: Mapping[str, str]
) -> NestedTensor:
    """The target tree with each leaf taken from `source` through the longest matching prefix.

    Args:
        source: The source parameters (nested dicts of arrays).
        target: The target structure (leaves with `.shape` and `.dtype`, e.g. ShapeDtypeStructs).
        prefixes: {target path prefix: source path prefix}; paths are '/'-joined.

    Returns:
        A tree of the target's structure holding the source's arrays.

    Raises:
        ValueError: If a target parameter has no prefix, no source parameter, or another shape
            or dtype (naming both paths).
    """
    flat = dict(flatten_items(source))
    ordered = sorted(prefixes.items(), key=lambda kv: -len(kv[0]))

    def take(path: str, spec: Any) -> Any:
        for target_prefix, source_prefix in ordered:
            if path.startswith(target_prefix):
                src = source_prefix + path[len(target_prefix) :]
                break
        else:
            raise ValueError(f"map_parameters: no prefix of {dict(prefixes)} matches {path!r}")
        if src not in flat:
            near = [p for p in flat if p.rsplit("/", 1)[-1] == src.rsplit("/", 1)[-1]][:3]
            raise ValueError(
                f"map_parameters: target {path!r} maps to source {src!r}, which the source does "
                f"not have (similar: {near})"
            )
        value = flat[src]
        if tuple(value.shape) != tuple(spec.shape) or np.dtype(value.dtype) != np.dtype(spec.dtype):
            raise ValueError(
                f"map_parameters: target {path!r} is {tuple(spec.shape)} {np.dtype(spec.dtype)} "
                f"but source {src!r} is {tuple(value.shape)} {np.dtype(value.dtype)}"
            )
        return value

    return jax.tree.map(take, tree_paths(target), target)


def init_from_trainer_dir(
    source_dir: str,
    trainer_cfg: ConfigBase,
    *,
    source_model: Optional[ConfigBase] = None,
    step: Optional[int] = None,
    prefixes: Optional[Mapping[str, str]] = None,
    seed: int = 0,
) -> str:
    """Writes a step-0 checkpoint of `trainer_cfg` with the model parameters of another run.

    Args:
        source_dir: The source run's trainer dir (its checkpoints under `checkpoints/`).
        trainer_cfg: The new run's trainer config, its `dir` set (a new trainer dir).
        source_model: The source run's model config; None: rebuilt from the source run's
            record (a run launched with launch_trainer_main).
        step: The source checkpoint step; None: the newest committed one.
        prefixes: {target prefix: source prefix} (see `map_parameters`); None: {"": ""}.
        seed: The seed of the new trainer state's PRNG key.

    Returns:
        The written step directory.

    Raises:
        ValueError: If the new trainer dir already holds a committed checkpoint, or the
            parameters do not map (see `map_parameters`).
    """
    # pylint: disable=import-outside-toplevel,protected-access
    from axlearn.common.inference import InferenceRunner

    trainer = trainer_cfg.instantiate(parent=None)
    ckpt_dir = trainer.checkpointer.config.dir
    existing = layout.latest_checkpoint_step(ckpt_dir)
    if existing is not None:
        raise ValueError(
            f"{ckpt_dir} already holds a committed checkpoint (step {existing}); start from "
            "another run into a new trainer dir."
        )
    if source_model is None:
        runner = InferenceRunner.from_trainer_dir(source_dir, evalers=[], step=step)
    else:
        runner = (
            InferenceRunner.default_config()
            .set(
                name="source",
                mesh_shape=trainer_cfg.mesh_shape,
                mesh_axis_names=trainer_cfg.mesh_axis_names,
                batch_axis_names=trainer_cfg.batch_axis_names,
                model=source_model.clone(),
                checkpointer=Checkpointer.default_config().set(
                    dir=f"{source_dir.rstrip('/')}/checkpoints"
                ),
            )
            .instantiate(parent=None)
        )
    runner.restore(step)
    target = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(tuple(s.shape), s.dtype),
        trainer.trainer_state_specs.model,
        is_leaf=lambda x: hasattr(x, "mesh_axes"),
    )
    source = jax.device_get(runner.params)
    params = map_parameters(source, target, {"": ""} if prefixes is None else prefixes)
    return save_initial_state(trainer, params, seed=seed)


def save_initial_state(trainer: Any, params: NestedTensor, *, seed: int) -> str:
    """Writes step 0 of `trainer`'s checkpointer: `params`, a fresh optimizer state, `seed`'s key.

    Args:
        trainer: An instantiated `SpmdTrainer` (its state specs, shardings and checkpointer).
        params: The model's parameters, in the trainer's model tree.
        seed: The seed of the state's PRNG key.

    Returns:
        The step-0 checkpoint directory.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.trainer_checkpointing import TrainerState

    # pylint: disable=protected-access
    shardings = trainer._trainer_state_shardings
    with trainer._mesh_context():
        params = jax.device_put(params, shardings.model)
        learner_state = jax.jit(
            lambda p: trainer.learner.init(trainer._opt_params(p)), out_shardings=shardings.learner
        )(params)
        prng_key = jax.device_put(jax.random.PRNGKey(seed), shardings.prng_key)
        state = TrainerState(prng_key=prng_key, model=params, learner=learner_state)
        trainer.checkpointer.save(step=0, state=state._asdict(), force=True)
        trainer.checkpointer.wait_until_finished()
    return trainer.checkpointer.ckpt_dir(0)
