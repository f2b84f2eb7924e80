"""Starting a run from another run's checkpoint (post-training from a pretrained or SFT model).

`init_from_trainer_dir(source_dir, trainer_cfg)` reads the model parameters of a checkpoint of
the run in `source_dir` and writes a step-0 checkpoint of `trainer_cfg` (its dir) holding them,
with the optimizer state initialized for them, as `axlearn hf import` does for a Hugging Face
model. `python -m axlearn.common.launch_trainer_main` (or `SpmdTrainer.run`) with that trainer
dir then restores step 0 and trains from there.

The parameters are mapped by path prefixes, `{target prefix: source prefix}`: `{"": ""}` (the
default) for the same model, `DPO_FROM_CAUSAL_LM` to start both the policy and the frozen
reference of a `dpo.DpoModel` from a causal LM. Every target parameter must be mapped, with the
source's shape and dtype. A LoRA run (`lora_config_modifier`) starts from a run without LoRA:
its adapters keep their own initialization and the wrapped weights (`<proj>/layer/...`) come
from the source's `<proj>/...`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Optional

import jax
import numpy as np

from axlearn.common.checkpointer import Checkpointer, layout
from axlearn.common.config import ConfigBase
from axlearn.common.utils import NestedTensor, flatten_items, tree_paths

# The prefix map that starts a DpoModel's policy and reference from a causal LM's parameters.
DPO_FROM_CAUSAL_LM = {"policy/": "", "reference/": ""}
# The child name of a LoRA layer's adapter (`axlearn.common.lora`).
LORA_ADAPTER = "adapter"


def lora_adapter_parents(paths: Iterable[str]) -> set[str]:
    """The paths of the LoRA-wrapped projections: every `<proj>` of a `<proj>/adapter/...`.

    Args:
        paths: Parameter paths ('/'-joined).

    Returns:
        The projection paths.
    """
    marker = "/" + LORA_ADAPTER + "/"
    return {p.rsplit(marker, 1)[0] for p in paths if marker in p}


def unwrapped_lora_path(path: str, parents: set[str]) -> str:
    """`<proj>/layer/<rest>` -> `<proj>/<rest>` for a LoRA-wrapped `<proj>` in `parents`.

    Args:
        path: A parameter path of the LoRA model.
        parents: `lora_adapter_parents` of the LoRA model.

    Returns:
        The path of the same weight in the model without LoRA (`path` when not wrapped).
    """
    for parent in parents:
        if path.startswith(parent + "/layer/"):
            return parent + path[len(parent) + len("/layer") :]
    return path


def map_parameters(
    source: NestedTensor,
    target: NestedTensor,
    prefixes: Mapping[str, str],
    *,
    lora_initial: Optional[NestedTensor] = None,
) -> NestedTensor:
    """The target tree with each leaf taken from `source` through the longest matching prefix.

    With `lora_initial` (the LoRA target's own initial parameters; the source has no
    adapters), a LoRA target starts from a model without LoRA: every adapter parameter
    (`<proj>/adapter/...`) is taken from `lora_initial`, and every wrapped weight
    `<proj>/layer/<rest>` from the source's `<proj>/<rest>` (`lora_config_modifier`'s layout).

    Args:
        source: The source parameters (nested dicts of arrays).
        target: The target structure (leaves with `.shape` and `.dtype`, e.g. ShapeDtypeStructs).
        prefixes: {target path prefix: source path prefix}; paths are '/'-joined.
        lora_initial: The target's initial parameters for its LoRA adapters, or None.

    Returns:
        A tree of the target's structure holding the source's arrays.

    Raises:
        ValueError: If a target parameter has no prefix, no source parameter, or another shape
            or dtype (naming both paths).
    """
    flat = dict(flatten_items(source))
    ordered = sorted(prefixes.items(), key=lambda kv: -len(kv[0]))
    initial = dict(flatten_items(lora_initial)) if lora_initial is not None else None
    parents = lora_adapter_parents(initial) if initial is not None else set()

    def take(path: str, spec: Any) -> Any:
        if initial is not None and any(path.startswith(p + "/adapter/") for p in parents):
            return initial[path]
        for target_prefix, source_prefix in ordered:
            if path.startswith(target_prefix):
                src = source_prefix + unwrapped_lora_path(path, parents)[len(target_prefix) :]
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
    lora_initial = None
    marker = "/" + LORA_ADAPTER + "/"
    if any(marker in p for p in (p for p, _ in flatten_items(target))) and not any(
        marker in p for p in (p for p, _ in flatten_items(source))
    ):
        # A LoRA run from a run without LoRA: the adapters start from the new run's init.
        trainer.init(jax.random.PRNGKey(seed))
        lora_initial = jax.device_get(trainer.trainer_state.model)
    params = map_parameters(
        source, target, {"": ""} if prefixes is None else prefixes, lora_initial=lora_initial
    )
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
