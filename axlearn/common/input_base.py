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
from typing import Any, NamedTuple, Optional, Protocol, Union, runtime_checkable

import jax
import numpy as np
from jax.sharding import PartitionSpec

from axlearn.common.config import ConfigOr, config_class, maybe_instantiate
from axlearn.common.input_dispatch import BaseInputDispatcher
from axlearn.common.module import Module
from axlearn.common.utils import (
    Nested,
    Tensor,
    dispatch_input_batch,
    input_partition_spec,
    tree_paths,
    with_sharding_constraint,
)


@runtime_checkable
class InputPartitionFn(Protocol):
    """Partitions a global logical input batch (called inside jit by `dispatch_global_batch`).

    Either returns the batch with sharding constraints applied (as AXLearn's partitioners do), or
    a tree of PartitionSpecs like the batch (as `partition_by_path_rank` does), which
    `dispatch_global_batch` applies; `PartitionSpec.UNCONSTRAINED` leaves a leaf as it is.
    """

    def __call__(self, input_batch: Nested[Tensor]) -> Nested[Any]: ...


class PathAndRank(NamedTuple):
    """A key of `partition_by_path_rank`: which inputs a rule matches.

    Attributes:
        path: A regex full-matched against the input's "/"-joined path (or a compiled pattern);
            None matches every path.
        rank: The input's ndim; None matches every rank.
    """

    path: Optional[Union[str, re.Pattern]]
    rank: Optional[int]


_UNCONSTRAINED = PartitionSpec.UNCONSTRAINED


def _is_spec_leaf(x: Any) -> bool:
    return isinstance(x, PartitionSpec) or x is _UNCONSTRAINED


class Input(Module):
    """A module generating input batches; subclasses implement `dataset`."""

    @config_class
    class Config(Module.Config):
        """Configures Input."""

        # The partition spec of global batches (its first entry: the batch axis); None: the
        # batch axis over "data" in `dispatch_global_batch` (`partition_spec` property: the
        # dispatcher's, else every mesh axis). Also given to a dispatcher with such a field.
        partition_spec: Optional[PartitionSpec] = None
        # If not None, pads per-feed logical batches to physical batches (and dispatches them
        # back in `dispatch_global_batch`).
        input_dispatcher: Optional[BaseInputDispatcher.Config] = None
        # If not None, further constrains each global logical batch in `dispatch_global_batch`
        # (an InputPartitionFn, e.g. `partition_by_path_rank(...)`, or a config of one).
        input_partitioner: Optional[ConfigOr[InputPartitionFn]] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.input_dispatcher is not None:
            dispatcher_cfg = cfg.input_dispatcher.clone()
            if cfg.partition_spec is not None and "partition_spec" in dispatcher_cfg:
                dispatcher_cfg.partition_spec = cfg.partition_spec
            self.input_dispatcher: BaseInputDispatcher = self._add_child(
                "input_dispatcher", dispatcher_cfg
            )
        self._input_partitioner: Optional[InputPartitionFn] = maybe_instantiate(
            cfg.input_partitioner
        )
        if self._input_partitioner is not None and not callable(self._input_partitioner):
            raise ValueError(
                f"{self.path()}.input_partitioner must be callable (an InputPartitionFn) or a "
                f"config of one, got {type(self._input_partitioner).__name__}"
            )

    @property
    def partition_spec(self) -> PartitionSpec:
        """The partition spec of global physical batches (for `host_to_global_array` and jit).

        The dispatcher's, if configured; else the batch axis over every axis of the current mesh
        (raises ValueError outside a mesh).
        """
        if "input_dispatcher" in self.children:
            return self.input_dispatcher.partition_spec
        return input_partition_spec()

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
        batch_axis_names: Optional[Union[str, Sequence[str]]] = None,
    ) -> Nested[Tensor]:
        """Converts the global physical batch to the global logical batch (call inside jit).

        Args:
            global_physical_batch: The batch assembled from every feed's `batches` output.
            batch_axis_names: Mesh axes sharding the batch axis; None: `partition_spec`'s
                first entry if configured, else "data". A configured `partition_spec` of more
                entries also constrains the next axes of leaves that have them.

        Returns:
            The global logical batch (padding rows dropped), constrained along its batch axis and
            then by `input_partitioner` if configured.

        Raises:
            ValueError: If `input_partitioner` returns specs whose tree does not match the batch.
        """
        cfg = self.config
        if batch_axis_names is not None:
            spec = PartitionSpec(batch_axis_names)
        elif cfg.partition_spec is not None:
            spec = cfg.partition_spec
        else:
            spec = PartitionSpec("data")

        def constrain(batch: Nested[Tensor]) -> Nested[Tensor]:
            return jax.tree.map(
                lambda x: with_sharding_constraint(x, PartitionSpec(*tuple(spec)[: x.ndim])),
                batch,
            )

        if "input_dispatcher" in self.children:
            logical = self.input_dispatcher.physical_to_logical_batch(
                constrain(global_physical_batch)
            )
        else:
            logical = dispatch_input_batch(global_physical_batch, batch_axis_names=None)
        logical = constrain(logical)
        if self._input_partitioner is not None:
            logical = self._apply_partitioner(logical)
        return logical

    def _apply_partitioner(self, batch: Nested[Tensor]) -> Nested[Tensor]:
        out = self._input_partitioner(batch)
        spec_leaves = jax.tree.leaves(out, is_leaf=_is_spec_leaf)
        if not spec_leaves or not all(_is_spec_leaf(x) for x in spec_leaves):
            return out  # The partitioner constrained the batch itself.
        if jax.tree.structure(out, is_leaf=_is_spec_leaf) != jax.tree.structure(batch):
            raise ValueError(
                f"{self.path()}.input_partitioner returned partition specs whose tree does not "
                f"match the batch: {jax.tree.structure(out, is_leaf=_is_spec_leaf)} vs "
                f"{jax.tree.structure(batch)}"
            )
        return jax.tree.map(
            lambda s, x: x if s is _UNCONSTRAINED else with_sharding_constraint(x, s),
            out,
            batch,
            is_leaf=_is_spec_leaf,
        )


def partition_by_path_rank(
    path_rank_to_partition: Mapping[tuple[Optional[Union[str, re.Pattern]], Optional[int]], Any],
) -> InputPartitionFn:
    """Returns a function mapping an input batch to partition specs by leaf path and rank.

    AXLearn's input partitioner. Each key is a `PathAndRank` (or a (path, rank) tuple): a path
    regex full-matched against the leaf's "/"-joined path (e.g. "input_ids") or None for any
    path, and a rank equal to the leaf's ndim or None for any rank. A leaf takes the value of the
    first key (in order) that matches. Values are PartitionSpecs (or tuples of their entries),
    None (replicated: `PartitionSpec()`) or `PartitionSpec.UNCONSTRAINED` (leave the leaf as it
    is). E.g. {(None, 1): PartitionSpec(("data", "fsdp")), (None, 2): PartitionSpec(("data",
    "fsdp"), "seq")} shards batch axes over data and fsdp and sequence axes over seq.

    Unlike AXLearn's, the function returns the specs (a tree like the batch), not the constrained
    batch; `Input.dispatch_global_batch` applies them.

    Args:
        path_rank_to_partition: {(path regex or None, rank or None): partition spec}.

    Returns:
        fn(input_batch) -> a tree of PartitionSpecs (or UNCONSTRAINED) like input_batch.

    Raises:
        ValueError: (when called) "No rules matched ...", naming the path and rank of a leaf no
            key matches.
    """
    rules = []
    for (regex, rank), spec in path_rank_to_partition.items():
        if spec is None:
            spec = PartitionSpec()
        elif not _is_spec_leaf(spec):
            spec = PartitionSpec(*spec)
        rules.append((None if regex is None else re.compile(regex), rank, spec))

    def fn(input_batch: Nested[Any]) -> Nested[PartitionSpec]:
        def spec_of(path: str, leaf: Any) -> PartitionSpec:
            rank = len(np.shape(leaf))
            for regex, rule_rank, spec in rules:
                if (rule_rank is None or rule_rank == rank) and (
                    regex is None or regex.fullmatch(path)
                ):
                    return spec
            raise ValueError(
                f"partition_by_path_rank: No rules matched: no rule for input {path!r} of rank "
                f"{rank}; add a key (None or a regex matching {path!r}, {rank} or None) to "
                "path_rank_to_partition (PartitionSpec.UNCONSTRAINED leaves it as it is)"
            )

        return jax.tree.map(spec_of, tree_paths(input_batch), input_batch)

    return fn
