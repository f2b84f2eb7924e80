"""Text embeddings for transformer language models."""

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple, Optional

import jax.numpy as jnp

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.layers import Dropout, Embedding
from axlearn.common.module import Module
from axlearn.common.param_init import (
    PARAM_REGEXP_WEIGHT,
    DefaultInitializer,
    FanAxes,
    WeightInitializer,
)
from axlearn.common.utils import Tensor


class LearnedPositionalEmbedding(BaseLayer):
    """A learned table of positional embeddings (GPT-2's `wpe`), looked up by position.

    AXLearn defines this layer in `axlearn.common.attention`; here it lives next to
    `TransformerTextEmbeddings`, whose `pos_emb` it usually is. Parameter `weight` has shape
    [1, *shape, dim] (AXLearn's layout); the default initializer is N(0, 1/dim).
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures LearnedPositionalEmbedding."""

        dim: Required[int] = REQUIRED  # Embedding dim.
        shape: Required[Sequence[int]] = REQUIRED  # The position grid, e.g. (max_seq_len,).

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.param_partition_spec = (None, None, "model")
        cfg.param_init = DefaultInitializer.default_config().set(
            init_by_param_name={
                PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                    fan="fan_out", distribution="normal"
                )
            }
        )
        return cfg

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        shape = [1, *cfg.shape, cfg.dim]
        mesh_axes = cfg.param_partition_spec
        if mesh_axes is not None and len(mesh_axes) != len(shape):
            # A multi-axis position grid: shard only the embedding dim as configured.
            mesh_axes = (None,) * (len(shape) - 1) + (mesh_axes[-1],)
        return dict(weight=ParameterSpec(shape=shape, mesh_axes=mesh_axes))

    def _compute_fan_axes(self, name: str, parameter_spec: ParameterSpec) -> Optional[FanAxes]:
        if name != "weight":
            return super()._compute_fan_axes(name, parameter_spec)
        ndim = len(parameter_spec.shape)
        in_axis = tuple(range(1, ndim - 1))
        return FanAxes(
            batch_axis=0, in_axis=in_axis[0] if len(in_axis) == 1 else in_axis, out_axis=ndim - 1
        )

    def embeddings(self) -> Tensor:
        """Returns the table, [*shape, dim]."""
        return self.parameters["weight"][0]

    def forward(self, positions: Tensor) -> Tensor:
        """Looks positions up.

        Args:
            positions: Int tensor of any shape [...] with values in [0, shape[0]).

        Returns:
            Embeddings [..., *shape[1:], dim].
        """
        return self.embeddings()[positions]


class TransformerTextEmbeddings(BaseLayer):
    """Token embeddings, plus optional token-type and positional embeddings, norm and dropout.

    `attend(x)` computes output logits with the (tied) token embedding table.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures TransformerTextEmbeddings."""

        dim: Required[int] = REQUIRED  # Output embedding dim.
        vocab_size: Required[int] = REQUIRED  # Vocabulary size.
        token_emb: InstantiableConfig = Embedding.default_config()  # Token embedding lookup.
        type_emb: Optional[InstantiableConfig] = None  # Optional token-type embedding lookup.
        pos_emb: Optional[InstantiableConfig] = None  # Optional positional embedding lookup.
        norm: Optional[InstantiableConfig] = None  # Optional normalization of the embeddings.
        dropout: InstantiableConfig = Dropout.default_config()  # Dropout on the embeddings.
        # If positive, `attend` logits are capped as cap * tanh(logits / cap).
        soft_cap_logits: Optional[float] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "token_emb", cfg.token_emb.clone(dim=cfg.dim, num_embeddings=cfg.vocab_size)
        )
        if cfg.type_emb is not None:
            self._add_child("type_emb", cfg.type_emb.clone(dim=cfg.dim))
        if cfg.pos_emb is not None:
            self._add_child("pos_emb", cfg.pos_emb.clone(dim=cfg.dim))
        if cfg.norm is not None:
            self._add_child("norm", cfg.norm.clone(input_dim=cfg.dim))
        self._add_child("dropout", cfg.dropout)

    def forward(
        self,
        inputs: Optional[Tensor] = None,
        *,
        token_type_ids: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
        input_batch: Optional[dict[str, Tensor]] = None,
    ) -> Tensor:
        """Embeds token ids.

        Args:
            inputs: Int tensor [batch, seq_len] of token ids.
            token_type_ids: Optional int tensor [batch, seq_len] (used if `type_emb` is set).
            positions: Optional int tensor [batch, seq_len] (used if `pos_emb` is set); None
                means arange(seq_len).
            input_batch: AXLearn's calling form, instead of the arguments above: a dict with
                "inputs" and optionally "token_type_ids" and "positions".

        Returns:
            Float tensor [batch, seq_len, dim].

        Raises:
            ValueError: If both or neither of `inputs` and `input_batch` are given.
        """
        if (inputs is None) == (input_batch is None):
            raise ValueError(
                f"{self.path()}: pass either inputs or input_batch=dict(inputs=...), not "
                f"{'both' if inputs is not None else 'neither'}."
            )
        if input_batch is not None:
            inputs = input_batch["inputs"]
            token_type_ids = input_batch.get("token_type_ids", token_type_ids)
            positions = input_batch.get("positions", positions)
        x = self.token_emb(inputs)
        if "type_emb" in self.children:
            if token_type_ids is None:
                token_type_ids = jnp.zeros_like(inputs)
            x = x + self.type_emb(token_type_ids)
        if "pos_emb" in self.children:
            if positions is None:
                positions = jnp.arange(inputs.shape[1])[None]
            x = x + self.pos_emb(positions)
        if "norm" in self.children:
            x = self.norm(x)
        return self.dropout(x)

    def attend(self, x: Tensor) -> Tensor:
        """Returns logits [..., vocab_size] of hidden states `x` [..., dim] (tied head)."""
        cap = self.config.soft_cap_logits
        logits = self.token_emb.attend(x)
        if cap is not None and cap > 0:
            logits = cap * jnp.tanh(logits / cap)
        return logits


@dataclasses.dataclass(frozen=True)
class ModalityVocabInfo:
    """Where a modality's tokens live in a shared vocabulary.

    Placeholder ids in [placeholder_start, placeholder_end) mark where the modality's embeddings
    go in the input; its own ids are [vocab_start, vocab_end).
    """

    # The modality's name (e.g. "image").
    modality_name: str
    # First placeholder id.
    placeholder_start: int
    # One past the last placeholder id.
    placeholder_end: int
    # First id of the modality's vocabulary.
    vocab_start: int
    # One past the last id of the modality's vocabulary.
    vocab_end: int
    # Whether `attend` produces logits over the modality's vocabulary.
    generate_logits: bool = False

    def __post_init__(self):
        if not (
            self.placeholder_start <= self.placeholder_end and self.vocab_start <= self.vocab_end
        ):
            raise ValueError(f"ModalityVocabInfo ranges must be start <= end: {self}")

    @property
    def vocab_size(self) -> int:
        """vocab_end - vocab_start."""
        return self.vocab_end - self.vocab_start


class ModalityEmbedding(BaseLayer):
    """Base class of a modality's embedding layer (e.g. image patches into a text decoder).

    Subclasses implement `forward(input_batch) -> Output` (the modality's ids and embeddings),
    `attend(x)` (logits over the modality's vocabulary, or None) and
    `lookup_modality_embeddings(input_ids, accum)` (adds the embeddings of the modality's ids in
    `input_ids` to `accum`).
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures ModalityEmbedding."""

        # Embedding dim.
        dim: Required[int] = REQUIRED
        # The modality's placeholder and vocabulary ranges.
        modality_vocab_info: Required[ModalityVocabInfo] = REQUIRED

    class Output(NamedTuple):
        """ids: [batch, length] ids; embeddings: [batch, length, dim]; paddings: optional
        [batch, length] (1 = padding); batch_idx: optional example index of each row."""

        ids: Tensor
        embeddings: Tensor
        paddings: Optional[Tensor] = None
        batch_idx: Optional[Tensor] = None

    def forward(self, input_batch: dict) -> Output:
        """Returns the modality's ids and embeddings for `input_batch`."""
        raise NotImplementedError(type(self))

    def attend(self, x: Tensor) -> Optional[Tensor]:
        """Returns logits [..., vocab_size] for hidden states x [..., dim], or None."""
        raise NotImplementedError(type(self))

    def lookup_modality_embeddings(self, input_ids: Tensor, accum: Tensor) -> Tensor:
        """Returns `accum` plus the embeddings of the modality's ids in `input_ids`."""
        raise NotImplementedError(type(self))
