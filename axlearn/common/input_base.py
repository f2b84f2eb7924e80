"""The base input interface (AXLearn's `input_base.Input`).

An `Input` produces per-feed batches. Subclasses implement `dataset()` (an iterable of per-feed
*logical* batches, leaves on the host) and, optionally, `element_spec()`. Iterating the input
(`iter(input)` or `input.batches(iter(input.dataset()))`) yields per-feed *physical* batches:
with `input_dispatcher` set, each batch is padded by `InputDispatcher.logical_to_physical_batch`
(see `axlearn.common.input_dispatch`). Inside the jitted step, `dispatch_global_batch` turns the
assembled global physical batch back into the global logical batch.

    input = MyInput.default_config().set(name="input", ...).instantiate(parent=None)
    for per_feed_physical_batch in input:
        global_physical = host_to_global_array(per_feed_physical_batch, mesh=..., partition=...)
        ... jit(lambda b: step(input.dispatch_global_batch(b)))(global_physical)

The existing inputs (`input_tf_data.Input`, `input_fake.FakeLmInput`) keep their own classes:
subclassing this one would add `input_dispatcher: None` to every experiment's config dump.
"""

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Optional, Union

import jax
import numpy as np
from jax.sharding import PartitionSpec

from axlearn.common.config import config_class
from axlearn.common.input_dispatch import InputDispatcher
from axlearn.common.module import Module
from axlearn.common.utils import (
    Nested,
    Tensor,
    dispatch_input_batch,
    tree_paths,
    with_sharding_constraint,
)


class Input(Module):
    """A module generating input batches; subclasses implement `dataset`."""

    @config_class
    class Config(Module.Config):
        """Configures Input."""

        # If not None, pads per-feed logical batches to physical batches (and dispatches them
        # back in `dispatch_global_batch`).
        input_dispatcher: Optional[InputDispatcher.Config] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.input_dispatcher is not None:
            self.input_dispatcher: InputDispatcher = self._add_child(
                "input_dispatcher", cfg.input_dispatcher
            )

    def dataset(self) -> Iterable[Nested[Tensor]]:
        """Returns an iterable of per-feed logical batches (leaves convertible to NumPy)."""
        raise NotImplementedError(type(self))

    def element_spec(self) -> Nested[jax.ShapeDtypeStruct]:
        """Returns the per-feed logical batch's shapes and dtypes (e.g. for AOT compilation)."""
        raise NotImplementedError(type(self))

    def __iter__(self) -> Iterator[Nested[Tensor]]:
        """Yields per-feed physical batches: `batches(iter(self.dataset()))`."""
        yield from self.batches(iter(self.dataset()))

    def batches(self, it: Iterator[Nested[Tensor]]) -> Iterator[Nested[Tensor]]:
        """Yields per-feed physical batches from per-feed logical batches `it`.

        Args:
            it: An iterator of per-feed logical batches (e.g. `iter(self.dataset())`, which can
                be checkpointed separately).

        Yields:
            NumPy batches, padded by `input_dispatcher` if configured.

        Raises:
            ValueError: If a logical feed's first batch does not have `feed_logical_batch_size`
                rows.
        """
        dispatcher = self.input_dispatcher if "input_dispatcher" in self.children else None
        validate = dispatcher is not None and dispatcher.logical_feed_index is not None
        for input_batch in it:
            input_batch = jax.tree.map(np.asarray, input_batch)
            if validate:
                expected = dispatcher.feed_logical_batch_size
                for leaf in jax.tree.leaves(input_batch):
                    if leaf.ndim < 1 or leaf.shape[0] != expected:
                        raise ValueError(
                            f"{self.path()}: Expected per-feed batch size to be {expected}, got: "
                            f"{leaf.shape[0] if leaf.ndim else leaf.shape}; batch each feed's "
                            "input to input_dispatcher's feed_logical_batch_size."
                        )
                validate = False
            if dispatcher is not None:
                input_batch = dispatcher.logical_to_physical_batch(input_batch)
            yield input_batch

    def dispatch_global_batch(
        self,
        global_physical_batch: Nested[Tensor],
        *,
        batch_axis_names: Union[str, Sequence[str]] = "data",
    ) -> Nested[Tensor]:
        """Converts the global physical batch to the global logical batch (call inside jit).

        Args:
            global_physical_batch: The batch assembled from every feed's `batches` output.
            batch_axis_names: Mesh axes sharding the batch axis of the result.

        Returns:
            The global logical batch (padding rows dropped), batch axis constrained to
            `batch_axis_names`.
        """

        def constrain(batch: Nested[Tensor]) -> Nested[Tensor]:
            return jax.tree.map(
                lambda x: with_sharding_constraint(x, PartitionSpec(batch_axis_names)), batch
            )

        if "input_dispatcher" in self.children:
            logical = self.input_dispatcher.physical_to_logical_batch(
                constrain(global_physical_batch)
            )
        else:
            logical = dispatch_input_batch(global_physical_batch, batch_axis_names=None)
        return constrain(logical)


def partition_by_path_rank(
    path_rank_to_partition: Mapping[tuple[Optional[str], int], Any],
) -> Any:
    """Returns a function mapping an input batch to partition specs by leaf path and rank.

    AXLearn's input partitioner. Each key is (path regex or None, rank); a leaf takes the value of
    the first key whose regex fully matches its path ("/"-joined, e.g. "input_ids") or is None and
    whose rank equals the leaf's ndim. Values are PartitionSpecs (or tuples of their entries).
    E.g. {(None, 1): PartitionSpec(("data", "fsdp")), (None, 2): PartitionSpec(("data", "fsdp"),
    "seq")} shards batch axes over data and fsdp and sequence axes over seq.

    Args:
        path_rank_to_partition: {(path regex or None, rank): partition spec}.

    Returns:
        fn(input_batch) -> a tree of PartitionSpecs like input_batch.

    Raises:
        ValueError: (when called) naming the path and rank of a leaf no key matches.
    """
    rules = [
        (None if regex is None else re.compile(regex), rank, spec)
        for (regex, rank), spec in path_rank_to_partition.items()
    ]

    def fn(input_batch: Nested[Any]) -> Nested[PartitionSpec]:
        def spec_of(path: str, leaf: Any) -> PartitionSpec:
            rank = len(leaf.shape)
            for regex, rule_rank, spec in rules:
                if rule_rank == rank and (regex is None or regex.fullmatch(path)):
                    return spec if isinstance(spec, PartitionSpec) else PartitionSpec(*spec)
            raise ValueError(
                f"partition_by_path_rank: no rule for input {path!r} of rank {rank}; add a key "
                f"(None or a regex matching {path!r}, {rank}) to path_rank_to_partition"
            )

        return jax.tree.map(spec_of, tree_paths(input_batch), input_batch)

    return fn
