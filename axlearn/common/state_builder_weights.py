"""State builders that rewrite layer weights in place: `SimpleWeightModifierBuilder` and the
Conv2D builders (reduce a kernel's input channels, inflate a 2D kernel to 3D).

Public under `axlearn.common.state_builder` too (AXLearn's path).
"""

from __future__ import annotations

import enum
from typing import Any

import jax
from jax import numpy as jnp

from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.state_builder_base import Builder, clone_tree, is_dict
from axlearn.common.utils import Tensor


class SimpleWeightModifierBuilder(Builder):
    """Rewrites the `weight` of every `<layer_name>` layer in the state (subclasses say how)."""

    @config_class
    class Config(Builder.Config):
        """Configures SimpleWeightModifierBuilder."""

        # The child name of the layers whose `weight` is rewritten.
        layer_name: Required[str] = REQUIRED

    def input_state_type(self) -> Builder.StateType:
        """Works on arrays.

        Returns:
            `Builder.StateType.TENSORS`.
        """
        return Builder.StateType.TENSORS

    def __call__(self, state: Builder.State) -> Builder.State:
        """Replaces each matching layer's weight by `_modify_weight(weight)`.

        Args:
            state: The state.

        Returns:
            The state with the weights rewritten (same structure, same built keys).
        """
        name = self.config.layer_name

        def modify(tree: Any) -> Any:
            if not self._should_modify(tree):
                return tree
            out = clone_tree(tree)
            out[name]["weight"] = self._modify_weight(tree[name]["weight"])
            return out

        modified = jax.tree.map(modify, state.trainer_state, is_leaf=self._should_modify)
        return Builder.State(step=state.step, trainer_state=modified, built_keys=state.built_keys)

    def _modify_weight(self, weight: Tensor) -> Tensor:
        raise NotImplementedError(type(self))

    def _should_modify(self, state: Any) -> bool:
        name = self.config.layer_name
        return is_dict(state, name) and is_dict(state[name], "weight")


class BaseConv2DStateBuilder(SimpleWeightModifierBuilder):
    """Rewrites Conv2D kernels ([height, width, input_dim, output_dim])."""

    @config_class
    class Config(SimpleWeightModifierBuilder.Config):
        """Configures BaseConv2DStateBuilder."""

        # The child name of the Conv2D layers.
        layer_name: str = "conv"

    def _should_modify(self, state: Any) -> bool:
        return super()._should_modify(state) and state[self.config.layer_name]["weight"].ndim == 4


class Reduction(enum.Enum):
    """How `Conv2DKernelReducerBuilder` reduces the input channels."""

    SUM = 0
    MEAN = 1


class Conv2DKernelReducerBuilder(BaseConv2DStateBuilder):
    """Reduces Conv2D kernels to one input channel (e.g. an RGB model for 1-channel inputs)."""

    @config_class
    class Config(BaseConv2DStateBuilder.Config):
        """Configures Conv2DKernelReducerBuilder."""

        # Sum or average over the input channels.
        reduction: Reduction = Reduction.SUM

    def _modify_weight(self, weight: Tensor) -> Tensor:
        reduction = self.config.reduction
        if reduction == Reduction.SUM:
            return weight.sum(axis=2, keepdims=True)
        if reduction == Reduction.MEAN:
            return weight.mean(axis=2, keepdims=True)
        raise ValueError(f"{self.path()}: unknown reduction {reduction!r}")


class Conv2DToConv3DBuilder(BaseConv2DStateBuilder):
    """Turns Conv2D kernels into Conv3D ones: `depth` copies along a new axis 2, each / depth.

    The division keeps a Conv3D output on a constant-over-depth input equal to the Conv2D one.
    """

    @config_class
    class Config(BaseConv2DStateBuilder.Config):
        """Configures Conv2DToConv3DBuilder."""

        # The Conv3D kernel's depth.
        depth: Required[int] = REQUIRED

    def _modify_weight(self, weight: Tensor) -> Tensor:
        depth = self.config.depth
        return jnp.repeat(weight[:, :, None, :, :], depth, axis=2) / depth


# The builders `get_builder` recognizes by their SPEC_PREFIX.
