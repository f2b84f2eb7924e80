"""Loss metrics: layers computing a model's loss and summaries from its predictions.

`BaseLossMetrics` is the interface (AXLearn's `loss_metrics.BaseLossMetrics`). A model with a
`metrics` child (e.g. `causal_lm.Model`) calls it as

    loss, outputs = self.metrics(input_batch, predict_outputs=..., module_outputs=...)

and adds `outputs["summaries"]` ({name: WeightedScalar}) as its own summaries. The language-model
implementations are in `axlearn.common.causal_lm`: `CrossEntropyLossMetrics` (next-token
cross-entropy plus z-loss), `AuxLossMetrics` (auxiliary losses from module outputs, e.g. MoE
load balancing) and `CompositeLossMetrics` (a weighted sum of child metrics).
"""

from typing import Any

from axlearn.common.module import Module
from axlearn.common.utils import Nested, Tensor


class BaseLossMetrics(Module):
    """Computes a loss and its summaries from an input batch and the model's outputs."""

    def forward(
        self,
        input_batch: Nested[Tensor],
        *,
        predict_outputs: Nested[Tensor],
        module_outputs: Nested[Tensor],
    ) -> tuple[Tensor, dict[str, Any]]:
        """Computes the loss.

        Args:
            input_batch: The model's input batch.
            predict_outputs: The model's predictions (e.g. {"logits": ..., "hidden_states": ...}).
            module_outputs: The module outputs of the model's invocation, flattened to
                {"decoder/transformer/.../aux_loss": tensor}.

        Returns:
            (loss, outputs): a scalar loss and {"summaries": {name: WeightedScalar}} plus
            optional extra outputs (e.g. "per_token_loss").
        """
        raise NotImplementedError(type(self))
