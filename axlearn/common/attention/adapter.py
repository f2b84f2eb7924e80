"""BottleNeckAdapterTransformerLayer: a transformer layer followed by a bottleneck adapter.

Public names are re-exported by `axlearn.common.attention`.

The adapter of Houlsby et al. (https://arxiv.org/abs/1902.00751), in the sequential placement
of He et al. (https://arxiv.org/abs/2110.04366, figure 3a): h <- h + up(act(down(h))) on the
layer's output, with a hidden (bottleneck) dim of `bottleneck_ratio * input_dim`. For
parameter-efficient fine-tuning one trains only the `adapter` parameters.
"""

from typing import Optional

from axlearn.common.attention.transformer import (
    BaseTransformerLayer,
    TransformerFeedForwardLayer,
    TransformerLayer,
)
from axlearn.common.config import InstantiableConfig, config_class
from axlearn.common.module import Module
from axlearn.common.utils import Tensor


class BottleNeckAdapterTransformerLayer(BaseTransformerLayer):
    """Runs `layer`, then adds a bottleneck adapter of its output to it.

    Children: `layer` (the wrapped transformer layer, input_dim set) and `adapter` (a
    TransformerFeedForwardLayer with structure="nonorm", hidden_dim set from the ratio).
    """

    @config_class
    class Config(BaseTransformerLayer.Config):
        """Configures BottleNeckAdapterTransformerLayer."""

        # The wrapped transformer layer.
        layer: InstantiableConfig = TransformerLayer.default_config()
        # The adapter: down projection, activation, up projection (no norm; the residual is
        # added by this layer).
        adapter: InstantiableConfig = TransformerFeedForwardLayer.default_config().set(
            structure="nonorm"
        )
        # The adapter's hidden dim as a fraction of input_dim (rounded, at least 1).
        bottleneck_ratio: float = 0.5

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not 0 < cfg.bottleneck_ratio:
            raise ValueError(
                f"{self.path()}.bottleneck_ratio={cfg.bottleneck_ratio} must be > 0 (e.g. 0.5)."
            )
        hidden_dim = max(1, round(cfg.bottleneck_ratio * cfg.input_dim))
        self._add_child("layer", cfg.layer.clone(input_dim=cfg.input_dim))
        self._add_child(
            "adapter", cfg.adapter.clone(input_dim=cfg.input_dim, hidden_dim=hidden_dim)
        )

    def forward(self, data: Tensor, **layer_kwargs) -> BaseTransformerLayer.Output:
        """Returns `layer`'s Output with data h + adapter(h), h = layer(data).data.

        Args:
            data: [batch, target_length, input_dim].
            **layer_kwargs: Passed to `layer.forward` (e.g. self_attention_logit_biases).

        Returns:
            The wrapped layer's Output with the adapted data.
        """
        output = self.layer(data, **layer_kwargs)
        return output._replace(data=output.data + self.adapter(output.data))
