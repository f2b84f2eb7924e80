"""Attention-bias objects (AXLearn's `axlearn.common.attention_bias` classes).

Public names are re-exported by `axlearn.common.attention_bias`. Each object describes a bias
lazily; `value()` materializes it as [batch, num_heads, target_length, source_length] (or None
for no bias), using the functions of `attention_bias`:

- `ZeroAttentionBias()`: no bias.
- `TensorAttentionBias(value)`: an explicit 2-, 3- or 4-D bias.
- `SegmentIdAttentionBias(segment_ids)`: tokens attend only within their segment.
- `MaskFnAttentionBias(mask=, target_positions=, source_positions=)`: a `MaskFn` on positions;
  `CausalAttentionBias` (causal_mask) and `SlidingWindowAttentionBias(sliding_window_size=...)`
  are its common cases.
- `CompositeAttentionBias(biases)`: the sum; `a + b` builds one.

All are pytrees (tensors are leaves; mask functions and window sizes are static), so they can
cross `jax.jit` boundaries.
"""

import dataclasses
from collections.abc import Sequence
from typing import Callable, Optional

import jax

from axlearn.common import attention_bias as _ab


class BaseAttentionBias:
    """A lazily described attention-logit bias."""

    def value(self) -> Optional[_ab.Tensor]:
        """The bias [batch, num_heads, target, source] (broadcastable), or None for zeros."""
        raise NotImplementedError(type(self))

    def __add__(self, other: "BaseAttentionBias") -> "CompositeAttentionBias":
        return CompositeAttentionBias([self, other])


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ZeroAttentionBias(BaseAttentionBias):
    """No bias."""

    def value(self) -> Optional[_ab.Tensor]:
        return None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TensorAttentionBias(BaseAttentionBias):
    """An explicit bias tensor (2-, 3- or 4-D, see `attention_bias`)."""

    bias: _ab.Tensor

    def value(self) -> Optional[_ab.Tensor]:
        return _ab.as_4d_bias(self.bias)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SegmentIdAttentionBias(BaseAttentionBias):
    """Disconnects tokens of different segments (segment_ids [batch, length])."""

    segment_ids: _ab.Tensor

    def value(self) -> Optional[_ab.Tensor]:
        return _ab.make_segment_mask(
            source_segments=self.segment_ids, target_segments=self.segment_ids
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MaskFnAttentionBias(BaseAttentionBias):
    """A mask function evaluated on target/source positions ([batch or 1, length])."""

    target_positions: _ab.Tensor
    source_positions: _ab.Tensor
    mask: Callable = dataclasses.field(default=_ab.causal_mask, metadata=dict(static=True))

    def value(self) -> Optional[_ab.Tensor]:
        return _ab.mask_fn_bias(
            self.mask,
            target_positions=self.target_positions,
            source_positions=self.source_positions,
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CausalAttentionBias(MaskFnAttentionBias):
    """Causal attention over positions."""

    mask: Callable = dataclasses.field(default=_ab.causal_mask, metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlidingWindowAttentionBias(MaskFnAttentionBias):
    """Causal attention to the `sliding_window_size` previous positions and itself."""

    sliding_window_size: int = dataclasses.field(default=0, metadata=dict(static=True))

    def value(self) -> Optional[_ab.Tensor]:
        return _ab.mask_fn_bias(
            _ab.sliding_window_causal_mask(self.sliding_window_size),
            target_positions=self.target_positions,
            source_positions=self.source_positions,
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CompositeAttentionBias(BaseAttentionBias):
    """The sum of several biases (None values are skipped)."""

    biases: Sequence[BaseAttentionBias]

    def value(self) -> Optional[_ab.Tensor]:
        return _ab.add_biases(*(b.value() for b in self.biases))

    def __add__(self, other: BaseAttentionBias) -> "CompositeAttentionBias":
        return CompositeAttentionBias([*self.biases, other])
