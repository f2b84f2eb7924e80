"""The optimizer API: optax-style gradient transformations that know how their state is sharded.

It follows optax (`init(params) -> state`, `update(updates, state, params) -> (updates, state)`)
with two additions:

1. A `partition` function maps the parameters' specs (shape, dtype, mesh_axes) to the specs of
   the optimizer state, so the state can be created sharded like the parameters it tracks.
2. `init` and `update` take parameters as `OptParam` leaves: the value plus metadata from the
   parameter's spec (factorization, weight-decay scale) that optimizers may honour.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional, Protocol, Union

import optax

from axlearn.common.utils import Nested, Tensor, TensorSpec  # noqa: F401 (AXLearn's path)


@dataclasses.dataclass
class OptParam:
    """A parameter to be optimized: its value and metadata from its ParameterSpec.

    A plain dataclass (not a pytree node), so tree maps over a tree of OptParams see them as leaves.
    """

    # The parameter value.
    value: Tensor
    # Which axes may be factorized (e.g. by Adafactor); None if unspecified.
    factorization_spec: Optional[Any] = None
    # Multiplier of the weight decay rate for this parameter; None means "not specified" (1 unless
    # a per-parameter rule says otherwise). Takes precedence over per-parameter rules.
    weight_decay_scale: Optional[float] = None

    @property
    def dtype(self):
        """The value's dtype."""
        return self.value.dtype

    @property
    def shape(self):
        """The value's shape."""
        return self.value.shape


# A nested structure (dicts/lists/tuples) with OptParam leaves.
NestedOptParam = Union[OptParam, dict[str, Any], list, tuple]

# Like optax.TransformInitFn, on OptParam trees.
TransformInitFn = Callable[[NestedOptParam], optax.OptState]


class TransformUpdateFn(Protocol):
    """Like optax.TransformUpdateFn, but `params` (an OptParam tree) is passed positionally."""

    def __call__(
        self, updates: optax.Updates, state: optax.OptState, params: Optional[NestedOptParam]
    ) -> tuple[optax.Updates, optax.OptState]: ...


# The spec of one optimizer-state array: shape, dtype and mesh_axes.
OptStateSpec = TensorSpec
NestedOptStateSpec = Union[OptStateSpec, dict, Sequence, None]
# Maps a tree of parameter specs (leaves with .shape, .dtype, .mesh_axes) to the state's specs.
TransformPartitionSpecFn = Callable[[Any], NestedOptStateSpec]


class PartitionedGradientTransformation(NamedTuple):
    """An optax-style transformation plus the function giving the specs of its state.

    `partition(param_specs)` must return a tree with the structure of `init(params)` whose
    leaves are `OptStateSpec`s, so that `state` can be created with the shardings of the
    parameters it mirrors.
    """

    # params -> state.
    init: TransformInitFn
    # (updates, state, params) -> (updates, state).
    update: TransformUpdateFn
    # param specs -> state specs.
    partition: TransformPartitionSpecFn
