"""Converts trees between the pipelined and the repeated layout of a transformer stack.

A `RepeatedTransformerLayer` stores its layers as `.../repeat/layer/<param>` with leading axis
L = num_layers (row l = layer l). A `PipelinedTransformerLayer` with S stages, V virtual stages
and K = L / (S * V) layers per chunk stores `.../pipeline/layer/layer{k}/<param>` with leading
axis S * V, row `s * V + v` holding chunk `c = v * S + s` = layers `c * K ... c * K + K - 1`.

The functions here map any tree holding such subtrees (model parameters, optimizer states that
mirror them, a whole trainer state) from one layout to the other, so a checkpoint written with
one parallelism restores into the other (see `docs/pipeline.md`).
"""

import re
from typing import Any, Optional

import jax
import numpy as np

from axlearn.common.pipeline_layout import chunk_order_to_rows, rows_to_chunk_order

_LAYER_KEY = re.compile(r"layer(\d+)$")


def _is_repeat_node(x: Any) -> bool:
    return isinstance(x, dict) and set(x) == {"repeat"} and isinstance(x["repeat"], dict)


def _is_pipeline_node(x: Any) -> bool:
    return (
        isinstance(x, dict)
        and set(x) == {"pipeline"}
        and isinstance(x["pipeline"], dict)
        and isinstance(x["pipeline"].get("layer"), dict)
        and all(_LAYER_KEY.match(k) for k in x["pipeline"]["layer"])
    )


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def repeated_to_pipelined(tree: Any, *, num_stages: int, num_virtual_stages: int = 1) -> Any:
    """Maps every `{"repeat": {"layer": T}}` subtree of `tree` to the pipelined layout.

    Args:
        tree: Any pytree (e.g. parameters or a trainer state); arrays under `repeat/layer` have a
            leading axis num_layers.
        num_stages: S.
        num_virtual_stages: V.

    Returns:
        The tree with those subtrees replaced by `{"pipeline": {"layer": {"layer{k}": ...}}}`.

    Raises:
        ValueError: If num_layers is not divisible by S * V.
    """
    chunks = num_stages * num_virtual_stages

    def convert(node):
        if not _is_repeat_node(node):
            return node
        layer = node["repeat"].get("layer", {})
        sizes = {x.shape[0] for x in jax.tree.leaves(layer) if _is_array(x)}
        if len(sizes) != 1:
            raise ValueError(f"repeat/layer arrays have different leading sizes {sorted(sizes)}")
        (num_layers,) = sizes
        if num_layers % chunks != 0:
            raise ValueError(
                f"num_layers={num_layers} is not divisible by num_stages={num_stages} x "
                f"num_virtual_stages={num_virtual_stages}"
            )
        per_chunk = num_layers // chunks

        def split(x, k):
            if not _is_array(x):
                return x
            x = x.reshape(chunks, per_chunk, *x.shape[1:])[:, k]
            return chunk_order_to_rows(
                x, num_stages=num_stages, num_virtual_stages=num_virtual_stages
            )

        stage = {
            f"layer{k}": jax.tree.map(lambda x, k=k: split(x, k), layer) for k in range(per_chunk)
        }
        return {"pipeline": {"layer": stage}}

    return jax.tree.map(convert, tree, is_leaf=_is_repeat_node)


def pipelined_to_repeated(tree: Any, *, num_stages: int, num_virtual_stages: int = 1) -> Any:
    """The inverse of `repeated_to_pipelined`.

    Args:
        tree: Any pytree with `{"pipeline": {"layer": {"layer{k}": ...}}}` subtrees whose arrays
            have leading axis S * V.
        num_stages: S.
        num_virtual_stages: V.

    Returns:
        The tree with those subtrees replaced by `{"repeat": {"layer": ...}}` ([num_layers, ...]).

    Raises:
        ValueError: If the stacked size is not S * V or the layer{k} keys are not 0..K-1.
    """
    chunks = num_stages * num_virtual_stages

    def convert(node):
        if not _is_pipeline_node(node):
            return node
        stage = node["pipeline"]["layer"]
        per_chunk = len(stage)
        if sorted(stage) != sorted(f"layer{k}" for k in range(per_chunk)):
            raise ValueError(f"pipeline/layer children must be layer0..layer{per_chunk - 1}")
        for x in jax.tree.leaves(stage):
            if _is_array(x) and x.shape[0] != chunks:
                raise ValueError(
                    f"pipeline/layer arrays have leading size {x.shape[0]}, expected num_stages="
                    f"{num_stages} x num_virtual_stages={num_virtual_stages} = {chunks}"
                )

        def merge(*xs):
            if not _is_array(xs[0]):
                return xs[0]
            xs = [
                rows_to_chunk_order(x, num_stages=num_stages, num_virtual_stages=num_virtual_stages)
                for x in xs
            ]
            stacked = _stack(xs, axis=1)  # [C, K, ...].
            return stacked.reshape(chunks * per_chunk, *stacked.shape[2:])

        layers = [stage[f"layer{k}"] for k in range(per_chunk)]
        return {"repeat": {"layer": jax.tree.map(merge, *layers)}}

    return jax.tree.map(convert, tree, is_leaf=_is_pipeline_node)


def _stack(xs, axis):
    if all(isinstance(x, np.ndarray) for x in xs):
        return np.stack(xs, axis=axis)
    return jax.numpy.stack(xs, axis=axis)


def stack_layout(root: Any) -> Optional[tuple[int, int]]:
    """(num_stages, num_virtual_stages) of the PipelinedTransformerLayer in a module tree.

    Args:
        root: The root module (e.g. a trainer's model).

    Returns:
        None if no layer of the tree is a PipelinedTransformerLayer.

    Raises:
        ValueError: If pipelined stacks disagree on their layout.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.attention import PipelinedTransformerLayer

    layouts, stack = set(), [root]
    while stack:
        module = stack.pop()
        if isinstance(module, PipelinedTransformerLayer):
            cfg = module.config
            layouts.add((cfg.num_stages, PipelinedTransformerLayer.num_virtual_stages(cfg)))
        stack.extend(module.children.values())
    if len(layouts) > 1:
        raise ValueError(f"Pipelined stacks with different layouts {sorted(layouts)}")
    return layouts.pop() if layouts else None


def convert_tree(tree: Any, *, src: Optional[tuple[int, int]], dst: Optional[tuple[int, int]]):
    """Converts `tree` from layout `src` to layout `dst` (None: repeated; else (S, V)).

    Args:
        tree: Any pytree (see `repeated_to_pipelined`).
        src: The source layout.
        dst: The target layout.

    Returns:
        The converted tree.
    """
    if src == dst:
        return tree
    if src is not None:
        tree = pipelined_to_repeated(tree, num_stages=src[0], num_virtual_stages=src[1])
    if dst is not None:
        tree = repeated_to_pipelined(tree, num_stages=dst[0], num_virtual_stages=dst[1])
    return tree


def convert_trainer_checkpoint(src_cfg: Any, dst_cfg: Any, *, step: Optional[int] = None) -> int:
    """Rewrites a trainer checkpoint for another pipeline layout (so parallelism can change).

    Restores step `step` (default: the latest) of the trainer `src_cfg` (from `src_cfg.dir`),
    converts its state (parameters, optimizer state) from src_cfg's stack layout to
    dst_cfg's (pipelined with any S x V, or a RepeatedTransformerLayer), and saves it as the same
    step under `dst_cfg.dir`, with the input iterator position when both save it. Running the
    `dst_cfg` trainer then resumes from it. The state passes through host memory.

    Args:
        src_cfg: The SpmdTrainer config that wrote the checkpoint.
        dst_cfg: The SpmdTrainer config to resume with (another `dir`).
        step: The step to convert.

    Returns:
        The converted step.

    Raises:
        ValueError: If there is no checkpoint, the dirs are equal, or the trees do not match.
    """
    if src_cfg.dir == dst_cfg.dir:
        raise ValueError(f"convert_trainer_checkpoint: src and dst dir are both {src_cfg.dir}")
    src = src_cfg.instantiate(parent=None)
    restored = src.restore_checkpoint(step)
    if restored is None:
        raise ValueError(f"convert_trainer_checkpoint: no committed checkpoint under {src_cfg.dir}")
    dst = dst_cfg.instantiate(parent=None)
    src_layout, dst_layout = stack_layout(src.model), stack_layout(dst.model)
    state = jax.device_get(src.trainer_state._asdict())
    state = convert_tree(state, src=src_layout, dst=dst_layout)
    shardings = dst.trainer_stateshardings_of_specs._asdict()
    expected = jax.tree.structure(shardings)
    if jax.tree.structure(state) != expected:
        raise ValueError(
            f"convert_trainer_checkpoint: the converted state of layout {src_layout} -> "
            f"{dst_layout} does not match {dst_cfg.name}'s state tree"
        )
    state = jax.tree.map(jax.device_put, state, shardings)
    if (
        src_cfg.save_input_iterator
        and dst_cfg.save_input_iterator
        and getattr(src, "_input_iter", None) is not None
    ):
        state["input_iter"] = src.input.iterator_state(src._input_iter)  # pylint: disable=protected-access
    with jax.set_mesh(dst.mesh()):
        dst.checkpointer.save(step=restored, state=state, force=True)
        dst.checkpointer.wait_until_finished()
    for trainer in (src, dst):
        trainer.checkpointer.stop()
    return restored
