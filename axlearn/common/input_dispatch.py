"""Dispatching per-feed logical input batches to a global logical batch on device.

AXLearn's logical/physical batch split: the *logical* global batch (`global_logical_batch_size`,
what the model trains or evaluates on) may be smaller than the number of feeding hosts times
what each must contribute (a global array's batch axis must divide evenly over the devices). The
`num_logical_feeds` feeds listed in `logical_feed_indices` read disjoint shards and each batch
`feed_logical_batch_size` examples; every physical feed then pads its batch to
`feed_physical_batch_size` rows (feeds that are not logical contribute only padding) and adds a
bool dispatch tensor [feed_physical_batch_size, global_logical_batch_size] under
`utils.PHYSICAL_TO_LOGICAL_DISPATCH_KEY`: row p is one-hot at the logical example it holds, and
all-False for a padding row. On device, `physical_to_logical_batch` gathers the logical rows and
drops the padding rows, so padding examples never reach the loss.

Example: a logical batch of 2 over 4 feeds (hosts), each contributing 1 row: logical feeds
[0, 1] each read one example; feeds 2 and 3 send one padding row each; the global physical batch
has 4 rows and its dispatch tensor is [[1, 0], [0, 1], [0, 0], [0, 0]].

`SpmdInputDispatcher` (AXLearn's newer default) needs no padding or dispatch step: given the
`partition_spec` of the global batch over the enclosing mesh, each process (feed) produces exactly
the batch rows its devices hold, so the per-feed batches assemble directly into the global array.
"""

import math
from collections.abc import Sequence
from typing import Optional

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.module import Module
from axlearn.common.utils import (
    PHYSICAL_TO_LOGICAL_DISPATCH_KEY,
    Nested,
    Tensor,
    current_mesh,
    dispatch_input_batch,
    input_partition_spec,
)


class BaseInputDispatcher(Module):
    """The interface of input dispatchers (`InputDispatcher`, `SpmdInputDispatcher`).

    A dispatcher says which shard a feed reads (`feed_read_config`) and how many examples it
    batches (`feed_logical_batch_size`), turns per-feed logical batches into per-feed physical
    ones on the host (`logical_to_physical_batch`, and `logical_to_physical_shapes` for their
    shapes), and the global physical batch back into the global logical one on device
    (`physical_to_logical_batch`).
    """

    @config_class
    class Config(Module.Config):
        """Configures BaseInputDispatcher."""

        # The global batch size the model sees.
        global_logical_batch_size: Required[int] = REQUIRED

    @property
    def num_logical_feeds(self) -> int:
        """The number of feeds reading distinct examples."""
        raise NotImplementedError(type(self))

    @property
    def logical_feed_index(self) -> Optional[int]:
        """This feed's logical index (None: the feed only pads)."""
        raise NotImplementedError(type(self))

    @property
    def feed_logical_batch_size(self) -> int:
        """Examples per logical feed batch."""
        raise NotImplementedError(type(self))

    @property
    def feed_physical_batch_size(self) -> int:
        """Rows per physical feed batch."""
        raise NotImplementedError(type(self))

    @property
    def partition_spec(self) -> PartitionSpec:
        """The partition spec of the global physical batch (for `host_to_global_array`)."""
        raise NotImplementedError(type(self))

    def feed_read_config(self) -> dict[str, int]:
        """The shard this feed reads: {"num_shards", "shard_index"}."""
        raise NotImplementedError(type(self))

    def logical_to_physical_batch(self, logical_feed_batch: Nested[Tensor]) -> Nested[Tensor]:
        """Per-feed logical batch -> per-feed physical batch (host side)."""
        raise NotImplementedError(type(self))

    def physical_to_logical_batch(self, global_physical_batch: Nested[Tensor]) -> Nested[Tensor]:
        """Global physical batch -> global logical batch (inside jit)."""
        raise NotImplementedError(type(self))

    def logical_to_physical_shapes(
        self, logical_feed_shapes: Nested[jax.ShapeDtypeStruct]
    ) -> Nested[jax.ShapeDtypeStruct]:
        """Per-feed logical batch shapes -> per-feed physical batch shapes (e.g. for AOT).

        Args:
            logical_feed_shapes: ShapeDtypeStructs (or arrays) with a leading batch axis.

        Returns:
            The physical shapes: the batch axis of every leaf becomes `feed_physical_batch_size`.

        Raises:
            ValueError: If a leaf has no shape/dtype or no batch axis.
        """
        _check_feed_shapes(logical_feed_shapes, where=type(self).__name__)
        rows = self.feed_physical_batch_size
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((rows, *x.shape[1:]), x.dtype), logical_feed_shapes
        )


def _check_feed_shapes(shapes: Nested[jax.ShapeDtypeStruct], *, where: str):
    for leaf in jax.tree.leaves(shapes):
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise ValueError(
                f"{where}.logical_to_physical_shapes: expected leaves with shape and dtype "
                f"(e.g. jax.ShapeDtypeStruct), got {type(leaf).__name__} {leaf!r}"
            )
        if len(leaf.shape) == 0:
            raise ValueError(
                f"{where}.logical_to_physical_shapes: a leaf of shape () has no batch axis; "
                "every leaf needs a leading batch axis"
            )


class InputDispatcher(BaseInputDispatcher):
    """Converts per-feed logical batches to physical batches and global physical to logical.

    Usage: read the shard `feed_read_config()` names and batch it by `feed_logical_batch_size`;
    call `logical_to_physical_batch` on each per-feed batch (host side), assemble the global
    physical batch (`utils.host_to_global_array`), and call `physical_to_logical_batch` inside
    the jitted step.
    """

    @config_class
    class Config(BaseInputDispatcher.Config):
        """Configures InputDispatcher."""

        # The global batch size fed to devices; None: max(feed_logical_batch_size *
        # num_physical_feeds, jax.device_count()).
        global_physical_batch_size: Optional[int] = None
        # The number of physical feeds (input hosts); None: jax.process_count().
        num_physical_feeds: Optional[int] = None
        # This host's physical feed index in [0, num_physical_feeds); None: jax.process_index().
        physical_feed_index: Optional[int] = None
        # logical_feed_indices[i] is the physical feed of logical feed i (unique, each in
        # [0, num_physical_feeds)); None: range(min(global_logical_batch_size, num_physical_feeds)).
        logical_feed_indices: Optional[Sequence[int]] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        cfg = cfg.clone()
        # self.path() is known only after Module.__init__; the checks before it name this path.
        path = f"{parent.path()}.{cfg.name}" if parent is not None else str(cfg.name)
        if cfg.num_physical_feeds is None:
            cfg.num_physical_feeds = jax.process_count()
        if cfg.physical_feed_index is None:
            cfg.physical_feed_index = jax.process_index()
        if cfg.logical_feed_indices is None:
            num_logical = min(cfg.global_logical_batch_size, cfg.num_physical_feeds)
            cfg.logical_feed_indices = list(range(num_logical))
        cfg.logical_feed_indices = list(cfg.logical_feed_indices)
        num_logical_feeds = len(cfg.logical_feed_indices)
        if num_logical_feeds == 0 or cfg.global_logical_batch_size % num_logical_feeds != 0:
            raise ValueError(
                f"{path}.global_logical_batch_size={cfg.global_logical_batch_size} must be "
                f"divisible by the number of logical feeds ({num_logical_feeds}, from "
                "logical_feed_indices); set a batch size that is a multiple of it."
            )
        if cfg.global_physical_batch_size is None:
            feed_logical = cfg.global_logical_batch_size // num_logical_feeds
            cfg.global_physical_batch_size = max(
                feed_logical * cfg.num_physical_feeds, jax.device_count()
            )
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.global_physical_batch_size % cfg.num_physical_feeds != 0:
            raise ValueError(
                f"{self.path()}: global_physical_batch_size {cfg.global_physical_batch_size} must "
                f"be divisible by num_physical_feeds={cfg.num_physical_feeds}; set a multiple of "
                "it (or leave it None to derive it)."
            )
        if self.feed_physical_batch_size < self.feed_logical_batch_size:
            raise ValueError(
                f"{self.path()}: feed_physical_batch_size {self.feed_physical_batch_size} must be "
                f">= feed_logical_batch_size {self.feed_logical_batch_size}; raise "
                "global_physical_batch_size (or leave it None to derive it)."
            )
        if not 0 <= cfg.physical_feed_index < cfg.num_physical_feeds:
            raise ValueError(
                f"{self.path()}: physical_feed_index {cfg.physical_feed_index} must be in range "
                f"[0, {cfg.num_physical_feeds}) (num_physical_feeds); leave it None for "
                "jax.process_index()."
            )
        if not all(0 <= ix < cfg.num_physical_feeds for ix in cfg.logical_feed_indices):
            raise ValueError(
                f"{self.path()}.logical_feed_indices={cfg.logical_feed_indices}: invalid physical "
                f"feed index; each must be in range [0, {cfg.num_physical_feeds}) "
                "(num_physical_feeds)."
            )
        if len(set(cfg.logical_feed_indices)) != num_logical_feeds:
            raise ValueError(
                f"{self.path()}.logical_feed_indices={cfg.logical_feed_indices} must be unique; "
                "list each physical feed at most once."
            )

    @property
    def num_logical_feeds(self) -> int:
        """The number of feeds that read real examples."""
        return len(self.config.logical_feed_indices)

    @property
    def logical_feed_index(self) -> Optional[int]:
        """This feed's logical index, or None if it only sends padding."""
        cfg = self.config
        if cfg.physical_feed_index in cfg.logical_feed_indices:
            return cfg.logical_feed_indices.index(cfg.physical_feed_index)
        return None

    @property
    def feed_logical_batch_size(self) -> int:
        """Real examples per logical feed batch."""
        return self.config.global_logical_batch_size // self.num_logical_feeds

    @property
    def feed_physical_batch_size(self) -> int:
        """Rows per physical feed batch."""
        cfg = self.config
        return cfg.global_physical_batch_size // cfg.num_physical_feeds

    @property
    def partition_spec(self) -> PartitionSpec:
        """The global physical batch's spec: the batch axis over every axis of the current mesh.

        Raises:
            ValueError: Outside a mesh.
        """
        return input_partition_spec()

    def feed_read_config(self) -> dict[str, int]:
        """The shard this feed reads.

        Returns:
            {"num_shards": num_logical_feeds, "shard_index": ...}: a logical feed reads its own
            shard; a padding-only feed reads some shard (its rows are dropped), spread evenly.
        """
        cfg = self.config
        num_shards = self.num_logical_feeds
        shard_index = self.logical_feed_index
        if shard_index is None:
            others = [
                ix for ix in range(cfg.num_physical_feeds) if ix not in cfg.logical_feed_indices
            ]
            shard_index = others.index(cfg.physical_feed_index) % num_shards
        return dict(num_shards=num_shards, shard_index=shard_index)

    def logical_to_physical_batch(self, logical_feed_batch: Nested[Tensor]) -> Nested[Tensor]:
        """Pads a per-feed logical batch to a per-feed physical batch (host side, NumPy).

        Args:
            logical_feed_batch: A dict whose leaves are [feed_logical_batch_size, ...].

        Returns:
            A new dict whose leaves are [feed_physical_batch_size, ...] (padding rows are zeros;
            a padding-only feed's rows are all zeros) plus the dispatch tensor under
            `PHYSICAL_TO_LOGICAL_DISPATCH_KEY`. Unchanged (copied) when the logical and
            physical batches coincide.

        Raises:
            ValueError: If a leaf's leading dim is not feed_logical_batch_size, or the batch
                already holds the dispatch key.
        """
        cfg = self.config
        logical, physical = self.feed_logical_batch_size, self.feed_physical_batch_size

        def pad(x: Tensor) -> np.ndarray:
            x = np.asarray(x)
            if x.ndim < 1 or x.shape[0] != logical:
                raise ValueError(
                    f"{self.path()}: per-feed input leaf of shape {x.shape} does not have the "
                    f"feed_logical_batch_size {logical} as its leading dim; batch each feed's "
                    "input to that size."
                )
            if self.logical_feed_index is None:
                x = np.zeros_like(x)
            padding = np.zeros((physical - logical,) + x.shape[1:], dtype=x.dtype)
            return np.concatenate([x, padding], axis=0)

        if (
            cfg.global_logical_batch_size == cfg.global_physical_batch_size
            and cfg.num_physical_feeds == self.num_logical_feeds
        ):
            return jax.tree.map(np.array, logical_feed_batch)
        if not isinstance(logical_feed_batch, dict):
            raise ValueError(
                f"{self.path()}: logical_to_physical_batch needs a dict batch; got "
                f"{type(logical_feed_batch)}. Pass the batch as a dict of arrays."
            )
        if PHYSICAL_TO_LOGICAL_DISPATCH_KEY in logical_feed_batch:
            raise ValueError(
                f"{self.path()}: the batch already holds {PHYSICAL_TO_LOGICAL_DISPATCH_KEY!r}; "
                "dispatch each logical batch once (remove the key first)."
            )
        physical_batch = jax.tree.map(pad, logical_feed_batch)
        dispatch = np.zeros((physical, cfg.global_logical_batch_size), dtype=bool)
        if self.logical_feed_index is not None:
            start = self.logical_feed_index * logical
            dispatch[np.arange(logical), start + np.arange(logical)] = True
        physical_batch[PHYSICAL_TO_LOGICAL_DISPATCH_KEY] = dispatch
        return physical_batch

    def physical_to_logical_batch(self, global_physical_batch: Nested[Tensor]) -> Nested[Tensor]:
        """Gathers the global logical batch from the global physical batch (inside jit).

        Args:
            global_physical_batch: Leaves [global_physical_batch_size, ...], as assembled from
                the `logical_to_physical_batch` outputs of all feeds.

        Returns:
            A new tree with leaves [global_logical_batch_size, ...] (padding rows dropped) and
            without the dispatch key.

        Raises:
            ValueError: If a dispatch tensor's shape is not
                [global_physical_batch_size, global_logical_batch_size].
        """
        cfg = self.config
        expected = (cfg.global_physical_batch_size, cfg.global_logical_batch_size)

        def check(data: Nested[Tensor]):
            if isinstance(data, dict):
                if PHYSICAL_TO_LOGICAL_DISPATCH_KEY in data:
                    shape = tuple(data[PHYSICAL_TO_LOGICAL_DISPATCH_KEY].shape)
                    if shape != expected:
                        raise ValueError(
                            f"{self.path()}: dispatch tensor shape {shape} != {expected} "
                            "(global_physical_batch_size, global_logical_batch_size); build the "
                            "batch with this dispatcher's logical_to_physical_batch."
                        )
                for value in data.values():
                    check(value)

        check(global_physical_batch)
        return dispatch_input_batch(global_physical_batch, batch_axis_names=None)


def batch_feed_layout(
    mesh: jax.sharding.Mesh, partition_spec: PartitionSpec, *, global_batch_size: int
) -> dict[int, tuple[int, int]]:
    """How the processes of `mesh` split a global batch sharded by `partition_spec` (dim 0).

    Args:
        mesh: The device mesh.
        partition_spec: The global batch's partition spec (only its first entry may be set).
        global_batch_size: The global batch size.

    Returns:
        {process index: (feed index, feed count)}: processes whose devices hold the same batch
        rows share a feed index; feeds are numbered by their first row.
    """
    sharding = NamedSharding(mesh, PartitionSpec(partition_spec[0]))
    return feed_layout_from_indices(sharding.devices_indices_map((global_batch_size,)))


def feed_layout_from_indices(indices_map: dict) -> dict[int, tuple[int, int]]:
    """{process index: (feed index, feed count)} from a sharding's device -> batch-slice map.

    Args:
        indices_map: {device (with `process_index`): (slice of the batch dim,)}, as
            `Sharding.devices_indices_map` returns it.

    Returns:
        See `batch_feed_layout`.
    """
    rows_by_process: dict[int, set] = {}
    for device, index in indices_map.items():
        start = index[0].start or 0
        rows_by_process.setdefault(device.process_index, set()).add(start)
    groups = sorted({tuple(sorted(rows)) for rows in rows_by_process.values()})
    return {
        process: (groups.index(tuple(sorted(rows))), len(groups))
        for process, rows in rows_by_process.items()
    }


class SpmdInputDispatcher(BaseInputDispatcher):
    """A mesh-aware dispatcher: each process feeds the batch rows its devices hold.

    Must be instantiated inside the mesh (`with mesh:` / `jax.set_mesh`). Given the global
    batch's `partition_spec`, the processes holding the same rows form one logical feed; a feed
    reads shard `logical_feed_index` of `num_logical_feeds` and batches
    `global_logical_batch_size // num_logical_feeds` examples; the per-feed batches are the
    global array's process-local parts as they are (no padding, no dispatch tensor).
    """

    @config_class
    class Config(BaseInputDispatcher.Config):
        """Configures SpmdInputDispatcher."""

        # The partition spec of the global batch (e.g. PartitionSpec(("data", "fsdp"))); only
        # the batch dim (the first entry) may be partitioned.
        partition_spec: Required[PartitionSpec] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        mesh = current_mesh()
        if mesh is None:
            raise ValueError(
                f"{self.path()}: SpmdInputDispatcher must be instantiated inside a mesh "
                "(with mesh: / jax.set_mesh(mesh)); the trainer and evalers do so."
            )
        spec = cfg.partition_spec
        if not spec:
            raise ValueError(
                f"{self.path()}.partition_spec={spec!r} is empty: set the batch axes, e.g. "
                "PartitionSpec(('data', 'fsdp'))"
            )
        if any(axis is not None for axis in jax.tree.leaves(tuple(spec)[1:])):
            raise NotImplementedError(
                f"{self.path()}.partition_spec={spec!r}: only the batch dim may be partitioned "
                "by input dispatch; set the other entries to None"
            )
        batch_axes = jax.tree.leaves(tuple(spec)[0])
        num_partitions = math.prod(mesh.shape[axis] for axis in batch_axes)
        if cfg.global_logical_batch_size % num_partitions != 0:
            raise ValueError(
                f"{self.path()}.global_logical_batch_size={cfg.global_logical_batch_size} is not "
                f"divisible by the {num_partitions} batch partitions (num_partitions) of "
                f"partition_spec={spec!r}: "
                f"use a multiple of {num_partitions}"
            )
        layout = batch_feed_layout(mesh, spec, global_batch_size=cfg.global_logical_batch_size)
        self._logical_feed_index, self._num_logical_feeds = layout[jax.process_index()]

    @property
    def num_logical_feeds(self) -> int:
        """The number of distinct feeds (process groups holding different batch rows)."""
        return self._num_logical_feeds

    @property
    def logical_feed_index(self) -> int:
        """This process's feed index."""
        return self._logical_feed_index

    @property
    def feed_logical_batch_size(self) -> int:
        """Examples per feed batch."""
        return self.config.global_logical_batch_size // self._num_logical_feeds

    @property
    def feed_physical_batch_size(self) -> int:
        """Rows per feed batch (no padding: the same as feed_logical_batch_size)."""
        return self.feed_logical_batch_size

    @property
    def partition_spec(self) -> PartitionSpec:
        """The global batch's partition spec."""
        return self.config.partition_spec

    def feed_read_config(self) -> dict[str, int]:
        """The shard this feed reads: {"num_shards": feeds, "shard_index": this feed}."""
        return dict(num_shards=self._num_logical_feeds, shard_index=self._logical_feed_index)

    def logical_to_physical_batch(self, logical_feed_batch: Nested[Tensor]) -> Nested[Tensor]:
        """The per-feed batch as it is (a copy of its tree): it is already physical."""
        return jax.tree.map(lambda x: x, logical_feed_batch)

    def physical_to_logical_batch(self, global_physical_batch: Nested[Tensor]) -> Nested[Tensor]:
        """The global batch as it is (a copy of its tree): it is already logical."""
        return jax.tree.map(lambda x: x, global_physical_batch)

    def logical_to_physical_shapes(
        self, logical_feed_shapes: Nested[jax.ShapeDtypeStruct]
    ) -> Nested[jax.ShapeDtypeStruct]:
        """The shapes as they are (as ShapeDtypeStructs): per-feed batches are already physical.

        Args:
            logical_feed_shapes: ShapeDtypeStructs (or arrays) with a leading batch axis.

        Returns:
            ShapeDtypeStructs of the same shapes and dtypes.

        Raises:
            ValueError: If a leaf has no shape/dtype or no batch axis.
        """
        _check_feed_shapes(logical_feed_shapes, where=type(self).__name__)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), logical_feed_shapes)
