"""Helpers of SpmdTrainer: shardings from specs, batch/tree utilities, policy checks."""

from __future__ import annotations

import os
import re
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common.config import REQUIRED, ConfigBase
from axlearn.common.metrics import WeightedScalar
from axlearn.common.utils import TensorSpec, unknown_mesh_axes
from axlearn.common.utils import all_finite as utils_all_finite


def is_unset(value: Any) -> bool:
    return value is None or value is REQUIRED or not isinstance(value, str)


def set_if_field(cfg: ConfigBase, **kwargs) -> ConfigBase:
    """Returns a copy of `cfg` with the given fields set where `cfg` has them."""
    cfg = cfg.clone()
    for k, v in kwargs.items():
        if k in cfg:
            setattr(cfg, k, v)
    return cfg


def shardings_of_specs(mesh: jax.sharding.Mesh, specs: Any) -> Any:
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
        for name in unknown_mesh_axes(partition, axis_names):
            raise ValueError(
                f"Partition spec {partition} of '{path_str(path)}' names mesh "
                f"axis '{name}', which is not among the mesh axes {tuple(mesh.axis_names)}."
            )
        return NamedSharding(mesh, partition, memory_kind=getattr(spec, "memory_kind", None))

    return jax.tree_util.tree_map_with_path(to_sharding, specs, is_leaf=is_spec)


def path_str(path: tuple) -> str:
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


def leading_dim(tree: Any) -> int:
    sizes = {np.shape(x)[0] for x in jax.tree.leaves(tree) if np.ndim(x) > 0}
    if len(sizes) != 1:
        raise ValueError(f"Input batch leaves must share one leading (batch) dim; got {sizes}.")
    return int(sizes.pop())


def scalar_tree(tree: Any) -> Any:
    """The 0-d array leaves of `tree` (others dropped), for one batched device-to-host transfer."""
    if isinstance(tree, dict):
        out = {k: scalar_tree(v) for k, v in tree.items()}
        return {k: v for k, v in out.items() if v is not None and not _is_empty_dict(v)}
    if isinstance(tree, WeightedScalar):
        tree = tree.mean
    if hasattr(tree, "ndim") and tree.ndim == 0:
        return tree
    return None


def _is_empty_dict(x: Any) -> bool:
    return isinstance(x, dict) and not x


# `utils.all_finite` (the one definition), jitted: the trainer calls it outside jit (before saves).
all_finite = jax.jit(utils_all_finite)


def eval_due(evaler: Any, step: int) -> bool:
    """Whether `evaler`'s policy fires at `step`."""
    for name in ("eval_policy", "_eval_policy"):
        policy = getattr(evaler, name, None)
        if policy is not None and callable(policy):
            return bool(policy(step=step, train_summaries=None))
    return False


def params_for_eval(trainer_state: Any) -> Any:
    """The parameters evalers use: the learner's parameter EMA if it keeps one, else the model."""
    learner_state = trainer_state.learner
    if isinstance(learner_state, dict) and "ema" in learner_state:
        ema = getattr(learner_state["ema"], "ema", None)
        if ema is not None:
            return ema
    return trainer_state.model


def run_evalers(evalers: dict[str, Any], *, step: int, prng_key: Any, model_params: Any) -> dict:
    """Force-runs each evaler (in order, chaining the key) at `step`; returns their summaries.

    Args:
        evalers: {name: SpmdEvaler} to run.
        step: The training step.
        prng_key: The first evaler's key (each returns the next one's).
        model_params: The parameters to evaluate.

    Returns:
        {name: the evaler's summaries}.
    """
    summaries = {}
    for name, evaler in evalers.items():
        prng_key, summaries[name], _ = evaler.eval_step(
            step, prng_key=prng_key, model_params=model_params, force_run=True
        )
    return summaries


def evalers_to_force(return_evaler_summaries: Any, evaler_names: Any, path: str) -> set[str]:
    """The evalers `SpmdTrainer.run(return_evaler_summaries=...)` force-runs at max_step.

    Args:
        return_evaler_summaries: None or False (none), True (all), or a set of evaler names.
        evaler_names: The trainer's evaler names.
        path: The trainer's path, for errors.

    Returns:
        The set of evaler names to force-run at the last step.

    Raises:
        ValueError: For a name that is not an evaler's, or a value of another type.
    """
    if return_evaler_summaries is None or return_evaler_summaries is False:
        return set()
    if return_evaler_summaries is True:
        return set(evaler_names)
    if not isinstance(return_evaler_summaries, (set, frozenset)):
        raise ValueError(
            f"{path}: run(return_evaler_summaries={return_evaler_summaries!r}) must be None, a "
            "bool or a set of evaler names."
        )
    unknown = sorted(set(return_evaler_summaries) - set(evaler_names))
    if unknown:
        raise ValueError(
            f"{path}: run(return_evaler_summaries=) names {unknown}, which do not match any "
            f"evaler names {sorted(evaler_names)}: use the names of the trainer's `evalers`."
        )
    return set(return_evaler_summaries)


def learner_skips_nonfinite(learner_cfg: ConfigBase) -> bool:
    """Whether the learner skips non-finite steps (skip_and_clip_by_global_norm, loss scaling)."""
    text = learner_cfg.debug_string()
    return bool(re.search(r"skip_and_clip_by_global_norm|loss_scal", text))


def global_batch_specs(input_module: Any, *, mesh: jax.sharding.Mesh, batch_axis_names: Any) -> Any:
    """Global batch shapes (ShapeDtypeStructs with shardings) from an input's `element_spec()`.

    `element_spec()` describes this process's batch (as `tf.data`'s `element_spec` does); the
    global batch is that times the process count, sharded as the trainer shards real batches
    (`utils_spmd.batch_partition_spec`). No data is read.

    Args:
        input_module: The trainer's input (e.g. `input_tf_data.Input`, `input_fake.FakeLmInput`).
        mesh: The trainer's mesh.
        batch_axis_names: The trainer's `batch_axis_names`.

    Returns:
        A tree of `jax.ShapeDtypeStruct`s shaped like the global batch.

    Raises:
        ValueError: If the input has no `element_spec()` (naming the input's path).
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.utils_spmd import batch_partition_spec

    spec_fn = getattr(input_module, "element_spec", None)
    if spec_fn is None:
        raise ValueError(
            f"{input_module.path()} ({type(input_module).__name__}) has no element_spec(), so "
            "the batch shapes are unknown; pass input_batch to compile_train_step."
        )
    host_specs = spec_fn()
    leaves = jax.tree.leaves(host_specs)
    global_size = int(leaves[0].shape[0]) * jax.process_count()
    sharding = NamedSharding(
        mesh, batch_partition_spec(global_size, mesh=mesh, batch_axis_names=batch_axis_names)
    )

    def to_global(spec):
        dtype = np.dtype(getattr(spec.dtype, "as_numpy_dtype", spec.dtype))
        shape = (global_size,) + tuple(int(d) for d in tuple(spec.shape)[1:])
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    return jax.tree.map(to_global, host_specs)


def model_vocab_size(model_cfg: Any) -> tuple[Optional[int], str]:
    """The vocab_size of a model config (its own field or its decoder's), and its field path.

    Args:
        model_cfg: The model config.

    Returns:
        (vocab_size or None, the relative field path).
    """
    for rel in ("vocab_size", "decoder.vocab_size"):
        node = model_cfg
        for key in rel.split("."):
            node = getattr(node, key) if isinstance(node, ConfigBase) and key in node else None
        if isinstance(node, int) and not isinstance(node, bool):
            return node, rel
    return None, ""


def check_token_ids(batch: Any, model_cfg: Any, *, path: str) -> None:
    """Raises if a batch's `input_ids`/`target_labels` reach the model's vocab_size.

    Ids beyond the embedding table silently become NaN (out-of-bounds gathers fill with NaN),
    so every step would be skipped; this names both numbers at the first batch instead.

    Args:
        batch: A host batch (dict of arrays).
        model_cfg: The model config.
        path: The model config's path, for the message.

    Raises:
        ValueError: If an id is >= vocab_size.
    """
    vocab_size, rel = model_vocab_size(model_cfg)
    if vocab_size is None or not isinstance(batch, dict):
        return
    for key in ("input_ids", "target_labels"):
        ids = batch.get(key)
        if ids is None or np.size(ids) == 0:
            continue
        top = int(np.max(np.asarray(ids)))
        if top >= vocab_size:
            raise ValueError(
                f"The first batch's {key} contain token id {top}, but {path}.{rel} is "
                f"{vocab_size} (ids must be < vocab_size): the input's vocabulary is larger "
                "than the model's. Set vocab_size to at least the tokenizer's vocabulary size."
            )


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite at a step and the learner does not skip such steps."""

    def __init__(self, *, step: int, loss: float):
        super().__init__(
            f"Step {step}: the loss is {loss}. The learner does not skip non-finite steps (use "
            "skip_and_clip_by_global_norm or fp16 loss scaling to skip them); stopping. No state "
            "of this step or later is checkpointed."
        )
        self.step = step
        self.loss = loss


# AXLearn's name for the same error.
UndefinedLossException = NonFiniteLossError


def input_is_checkpointable(input_module: Any) -> bool:
    """Whether `input_module` can save and restore its iterator's position.

    Args:
        input_module: The trainer's input.

    Returns:
        True if it has `iterator_state` and `restore_iterator`.
    """
    return hasattr(input_module, "iterator_state") and hasattr(input_module, "restore_iterator")


def host_batch_iterator(input_module: Any) -> Any:
    """An iterator of host batches (dicts of NumPy arrays) from the start of `input_module`.

    Inputs that can save their position (`iter(input)` + `iterator_state`) are iterated directly,
    so that the iterator can be checkpointed; others through `dataset()`.

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


def prng_key_spec() -> Any:
    """The TensorSpec of the trainer state's PRNG key (replicated), per the PRNG implementation.

    Abstract (jax.eval_shape): no computation, so this works under a mesh of devices this process
    cannot run on (AOT compilation for a TPU topology).

    Returns:
        A `utils.TensorSpec`.
    """
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    return TensorSpec(shape=tuple(key.shape), dtype=key.dtype, mesh_axes=PartitionSpec())


def with_default_dirs(cfg: Any) -> dict[str, Any]:
    """The trainer's child configs with their directories defaulted under `cfg.dir`.

    Args:
        cfg: The `SpmdTrainer.Config`.

    Returns:
        {"summary_writer": config (dir: <dir>/summaries/train_train), "checkpointer": config
        (dir: <dir>/checkpoints), "evalers": {name: config (summary dir: <dir>/summaries/name)}};
        copies, `cfg` is unchanged. A dir already set is kept.
    """
    summary_cfg = cfg.summary_writer.clone()
    if is_unset(getattr(summary_cfg, "dir", None)):
        summary_cfg.dir = os.path.join(cfg.dir, "summaries", "train_train")
    ckpt_cfg = cfg.checkpointer.clone()
    if is_unset(getattr(ckpt_cfg, "dir", None)):
        ckpt_cfg.dir = os.path.join(cfg.dir, "checkpoints")
    evalers = {}
    for name, evaler_cfg in cfg.evalers.items():
        evaler_cfg = evaler_cfg.clone()
        if is_unset(getattr(evaler_cfg.summary_writer, "dir", None)):
            evaler_cfg.summary_writer.dir = os.path.join(cfg.dir, "summaries", name)
        evalers[name] = evaler_cfg
    return dict(summary_writer=summary_cfg, checkpointer=ckpt_cfg, evalers=evalers)
