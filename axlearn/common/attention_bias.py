"""Attention masks and additive attention-logit biases.

Conventions (shared by every attention layer in `axlearn.common.attention`):

* An attention-logit bias is a float tensor added to the attention logits before the softmax.
  It has shape [target_length, source_length], [batch, target_length, source_length] or
  [batch, num_heads, target_length, source_length]; `NEG_INF` disconnects a position pair.
  `None` means "all zeros" (every pair is connected).
* A mask function (`MaskFn`) maps broadcastable integer tensors `query_position` and
  `key_position` to a boolean tensor that is True where the query may attend to the key.
* Segment ids are int tensors [batch, length]; tokens attend only within their own segment.
  Segment id 0 conventionally marks padding.

`NEG_INF` is a large finite negative number rather than -inf, so a row whose every entry is
masked produces a uniform softmax instead of NaNs.

Attention-bias objects (AXLearn's classes) describe a bias lazily; `value()` materializes it as
[batch, num_heads, target_length, source_length] (or None for no bias):

- `ZeroAttentionBias()`: no bias.
- `TensorAttentionBias(value)`: an explicit 2-, 3- or 4-D bias.
- `BoolAttentionBias` subclasses are boolean masks (`bool_value()`; `value()` is 0/`NEG_INF`):
  `BoolTensorAttentionBias.from_tensor(mask)`, an explicit mask;
  `SegmentIdAttentionBias(segment_ids)`: tokens attend only within their segment;
  `MaskFnAttentionBias(mask=, target_positions=, source_positions=)`: a `MaskFn` evaluated on
  `target_positions[:, :, None]` and `source_positions[:, None, :]`; `CausalAttentionBias`
  (causal_mask), `SlidingWindowAttentionBias(sliding_window_size=...)` and
  `LeftRightWindowAttentionBias` are its common cases.
- `CompositeAttentionBias(biases)`: the sum; `a + b` builds one. `split(bias, *types)` takes
  members of given types out of a sum.

Every bias has a static `dtype` field (None: keep the computed dtype; `astype(dtype)` returns a
copy with it set), `eval_shape()`, and `partition_spec(mha_dim_to_partition_spec)`, which
returns a pytree of the same structure with `PartitionSpec`s in place of tensors.
`as_attention_bias` turns None or a float tensor into a bias object.

All are pytrees (tensors are leaves; mask functions, window sizes and dtypes are static), so
they can cross `jax.jit` boundaries. The mask functions live in `attention_mask_fns`.
"""

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Callable, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from axlearn.common.attention_bias_tensors import (  # noqa: F401 (public under this path)
    NEG_INF,
    _same_segment,
    add_biases,
    apply_attention_logit_biases,
    as_4d_bias,
    bool_to_bias,
    compute_padding_biases,
    make_causal_biases,
    make_segment_mask,
    make_sliding_window_causal_biases,
    mask_fn_bias,
)
from axlearn.common.attention_mask_fns import (
    MaskFn,
    and_masks,
    causal_mask,
    causal_mask_fn,
    left_right_window_mask,
    or_masks,
    sliding_window_causal_mask,
    truncated_key_mask,
)
from axlearn.common.config import (
    FunctionConfigBase,
    config_for_function,
)

Tensor = jnp.ndarray

# The mask functions (`attention_mask_fns`) and the tensor helpers (`attention_bias_tensors`) are
# public names of this module (config dumps name them by this path).
for _fn in (
    MaskFn,
    and_masks,
    causal_mask,
    causal_mask_fn,
    left_right_window_mask,
    or_masks,
    sliding_window_causal_mask,
    truncated_key_mask,
    bool_to_bias,
    make_causal_biases,
    make_sliding_window_causal_biases,
    make_segment_mask,
    mask_fn_bias,
    apply_attention_logit_biases,
    compute_padding_biases,
    add_biases,
    as_4d_bias,
):
    _fn.__module__ = __name__
del _fn


def _broadcast_value(value: Optional[Tensor]) -> Optional[Tensor]:
    """`as_4d_bias(value)`, passing None through."""
    return None if value is None else as_4d_bias(value)


def _spec_for_explicit_bias(spec: PartitionSpec, shape: tuple[int, ...]) -> PartitionSpec:
    """The partition spec of a [batch, num_heads, target, source] tensor sharded as `spec`.

    Dimensions of size 1 (broadcast batch or heads) are left unsharded.
    """
    if spec == PartitionSpec(None):
        return spec
    dims = list(spec) + [None] * (4 - len(spec))
    for i in (0, 1):
        if shape[i] == 1:
            dims[i] = None
    return PartitionSpec(*dims)


@dataclasses.dataclass(eq=False)
class BaseAttentionBias:
    """A lazily described attention-logit bias.

    Subclasses implement `_value()` (a 2-, 3- or 4-D bias, or None); `value()` casts it to
    `dtype` and broadcasts it to 4 dimensions.
    """

    # The dtype `value()` casts to; None keeps the computed dtype.
    dtype: Optional[jnp.dtype] = dataclasses.field(
        default=None, kw_only=True, metadata=dict(static=True)
    )

    def value(self) -> Optional[Tensor]:
        """Returns the bias [batch or 1, num_heads or 1, target, source], or None for zeros."""
        value = self._value()
        if value is not None and self.dtype is not None:
            value = value.astype(self.dtype)
        return _broadcast_value(value)

    def _value(self) -> Optional[Tensor]:
        """The bias before casting and broadcasting (2-, 3- or 4-D), or None."""
        raise NotImplementedError(type(self))

    def __add__(self, other: "BaseAttentionBias") -> "CompositeAttentionBias":
        return CompositeAttentionBias([self, other])

    def astype(self, dtype: jnp.dtype) -> "BaseAttentionBias":
        """Returns a copy whose `value()` has dtype `dtype`.

        Args:
            dtype: The new dtype.

        Returns:
            The copy.
        """
        return dataclasses.replace(self, dtype=dtype)

    def has_value(self) -> bool:
        """Whether `value()` is not None (decided on shapes only, nothing is computed)."""
        return jax.eval_shape(type(self).value, self) is not None

    def eval_shape(self) -> tuple[int, ...]:
        """Returns the shape of `value()` without computing it.

        Returns:
            The 4-D shape.

        Raises:
            ValueError: If the bias has no value.
        """
        shape = jax.eval_shape(type(self).value, self)
        if shape is None:
            raise ValueError(f"{type(self).__name__} has no value.")
        return shape.shape

    def partition_spec(
        self, mha_dim_to_partition_spec: dict[str, PartitionSpec]
    ) -> Union["BaseAttentionBias", PartitionSpec]:
        """Returns the partition spec of this bias: a pytree of the same structure.

        Args:
            mha_dim_to_partition_spec: Partition specs of the attention tensors by their dims
                ("bnts": the bias [batch, heads, target, source]; "bsnh": keys/values).

        Returns:
            A `PartitionSpec`, or a bias object with specs in place of its tensors.
        """
        raise NotImplementedError(f"{type(self).__name__}.partition_spec")

    def bias_and_residual(self, cls: type) -> "BiasAndResidual":
        """Splits this bias into a part of type `cls` and a residual; their sum is this bias.

        Args:
            cls: The bias type to take out.

        Returns:
            `BiasAndResidual(bias=self, residual=<zero>)` if this is a `cls`, else
            `BiasAndResidual(bias=None, residual=self)`.
        """
        if isinstance(self, cls):
            return BiasAndResidual(bias=self, residual=CompositeAttentionBias([]))
        return BiasAndResidual(bias=None, residual=self)

    @classmethod
    def from_sequence(cls, biases: Sequence["BaseAttentionBias"]) -> Optional["BaseAttentionBias"]:
        """Combines biases of this type into one.

        Args:
            biases: Instances of this class, all of the same `eval_shape()`.

        Returns:
            None for an empty sequence, the only element for a sequence of one.

        Raises:
            TypeError: If an element is not an instance of this class.
            ValueError: If the elements' shapes differ.
            NotImplementedError: If there is more than one (subclasses may combine them).
        """
        for bias in biases:
            if not isinstance(bias, cls):
                raise TypeError(f"from_sequence: got {type(bias).__name__}, not a {cls.__name__}.")
        if not biases:
            return None
        shape = biases[0].eval_shape()
        for bias in biases[1:]:
            if bias.eval_shape() != shape:
                raise ValueError(
                    f"{cls.__name__}.from_sequence: shape {bias.eval_shape()} != {shape}."
                )
        if len(biases) == 1:
            return biases[0]
        raise NotImplementedError(f"{cls.__name__}.from_sequence of {len(biases)} biases.")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BoolAttentionBias(BaseAttentionBias):
    """A bias given by a boolean mask (True = attend): `value()` is 0 or `NEG_INF`.

    Subclasses implement `_bool_value()`.
    """

    def _value(self) -> Optional[Tensor]:
        return bool_to_bias(self.bool_value())

    def bool_value(self) -> Optional[Tensor]:
        """Returns the boolean mask [batch or 1, num_heads or 1, target, source], or None."""
        mask = self._bool_value()
        return None if mask is None else _broadcast_value(mask.astype(bool))

    def _bool_value(self) -> Optional[Tensor]:
        """The mask before broadcasting (2-, 3- or 4-D), or None for no mask."""
        raise NotImplementedError(type(self))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ZeroAttentionBias(BoolAttentionBias):
    """No bias."""

    def _bool_value(self) -> None:
        return None

    def partition_spec(
        self, mha_dim_to_partition_spec: dict[str, PartitionSpec]
    ) -> Union[BaseAttentionBias, PartitionSpec]:
        del mha_dim_to_partition_spec
        return PartitionSpec()

    def __eq__(self, other) -> bool:
        return type(other) is type(self)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TensorAttentionBias(BaseAttentionBias):
    """An explicit bias tensor (2-, 3- or 4-D, see `attention_bias`)."""

    bias: Tensor

    def _value(self) -> Optional[Tensor]:
        return self.bias

    def partition_spec(
        self, mha_dim_to_partition_spec: dict[str, PartitionSpec]
    ) -> Union[BaseAttentionBias, PartitionSpec]:
        spec = _spec_for_explicit_bias(mha_dim_to_partition_spec["bnts"], self.eval_shape())
        # The spec must match the stored tensor's rank.
        return PartitionSpec(*tuple(spec)[4 - self.bias.ndim :]) if self.bias.ndim < 4 else spec

    @classmethod
    def from_tensor(cls, tensor: Tensor) -> "TensorAttentionBias":
        """Returns a bias holding `tensor` expanded to 4 dims (see `as_4d_bias`).

        Args:
            tensor: A 2-, 3- or 4-D bias.

        Returns:
            The bias object.
        """
        return cls(as_4d_bias(tensor))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BoolTensorAttentionBias(BoolAttentionBias):
    """An explicit boolean mask [batch, num_heads, target, source] (True = attend)."""

    # The boolean mask, 4-D.
    bool_mask: Tensor

    def __post_init__(self):
        shape = getattr(self.bool_mask, "shape", None)
        if shape is not None and len(shape) != 4:
            raise ValueError(f"BoolTensorAttentionBias: bool_mask must be 4-D, got shape {shape}.")
        dtype = getattr(self.bool_mask, "dtype", None)
        if dtype is not None and dtype != jnp.bool_:
            raise ValueError(f"BoolTensorAttentionBias: bool_mask must be bool, got {dtype}.")

    def _bool_value(self) -> Tensor:
        return self.bool_mask

    def partition_spec(
        self, mha_dim_to_partition_spec: dict[str, PartitionSpec]
    ) -> Union[BaseAttentionBias, PartitionSpec]:
        return _spec_for_explicit_bias(mha_dim_to_partition_spec["bnts"], self.eval_shape())

    @classmethod
    def from_tensor(cls, tensor: Tensor) -> "BoolTensorAttentionBias":
        """Returns a bias holding the boolean `tensor` expanded to 4 dims (see `as_4d_bias`).

        Args:
            tensor: A 2-, 3- or 4-D boolean mask.

        Returns:
            The bias object.
        """
        return cls(as_4d_bias(tensor))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SegmentIdAttentionBias(BoolAttentionBias):
    """Disconnects tokens of different segments (segment_ids [batch, length])."""

    segment_ids: Tensor

    def _bool_value(self) -> Optional[Tensor]:
        return _same_segment(self.segment_ids, self.segment_ids)

    def partition_spec(
        self, mha_dim_to_partition_spec: dict[str, PartitionSpec]
    ) -> Union[BaseAttentionBias, PartitionSpec]:
        # Segment ids are sharded like the keys/values' batch; their sequence is not sharded.
        kv_spec = mha_dim_to_partition_spec["bsnh"]
        if kv_spec == PartitionSpec(None):
            return PartitionSpec(None)
        if kv_spec[1] is not None:
            raise ValueError(
                "SegmentIdAttentionBias.partition_spec: the sequence dim of 'bsnh' must not be "
                f"sharded, got {kv_spec}."
            )
        return PartitionSpec(kv_spec[0], None)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MaskFnAttentionBias(BoolAttentionBias):
    """A mask function evaluated on target/source positions ([batch or 1, length]).

    The mask function is called with `target_positions[:, :, None]` and
    `source_positions[:, None, :]` (both 3-D) and returns a [batch, target, source] mask.
    """

    # The mask function (first, so that `MaskFnAttentionBias(mask, target_positions=...)` works).
    mask: Callable = dataclasses.field(default=causal_mask, metadata=dict(static=True))
    # Query positions [batch or 1, target_length].
    target_positions: Tensor = dataclasses.field(kw_only=True)
    # Key positions [batch or 1, source_length].
    source_positions: Tensor = dataclasses.field(kw_only=True)

    def _bool_value(self) -> Optional[Tensor]:
        target, source = self.target_positions, self.source_positions
        if target.ndim != 2 or source.ndim != 2:
            raise ValueError(
                f"{type(self).__name__}: target_positions {target.shape} and source_positions "
                f"{source.shape} must both be [batch or 1, length]."
            )
        return _bias_mask_fn(self)(target[:, :, None], source[:, None, :])

    def partition_spec(
        self, mha_dim_to_partition_spec: dict[str, PartitionSpec]
    ) -> Union[BaseAttentionBias, PartitionSpec]:
        spec = mha_dim_to_partition_spec["bnts"]
        batch, target, source = (None,) * 3 if spec == PartitionSpec(None) else (spec[0], *spec[2:])
        return dataclasses.replace(
            self,
            target_positions=PartitionSpec(
                None if self.target_positions.shape[0] == 1 else batch, target
            ),
            source_positions=PartitionSpec(
                None if self.source_positions.shape[0] == 1 else batch, source
            ),
        )

    @classmethod
    def from_sequence(
        cls, biases: Sequence["MaskFnAttentionBias"]
    ) -> Optional["MaskFnAttentionBias"]:
        """Combines mask biases over the same positions into one whose mask is their AND.

        Args:
            biases: Instances of this class (the first one's positions are used).

        Returns:
            None for no biases, the only element for one, else a `MaskFnAttentionBias`.
        """
        try:
            return super().from_sequence(biases)
        except NotImplementedError:
            pass
        masks = [_bias_mask_fn(b) for b in biases]
        return MaskFnAttentionBias(
            target_positions=biases[0].target_positions,
            source_positions=biases[0].source_positions,
            mask=and_masks(*masks),
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CausalAttentionBias(MaskFnAttentionBias):
    """Causal attention over positions.

    `CausalAttentionBias.default_config()` is the config of its mask function, for an attention
    layer's `mask` field (`MultiheadAttention.default_config().set(mask=...)`); instantiated with
    `target_positions=` and `source_positions=` it gives the bias over those positions instead.
    """

    mask: Callable = dataclasses.field(default=causal_mask, metadata=dict(static=True))

    @classmethod
    def default_config(cls, **kwargs) -> FunctionConfigBase:
        """Returns a config that instantiates to `causal_mask` (kwargs: none accepted)."""
        return config_for_function(causal_mask_or_bias).set(**kwargs)

    @classmethod
    def from_sequence(
        cls, biases: Sequence["CausalAttentionBias"]
    ) -> Optional["CausalAttentionBias"]:
        """Causal biases over the same positions are one bias: returns the first (or None)."""
        try:
            return super().from_sequence(biases)
        except NotImplementedError:
            return biases[0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlidingWindowAttentionBias(MaskFnAttentionBias):
    """Causal attention to the `sliding_window_size` previous positions and itself."""

    sliding_window_size: int = dataclasses.field(default=0, metadata=dict(static=True))

    @classmethod
    def default_config(cls, **kwargs) -> FunctionConfigBase:
        """Returns a config of the mask (or, given positions, the bias); kwargs:
        `sliding_window_size`."""
        return config_for_function(sliding_window_mask_or_bias).set(**kwargs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LeftRightWindowAttentionBias(MaskFnAttentionBias):
    """Attention to `left_context` positions before, `right_context` after and itself."""

    left_context: int = dataclasses.field(default=0, metadata=dict(static=True))
    right_context: int = dataclasses.field(default=0, metadata=dict(static=True))

    @classmethod
    def default_config(cls, **kwargs) -> FunctionConfigBase:
        """Returns a config of the mask (or, given positions, the bias); kwargs: `left_context`,
        `right_context`."""
        return config_for_function(left_right_window_mask_or_bias).set(**kwargs)


def _mask_or_bias(mask_fn: MaskFn, target_positions, source_positions, make_bias: Callable):
    """`mask_fn` without positions, else `make_bias(target_positions, source_positions)`."""
    if target_positions is None and source_positions is None:
        return mask_fn
    if target_positions is None or source_positions is None:
        raise ValueError(
            "An attention mask config instantiated with positions needs both target_positions "
            "and source_positions ([batch or 1, length]); pass both or neither."
        )
    return make_bias(target_positions, source_positions)


def causal_mask_or_bias(*, target_positions=None, source_positions=None):
    """`causal_mask`, or the `CausalAttentionBias` over the given positions.

    Args:
        target_positions: Optional query positions [batch or 1, target_length].
        source_positions: Optional key positions [batch or 1, source_length].

    Returns:
        The mask function without positions, else the bias.
    """
    return _mask_or_bias(
        causal_mask_fn(),
        target_positions,
        source_positions,
        lambda t, s: CausalAttentionBias(target_positions=t, source_positions=s),
    )


def sliding_window_mask_or_bias(
    sliding_window_size: int, *, target_positions=None, source_positions=None
):
    """`sliding_window_causal_mask(sliding_window_size)`, or its bias over the given positions.

    Args:
        sliding_window_size: Number of previous positions each query sees (>= 0).
        target_positions: Optional query positions [batch or 1, target_length].
        source_positions: Optional key positions [batch or 1, source_length].

    Returns:
        The mask function without positions, else a `SlidingWindowAttentionBias`.
    """
    return _mask_or_bias(
        sliding_window_causal_mask(sliding_window_size),
        target_positions,
        source_positions,
        lambda t, s: SlidingWindowAttentionBias(
            target_positions=t, source_positions=s, sliding_window_size=sliding_window_size
        ),
    )


def left_right_window_mask_or_bias(
    left_context: int, right_context: int, *, target_positions=None, source_positions=None
):
    """`left_right_window_mask(left_context, right_context)`, or its bias over the positions.

    Args:
        left_context: Positions to the left each query sees (>= 0).
        right_context: Positions to the right each query sees (>= 0).
        target_positions: Optional query positions [batch or 1, target_length].
        source_positions: Optional key positions [batch or 1, source_length].

    Returns:
        The mask function without positions, else a `LeftRightWindowAttentionBias`.
    """
    return _mask_or_bias(
        left_right_window_mask(left_context, right_context),
        target_positions,
        source_positions,
        lambda t, s: LeftRightWindowAttentionBias(
            target_positions=t,
            source_positions=s,
            left_context=left_context,
            right_context=right_context,
        ),
    )


def _bias_mask_fn(bias: MaskFnAttentionBias) -> MaskFn:
    """The mask function a `MaskFnAttentionBias` (or a windowed subclass) evaluates."""
    if isinstance(bias, SlidingWindowAttentionBias):
        return sliding_window_causal_mask(bias.sliding_window_size)
    if isinstance(bias, LeftRightWindowAttentionBias):
        return left_right_window_mask(bias.left_context, bias.right_context)
    return bias.mask


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CompositeAttentionBias(BaseAttentionBias):
    """The sum of several biases (None values are skipped)."""

    biases: Sequence[BaseAttentionBias]

    def _value(self) -> Optional[Tensor]:
        return add_biases(*(b.value() for b in self.biases if b is not None))

    def __add__(self, other: BaseAttentionBias) -> "CompositeAttentionBias":
        return CompositeAttentionBias([*self.biases, other])

    def _nonzero(self) -> list[BaseAttentionBias]:
        """The members whose value is not None."""
        return [b for b in self.biases if b is not None and b.has_value()]

    def partition_spec(
        self, mha_dim_to_partition_spec: dict[str, PartitionSpec]
    ) -> Union[BaseAttentionBias, PartitionSpec]:
        specs = [
            PartitionSpec() if b is None else b.partition_spec(mha_dim_to_partition_spec)
            for b in self.biases
        ]
        return CompositeAttentionBias(specs, dtype=self.dtype)

    def bias_and_residual(self, cls: type) -> "BiasAndResidual":
        """Takes the members of type `cls` out (recursively), merged by `cls.from_sequence`.

        Args:
            cls: The bias type to take out.

        Returns:
            The `cls` part (or None) and a `CompositeAttentionBias` of the rest.
        """
        own = super().bias_and_residual(cls)
        if own.bias is not None:
            return own
        remaining = self._nonzero()
        found, residuals = [], []
        while remaining:
            part = remaining.pop().bias_and_residual(cls)
            if part.bias is not None:
                found.append(part.bias)
                # A residual of a found part may still hold `cls` members.
                target = remaining
            else:
                target = residuals
            if part.residual.has_value():
                target.append(part.residual)
        return BiasAndResidual(
            bias=cls.from_sequence(found), residual=CompositeAttentionBias(residuals)
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BiasAndResidual(BaseAttentionBias):
    """A bias split into a part of one type (`bias`, or None) and the `residual`; value is the sum.

    Iterates as `(bias, residual)`.
    """

    bias: Optional[BaseAttentionBias]
    residual: BaseAttentionBias

    def _value(self) -> Optional[Tensor]:
        parts = [self.residual] if self.bias is None else [self.bias, self.residual]
        return CompositeAttentionBias(parts).value()

    def partition_spec(
        self, mha_dim_to_partition_spec: dict[str, PartitionSpec]
    ) -> Union[BaseAttentionBias, PartitionSpec]:
        bias = None if self.bias is None else self.bias.partition_spec(mha_dim_to_partition_spec)
        residual = self.residual.partition_spec(mha_dim_to_partition_spec)
        return BiasAndResidual(bias=bias, residual=residual, dtype=self.dtype)

    def __iter__(self) -> Iterator[Optional[BaseAttentionBias]]:
        return iter((self.bias, self.residual))


def as_attention_bias(bias: Union[None, Tensor, BaseAttentionBias]) -> BaseAttentionBias:
    """Converts None, a float bias tensor or a bias object to a bias object.

    Args:
        bias: None (no bias), a floating 2-, 3- or 4-D tensor, or a `BaseAttentionBias`.

    Returns:
        `ZeroAttentionBias()`, a `TensorAttentionBias` or `bias` itself.

    Raises:
        ValueError: If `bias` is a tensor without a floating dtype.
        NotImplementedError: If `bias` is of another type.
    """
    if bias is None:
        return ZeroAttentionBias()
    if isinstance(bias, BaseAttentionBias):
        return bias
    if isinstance(bias, (jax.Array, np.ndarray)):
        if not jnp.issubdtype(bias.dtype, jnp.floating):
            raise ValueError(f"as_attention_bias: bias must be floating, got {bias.dtype}.")
        return TensorAttentionBias.from_tensor(bias)
    raise NotImplementedError(f"as_attention_bias: {type(bias).__name__}.")


def split(bias: BaseAttentionBias, *cls: type) -> Iterator[BaseAttentionBias]:
    """Splits `bias` into `len(cls) + 1` biases: the ith of type `cls[i]` (or a zero bias), last
    the residual. Their sum equals `bias`; a member matching several types goes to the first.

    Args:
        bias: The bias to split.
        *cls: The bias types to take out, in priority order.

    Returns:
        An iterator of the `len(cls) + 1` biases.

    Raises:
        NotImplementedError: If a residual still holds a bias of one of `cls`.
    """
    for c in cls:
        part, bias = bias.bias_and_residual(c)
        if isinstance(bias, cls):
            raise NotImplementedError(f"split: a residual of type {type(bias).__name__} in {cls}.")
        yield ZeroAttentionBias() if part is None else part
    yield bias


__all__ = [
    "NEG_INF",
    "BaseAttentionBias",
    "BiasAndResidual",
    "BoolAttentionBias",
    "BoolTensorAttentionBias",
    "CausalAttentionBias",
    "CompositeAttentionBias",
    "MaskFn",
    "MaskFnAttentionBias",
    "SegmentIdAttentionBias",
    "SlidingWindowAttentionBias",
    "TensorAttentionBias",
    "LeftRightWindowAttentionBias",
    "ZeroAttentionBias",
    "add_biases",
    "and_masks",
    "apply_attention_logit_biases",
    "as_attention_bias",
    "as_4d_bias",
    "bool_to_bias",
    "causal_mask",
    "causal_mask_fn",
    "compute_padding_biases",
    "left_right_window_mask",
    "make_causal_biases",
    "make_segment_mask",
    "make_sliding_window_causal_biases",
    "mask_fn_bias",
    "or_masks",
    "sliding_window_causal_mask",
    "split",
    "truncated_key_mask",
]
