"""Skip connections across the layers of a `StackedTransformerLayer` (its `data_merger`).

Public names are re-exported by `axlearn.common.attention`.
"""

from collections.abc import Sequence
from typing import Callable

from axlearn.common.attention.transformer import BaseTransformerLayer
from axlearn.common.utils import Tensor

DataMerger = Callable[[Tensor, Sequence[BaseTransformerLayer.Output]], Tensor]


def update_data_with_skip_connection(skip_connections: dict[int, int]) -> DataMerger:
    """A `StackedTransformerLayer.data_merger` adding earlier layers' outputs to layer inputs.

    With skip_connections {i: j} (j < i), layer i's input is layer i-1's output data plus
    layer j's output data; layers not in the dict get layer i-1's output unchanged.

    Args:
        skip_connections: {index of the receiving layer: index of an earlier layer}.

    Returns:
        merge(data, all_layer_outputs) -> the next layer's input, where all_layer_outputs holds
        the outputs of layers 0..i-1 and data is layer i-1's (possibly merged) output data.

    Raises:
        ValueError: If a source layer is not strictly before its receiving layer.
    """
    for target, source in skip_connections.items():
        if not 0 <= source < target:
            raise ValueError(
                f"update_data_with_skip_connection: skip_connections[{target}]={source} must "
                f"name an earlier layer (0 <= source < {target})."
            )

    def update_data(data: Tensor, all_layer_outputs: Sequence[BaseTransformerLayer.Output]):
        source = skip_connections.get(len(all_layer_outputs))
        if source is None:
            return data
        return data + all_layer_outputs[source].data

    return update_data
