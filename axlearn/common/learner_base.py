"""The base of learners and of the stateful modules used inside them.

`LearnerModule` is the interface shared by `learner.BaseLearner` (and so `Learner` and
`CompositeLearner`) and `update_transformation.UpdateTransformation`: a module whose state lives
in the learner state, created by `init(...)` with the specs of `create_state_partition_specs(...)`.
This module only depends on `module`, so both `learner` and `update_transformation` can import it.
"""

from __future__ import annotations

from typing import Any

from axlearn.common.module import Module
from axlearn.common.optimizer_base import OptParam
from axlearn.common.utils import Nested


class LearnerModule(Module):
    """A stateful module used inside a learner, including the learner itself.

    Its state is a tree of tensors returned by `init`, described by the specs returned by
    `create_state_partition_specs` (same tree structure).
    """

    def create_state_partition_specs(self, model_param_specs: Nested[Any]) -> Any:
        """Returns the specs (shape, dtype, mesh_axes) of the state.

        Args:
            model_param_specs: The model's parameter specs (masked entries None/MaskedNode).

        Returns:
            A tree with the structure of `init(...)` whose leaves are specs.
        """
        raise NotImplementedError(type(self))

    def init(self, model_params: Nested[OptParam]) -> Any:
        """Returns the initial state.

        Args:
            model_params: The model parameters as OptParams (masked entries None/MaskedNode).

        Returns:
            A tree with the structure of `create_state_partition_specs(...)` and Tensor leaves.
        """
        raise NotImplementedError(type(self))
