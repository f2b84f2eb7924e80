"""The method-runner API of `InferenceRunner` (public as `axlearn.common.inference.MethodRunner`).

`InferenceRunner.create_method_runner(method=...)` jits one model method over input batches and
returns a `MethodRunner`: called with a batch (host arrays, or global arrays already on the
mesh), it returns the input and output batches as global arrays, the summaries and the module
outputs kept by `drop_module_outputs`. The PRNG key is split once per call, so consecutive calls
draw different keys. `InferenceRunner.run` iterates a `MethodRunner` over batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Union

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common import utils
from axlearn.common.utils import DataPartitionType, NestedTensor, Tensor

# The result of one jitted call: (next key, outputs, summaries, module outputs).
JitRunOnBatch = Callable[
    [Tensor, NestedTensor], tuple[Tensor, NestedTensor, NestedTensor, NestedTensor]
]


class _InferenceRunnerState(NamedTuple):
    """The state (or its partition specs) of an `InferenceRunner`."""

    # The PRNG key (restored from the checkpoint where it has one).
    prng_key: Union[Tensor, Any]
    # The model parameters.
    model: Union[NestedTensor, Any]
    # The learner state: never restored by the runner (kept for trainer-state converters).
    learner: Optional[Union[NestedTensor, Any]] = None


def _is_host_local(x: Any) -> bool:
    """Whether `x` is a host array (NumPy, or a JAX array on a single device)."""
    return isinstance(x, np.ndarray) or (isinstance(x, jax.Array) and len(x.devices()) == 1)


class MethodRunner:
    """Runs a jitted model method on batches (see the module docstring)."""

    def __init__(
        self,
        *,
        prng_key: Tensor,
        mesh: jax.sharding.Mesh,
        input_batch_partition_spec: DataPartitionType,
        jit_run_on_batch: JitRunOnBatch,
    ):
        """Initializes the MethodRunner.

        Args:
            prng_key: The key of the first call; each call replaces it with a new one.
            mesh: The mesh the method is jitted on.
            input_batch_partition_spec: How host input batches are placed on the mesh.
            jit_run_on_batch: (prng_key, global input batch) -> (next key, outputs, summaries,
                module outputs).
        """
        self._prng_key = prng_key
        self._mesh = mesh
        self._input_batch_partition_spec = input_batch_partition_spec
        self._jit_run_on_batch = jit_run_on_batch

    @dataclass(frozen=True)
    class Output:
        """What one call returns."""

        # The method's outputs, as global arrays.
        output_batch: NestedTensor
        # The input batch, as global arrays.
        input_batch: NestedTensor
        # The summaries the method added.
        summaries: NestedTensor
        # The module outputs kept by `drop_module_outputs` (replicated).
        module_outputs: NestedTensor

    def __call__(self, input_batch: NestedTensor) -> MethodRunner.Output:
        """Runs the method on `input_batch`.

        Args:
            input_batch: Global arrays on the mesh, or host arrays (each process's part), which
                are first placed with `input_batch_partition_spec`.

        Returns:
            The input and output batches (global arrays), summaries and module outputs.
        """
        with jax.set_mesh(self._mesh):
            leaves = jax.tree_util.tree_leaves(input_batch)
            if all(_is_host_local(x) for x in leaves):
                input_batch = utils.host_to_global_device_array(
                    input_batch, partition=self._input_batch_partition_spec
                )
            self._prng_key, outputs, summaries, module_outputs = self._jit_run_on_batch(
                self._prng_key, input_batch
            )
        return self.Output(
            output_batch=outputs,
            input_batch=input_batch,
            summaries=summaries,
            module_outputs=module_outputs,
        )


def reshard(x: Tensor, spec: PartitionSpec, mesh: jax.sharding.Mesh) -> Tensor:
    """Constrains the sharding of a batch leaf (inside jit) to `spec`, cut to its rank.

    Scalars and replicated specs give a replicated leaf; a 1-D leaf keeps the batch axis's part.

    Args:
        x: The leaf.
        spec: The batch's PartitionSpec.
        mesh: The mesh.

    Returns:
        `x` with the sharding constraint.
    """
    if x.ndim == 0 or spec in (PartitionSpec(), PartitionSpec(None)):
        spec = PartitionSpec(None)
    else:
        spec = PartitionSpec(*spec[: x.ndim])
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def host_rows(x: Any) -> np.ndarray:
    """The part of a global array this process holds (the whole array if fully addressable).

    Args:
        x: A `jax.Array` (evenly partitioned), or a host array.

    Returns:
        The NumPy array of the box spanned by this process's shards.

    Raises:
        ValueError: If this process holds no shard of `x`.
    """
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    shards = x.addressable_shards
    if not shards:
        raise ValueError(f"No local shards of an array of shape {x.shape}.")
    boxes = []
    for shard in shards:
        boxes.append(
            tuple(
                (s.start or 0, x.shape[d] if s.stop is None else s.stop)
                for d, s in enumerate(shard.index)
            )
        )
    lo = [min(b[d][0] for b in boxes) for d in range(x.ndim)]
    hi = [max(b[d][1] for b in boxes) for d in range(x.ndim)]
    out = np.empty([h - low for low, h in zip(lo, hi)], dtype=x.dtype)
    for box, shard in zip(boxes, shards):
        out[tuple(slice(a - low, b - low) for (a, b), low in zip(box, lo))] = np.asarray(shard.data)
    return out


def global_to_host_array(global_arrays: NestedTensor) -> NestedTensor:
    """This process's part of each global array of a tree (see `host_rows`).

    Args:
        global_arrays: A tree of `jax.Array`s.

    Returns:
        The tree of NumPy arrays.
    """
    return jax.tree.map(host_rows, global_arrays)
