"""The base class of models trained by the trainer."""

from axlearn.common.base_layer import BaseLayer
from axlearn.common.utils import NestedTensor, Tensor


class BaseModel(BaseLayer):
    """A layer whose `forward(input_batch=...)` returns `(loss, aux_outputs)`.

    The trainer calls `forward` through `functional(...)` with the batch dict; the loss is a
    scalar to minimize and `aux_outputs` a (possibly empty) dict of tensors. Metrics are added
    as summaries (e.g. `WeightedScalar`s) with `add_summary`.
    """

    def forward(self, input_batch: NestedTensor, **kwargs) -> tuple[Tensor, NestedTensor]:
        """Returns (loss, aux_outputs) for `input_batch`."""
        raise NotImplementedError(type(self))
