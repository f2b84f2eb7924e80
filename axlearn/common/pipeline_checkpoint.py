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
from typing import Any

import jax
import numpy as np

from axlearn.common.pipeline import chunk_order_to_rows, rows_to_chunk_order

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
