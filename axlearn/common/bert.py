"""BERT (https://arxiv.org/abs/1810.04805): embeddings, pooler, heads and config helpers.

- `BertPooler`: the first token's state through dropout, a linear layer, tanh and dropout.
- `NonLinear`: linear -> activation -> LayerNorm (the MLM head's transform).
- `BertLMHead`: the MLM head, transform then the tied token embedding (`inner_head`, a
  `RedirectToSharedModule` to the encoder's token embedding) plus `output_bias`; targets equal to
  `ignored_target_id` do not count.
- `BertSequenceClassificationHead` (GLUE-style; `num_classes=1` is regression with a mean squared
  error) and `BertMultipleChoiceHead` (one logit per choice).
- `BertModel`: an `EncoderModel` whose token embedding is shared with its head; truncated-normal
  (std 0.02) weights as the original BERT.
- `bert_embedding_config`, `bert_transformer_config`, `bert_lm_head_config`, `bert_model_config`
  and `bert_layer_norm_epsilon`: BERT-base defaults (post-norm layers, GELU, 4x feed-forward).
"""

from typing import Optional

import jax.numpy as jnp

from axlearn.common.attention import (
    BaseStackedTransformerLayer,
    StackedTransformerLayer,
    TransformerLayer,
    scaled_hidden_dim,
)
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.embedding import LearnedPositionalEmbedding, TransformerTextEmbeddings
from axlearn.common.encoder import Encoder, EncoderModel
from axlearn.common.layers import (
    BaseClassificationHead,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    RedirectToSharedModule,
    get_activation_fn,
    set_layer_norm_eps_recursively,
)
from axlearn.common.loss import mean_squared_error
from axlearn.common.module import Module, child_context
from axlearn.common.param_init import (
    PARAM_REGEXP_WEIGHT,
    DefaultInitializer,
    WeightInitializer,
    constant_initializer,
)
from axlearn.common.utils import NestedTensor, Tensor

__all__ = [
    "BertLMHead",
    "BertModel",
    "BertMultipleChoiceHead",
    "BertPooler",
    "BertSequenceClassificationHead",
    "NonLinear",
    "bert_embedding_config",
    "bert_layer_norm_epsilon",
    "bert_lm_head_config",
    "bert_model_config",
    "bert_transformer_config",
]


class BertPooler(BaseLayer):
    """Pools [..., seq_len, dim] to [..., dim]: the first token through linear and tanh."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BertPooler."""

        input_dim: Required[int] = REQUIRED  # Hidden dim.
        # The projection (input_dim -> input_dim).
        linear: InstantiableConfig = Linear.default_config()
        # Dropout before and after the projection.
        dropout: InstantiableConfig = Dropout.default_config()
        # The activation after the projection (a `layers.get_activation_fn` name).
        activation: str = "jnp.tanh"

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("linear", cfg.linear.set(input_dim=cfg.input_dim, output_dim=cfg.input_dim))
        self._add_child("dropout", cfg.dropout)

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns the pooled [..., dim] of `inputs` [..., seq_len, dim]."""
        x = inputs[..., 0, :]
        with child_context("dropout1", module=self.dropout):
            x = self.dropout(x)
        x = get_activation_fn(self.config.activation)(self.linear(x))
        with child_context("dropout2", module=self.dropout):
            x = self.dropout(x)
        return x


class NonLinear(BaseLayer):
    """linear -> activation -> norm: [..., input_dim] -> [..., output_dim]."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures NonLinear."""

        input_dim: Required[int] = REQUIRED  # Input feature dim.
        output_dim: Required[int] = REQUIRED  # Output feature dim.
        linear: InstantiableConfig = Linear.default_config()  # The projection.
        activation: str = "nn.gelu"  # The activation (a `layers.get_activation_fn` name).
        norm: InstantiableConfig = LayerNorm.default_config()  # The output norm.

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "linear", cfg.linear.set(input_dim=cfg.input_dim, output_dim=cfg.output_dim)
        )
        self._add_child("norm", cfg.norm.set(input_dim=cfg.output_dim))

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns norm(activation(linear(inputs)))."""
        return self.norm(get_activation_fn(self.config.activation)(self.linear(inputs)))


class BertLMHead(BaseClassificationHead):
    """The masked-LM head: logits [batch, seq_len, vocab] = inner_head(transform(h)) + bias."""

    @config_class
    class Config(BaseClassificationHead.Config):
        """Configures BertLMHead."""

        # The output layer (usually the tied token embedding's `attend`).
        inner_head: Required[InstantiableConfig] = REQUIRED
        # The transform before the output layer.
        transform: InstantiableConfig = NonLinear.default_config()
        # Targets equal to this id are not counted in the loss.
        ignored_target_id: int = -100

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if "input_dim" in cfg.inner_head:
            self._add_child("inner_head", cfg.inner_head.set(input_dim=cfg.input_dim))
        elif "dim" in cfg.inner_head:
            self._add_child("inner_head", cfg.inner_head.set(dim=cfg.input_dim))
        else:
            self._add_child("inner_head", cfg.inner_head)
        self._add_child(
            "transform", cfg.transform.set(input_dim=cfg.input_dim, output_dim=cfg.input_dim)
        )

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        # The output weights are the encoder's token embedding; the bias is the head's own.
        return dict(
            output_bias=ParameterSpec(
                shape=[self.config.num_classes],
                mesh_axes=(None,),
                initializer=constant_initializer(0.0),
            )
        )

    def forward(self, input_batch: NestedTensor) -> Tensor:
        """Returns logits [batch, seq_len, vocab_size] of `input_batch["hidden_states"]`."""
        x = self.inner_head(self.transform(input_batch["hidden_states"]))
        return x + self.parameters["output_bias"]

    def loss(
        self, *, logits: Tensor, target_labels: Tensor, soft_labels: Optional[Tensor] = None
    ) -> Tensor:
        """Cross entropy over the targets other than `ignored_target_id` (scalar)."""
        target_labels = jnp.where(target_labels == self.config.ignored_target_id, -1, target_labels)
        return super().loss(logits=logits, target_labels=target_labels, soft_labels=soft_labels)


class BertSequenceClassificationHead(BaseClassificationHead):
    """Pooler then a linear layer: logits [batch, num_classes]; num_classes=1 is regression."""

    @config_class
    class Config(BaseClassificationHead.Config):
        """Configures BertSequenceClassificationHead."""

        pooler: BertPooler.Config = BertPooler.default_config()  # The pooler.
        output: Linear.Config = Linear.default_config()  # The output projection.

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("pooler", cfg.pooler.set(input_dim=cfg.input_dim))
        self._add_child(
            "output", cfg.output.set(input_dim=cfg.input_dim, output_dim=cfg.num_classes)
        )

    def forward(self, input_batch: NestedTensor) -> Tensor:
        """Returns logits [batch, num_classes] of `input_batch["hidden_states"]`."""
        return self.output(self.pooler(input_batch["hidden_states"]))

    def loss(
        self, *, logits: Tensor, target_labels: Tensor, soft_labels: Optional[Tensor] = None
    ) -> Tensor:
        """Mean squared error for num_classes=1 (regression), else cross entropy."""
        if self.config.num_classes == 1:
            weighted = mean_squared_error(logits.squeeze(axis=-1), target_labels)
            self.add_summary("loss", weighted)
            return weighted.mean
        return super().loss(logits=logits, target_labels=target_labels, soft_labels=soft_labels)


class BertMultipleChoiceHead(BaseClassificationHead):
    """One logit per choice: hidden states [batch, num_classes, seq_len, dim] -> [batch, classes].

    The loss is the cross entropy over the choices.
    """

    @config_class
    class Config(BaseClassificationHead.Config):
        """Configures BertMultipleChoiceHead."""

        pooler: BertPooler.Config = BertPooler.default_config()  # The pooler.
        output: Linear.Config = Linear.default_config()  # The projection to one logit.

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.num_classes < 2:
            raise ValueError(
                f"{self.path()}.num_classes must be at least 2 (choices), got {cfg.num_classes}."
            )
        self._add_child("pooler", cfg.pooler.set(input_dim=cfg.input_dim))
        self._add_child("output", cfg.output.set(input_dim=cfg.input_dim, output_dim=1))

    def forward(self, input_batch: NestedTensor) -> Tensor:
        """Returns logits [batch, num_classes]."""
        return self.output(self.pooler(input_batch["hidden_states"])).squeeze(axis=-1)


class BertModel(EncoderModel):
    """BERT: an `EncoderModel` whose token embedding is shared as "shared_token_emb"."""

    Config = EncoderModel.Config

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._share_with_descendants(
            self.encoder.emb.token_emb, shared_module_name="shared_token_emb"
        )

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        # Original BERT's init: truncated normal with std 0.02 for every weight.
        cfg.param_init = DefaultInitializer.default_config().set(
            init_by_param_name={
                PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                    fan=None, distribution="truncated_normal", scale=0.02
                )
            }
        )
        # An MLM head tied to the token embedding.
        cfg.head = BertLMHead.default_config().set(
            inner_head=RedirectToSharedModule.default_config().set(
                shared_module="shared_token_emb", method_map=dict(forward="attend")
            )
        )
        return cfg


def bert_embedding_config(
    *,
    max_position_embeddings: Optional[int] = 512,
    layer_norm_epsilon: Optional[float] = None,
    type_vocab_size: Optional[int] = None,
) -> TransformerTextEmbeddings.Config:
    """BERT's embeddings: tokens plus learned positions (and types), then LayerNorm.

    Args:
        max_position_embeddings: Number of learned positions (None: no position embedding).
        layer_norm_epsilon: The norm's epsilon (None: the norm's default; `bert_model_config`
            sets it).
        type_vocab_size: Number of token types (None: no type embedding).

    Returns:
        The embedding config.
    """
    cfg = TransformerTextEmbeddings.default_config().set(
        norm=LayerNorm.default_config().set(eps=layer_norm_epsilon)
    )
    if max_position_embeddings is not None:
        cfg.pos_emb = LearnedPositionalEmbedding.default_config().set(
            shape=(max_position_embeddings,)
        )
    if type_vocab_size is not None:
        cfg.type_emb = Embedding.default_config().set(num_embeddings=type_vocab_size)
    return cfg


def bert_lm_head_config(
    *,
    vocab_size: int,
    activation: str = "nn.gelu",
    ignored_target_id: int = 0,
    layer_norm_epsilon: Optional[float] = None,
    base_cfg: Optional[BertLMHead.Config] = None,
) -> BertLMHead.Config:
    """BERT's MLM head config.

    Args:
        vocab_size: The vocabulary size (the head's num_classes).
        activation: The transform's activation.
        ignored_target_id: Targets with this id are not counted.
        layer_norm_epsilon: The transform norm's epsilon.
        base_cfg: Optional base config (cloned); default `BertLMHead.default_config()`.

    Returns:
        The head config.
    """
    base_cfg = base_cfg.clone() if base_cfg else BertLMHead.default_config()
    return base_cfg.set(
        transform=NonLinear.default_config().set(
            activation=activation, norm=LayerNorm.default_config().set(eps=layer_norm_epsilon)
        ),
        ignored_target_id=ignored_target_id,
        num_classes=vocab_size,
    )


def bert_transformer_config(
    *,
    num_layers: int = 12,
    num_heads: int = 12,
    layer_norm_epsilon: Optional[float] = None,
    base_cfg: Optional[BaseStackedTransformerLayer.Config] = None,
) -> BaseStackedTransformerLayer.Config:
    """BERT's transformer stack: post-norm layers, GELU feed-forward of 4x the hidden dim.

    Args:
        num_layers: Number of layers.
        num_heads: Attention heads per layer.
        layer_norm_epsilon: The norms' epsilon (None: `bert_layer_norm_epsilon` of the dtype).
        base_cfg: Optional base stack config (cloned); default `StackedTransformerLayer`.

    Returns:
        The stack config.
    """
    base_cfg = base_cfg.clone() if base_cfg else StackedTransformerLayer.default_config()
    if layer_norm_epsilon is None:
        layer_norm_epsilon = bert_layer_norm_epsilon(dtype=base_cfg.dtype)
    layer_cfg = TransformerLayer.default_config()
    layer_cfg.feed_forward.activation = "nn.gelu"
    layer_cfg.feed_forward.norm.eps = layer_norm_epsilon
    layer_cfg.feed_forward.hidden_dim = scaled_hidden_dim(4)
    layer_cfg.feed_forward.structure = "postnorm"
    layer_cfg.self_attention.norm.eps = layer_norm_epsilon
    layer_cfg.self_attention.attention.num_heads = num_heads
    layer_cfg.self_attention.structure = "postnorm"
    return base_cfg.set(num_layers=num_layers, layer=layer_cfg)


def bert_model_config(
    *,
    vocab_size: int,
    hidden_dim: int = 768,
    dropout_rate: float = 0.0,
    dtype: jnp.dtype = jnp.float32,
    embedding_cfg: Optional[TransformerTextEmbeddings.Config] = None,
    stack_cfg: Optional[BaseStackedTransformerLayer.Config] = None,
    head_cfg: Optional[BaseClassificationHead.Config] = None,
    encoder_cfg: Optional[Encoder.Config] = None,
    base_cfg: Optional[BertModel.Config] = None,
) -> BertModel.Config:
    """A BERT model config (BERT-base defaults); every LayerNorm's eps is set for `dtype`.

    Args:
        vocab_size: Vocabulary size.
        hidden_dim: Hidden dim.
        dropout_rate: Dropout rate (of every dropout whose rate is unset).
        dtype: The model dtype.
        embedding_cfg: Optional embeddings (default `bert_embedding_config()`).
        stack_cfg: Optional stack (default `bert_transformer_config()`).
        head_cfg: Optional head (default the tied MLM head of `bert_lm_head_config`).
        encoder_cfg: Optional encoder (default an `Encoder` of the above, pad id 0).
        base_cfg: Optional base config (cloned; default `BertModel.default_config()`).

    Returns:
        The model config.
    """
    base_cfg = base_cfg.clone() if base_cfg else BertModel.default_config()
    encoder_cfg = encoder_cfg or Encoder.default_config().set(
        dim=hidden_dim,
        vocab_size=vocab_size,
        dropout_rate=dropout_rate,
        emb=embedding_cfg or bert_embedding_config(),
        transformer=stack_cfg or bert_transformer_config(),
        pad_token_id=0,
    )
    head_cfg = head_cfg or bert_lm_head_config(base_cfg=base_cfg.head, vocab_size=vocab_size)
    base_cfg.set(
        dtype=dtype, vocab_size=vocab_size, dim=hidden_dim, encoder=encoder_cfg, head=head_cfg
    )
    set_layer_norm_eps_recursively(base_cfg, bert_layer_norm_epsilon(dtype=dtype))
    return base_cfg


def bert_layer_norm_epsilon(dtype: Optional[jnp.dtype] = None) -> float:
    """BERT's LayerNorm epsilon: 1e-12, or 1e-3 for float16.

    Args:
        dtype: The model dtype.

    Returns:
        The epsilon.
    """
    return 1e-12 if dtype != jnp.float16 else 1e-3
