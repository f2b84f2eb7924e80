"""The trainer's batch feeder: host batches from the input, made global arrays on the mesh.

A part of `SpmdTrainer` (see trainer.py): it owns the input's host-batch iterator and the
partition of each global batch over the mesh's batch axes, picked from the first batch's size.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import jax

from axlearn.common.trainer_utils import host_batch_iterator, leading_dim
from axlearn.common.utils import NestedTensor
from axlearn.common.utils_spmd import batch_partition_spec, host_to_global_array


class BatchFeeder:
    """Feeds the train step: the input's host batches as global arrays sharded over batch axes.

    The partition spec is chosen from the first batch after each `new_iterator()` (the global
    batch is this process's batch times the process count) and logged once.
    """

    def __init__(
        self,
        input_module: Any,
        *,
        mesh: jax.sharding.Mesh,
        batch_axis_names: Any,
        log: Callable[..., None],
    ):
        """Builds the feeder.

        Args:
            input_module: The trainer's input (an `Input` with `dataset()`/`batches()`).
            mesh: The device mesh the global arrays live on.
            batch_axis_names: The mesh axes the batch dimension is split over (None: all of
                them that divide it; see `utils_spmd.batch_partition_spec`).
            log: The trainer's step logger (called as log(msg, *args)).
        """
        self._input = input_module
        self._mesh = mesh
        self._batch_axis_names = batch_axis_names
        self._log = log
        self._spec: Optional[jax.sharding.PartitionSpec] = None
        self._global_batch_size: Optional[int] = None

    @property
    def global_batch_size(self) -> Optional[int]:
        """The global batch size of the batches fed so far (None before the first)."""
        return self._global_batch_size

    def new_iterator(self) -> Iterator[NestedTensor]:
        """An iterator of host batches from the start of the input (see host_batch_iterator).

        Returns:
            The iterator; the next batch fed picks the partition spec again.
        """
        self._spec = None
        return host_batch_iterator(self._input)

    def to_global(self, host_batch: NestedTensor) -> NestedTensor:
        """Turns this process's host batch into global arrays sharded over the batch axes.

        Args:
            host_batch: This process's batch (NumPy arrays with a leading batch dimension).

        Returns:
            The global batch: `jax.Array`s on the mesh.
        """
        if self._spec is None:
            global_batch_size = leading_dim(host_batch) * jax.process_count()
            self._spec = batch_partition_spec(
                global_batch_size, mesh=self._mesh, batch_axis_names=self._batch_axis_names
            )
            self._global_batch_size = global_batch_size
            self._log(
                "Global batch %d sharded as %s over mesh %s.",
                global_batch_size,
                self._spec,
                dict(self._mesh.shape),
            )
        return host_to_global_array(host_batch, mesh=self._mesh, partition=self._spec)
