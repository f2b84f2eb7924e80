"""The Diffusion Transformer (DiT): timestep and label embeddings, adaLN modulation and blocks.

A DiT block modulates each sub-layer's normalized input by a shift and scale and gates its
residual, all computed from a condition vector by `AdaptiveLayerNormModulation`:
`x + gate * f(norm(x) * (1 + scale) + shift)` ("prenorm"; "postnorm" and "hybridnorm" move the
norm after `f` or put one on both sides). Shapes: tokens `[batch, length, dim]`, conditions
`[batch, dim]` or `[batch, length, dim]`.
"""

from typing import Optional, Union

import jax
import jax.numpy as jnp

from axlearn.common.attention import MultiheadAttention, scaled_hidden_dim
from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import (
    REQUIRED,
    FunctionConfigBase,
    InstantiableConfig,
    Required,
    config_class,
)
from axlearn.common.layers import Dropout, Embedding, LayerNormStateless, Linear, get_activation_fn
from axlearn.common.module import Module, Tensor, nowrap
from axlearn.common.utils import NestedTensor

_STRUCTURES = ("prenorm", "postnorm", "hybridnorm")


def modulate(*, x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """Returns x * (1 + scale) + shift.

    Args:
        x: [batch, length, dim].
        shift: [batch, 1|length, dim].
        scale: the same shape as shift.

    Returns:
        [batch, length, dim].

    Raises:
        ValueError: If shift and scale differ in shape or the ranks differ.
    """
    if shift.shape != scale.shape or not x.ndim == shift.ndim:
        raise ValueError(
            f"modulate: shift {shift.shape} and scale {scale.shape} must have one shape, of the "
            f"rank of x {x.shape}."
        )
    return x * (1 + scale) + shift


def _check_structure(layer: BaseLayer, structure: str):
    if structure not in _STRUCTURES:
        raise NotImplementedError(
            f"{layer.path()}.structure={structure!r} is not supported: use one of {_STRUCTURES}."
        )


def _add_norms(layer: BaseLayer, norm: InstantiableConfig, structure: str, dim: int):
    _check_structure(layer, structure)
    if structure == "hybridnorm":
        layer._add_child("prenorm", norm.clone(input_dim=dim))
        layer._add_child("postnorm", norm.clone(input_dim=dim))
    else:
        layer._add_child("norm", norm.clone(input_dim=dim))


def _pre(layer: BaseLayer, structure: str, x: Tensor) -> Tensor:
    if structure == "prenorm":
        return layer.norm(x)
    if structure == "hybridnorm":
        return layer.prenorm(x)
    return x


def _post(layer: BaseLayer, structure: str, x: Tensor) -> Tensor:
    if structure == "postnorm":
        return layer.norm(x)
    if structure == "hybridnorm":
        return layer.postnorm(x)
    return x


class TimeStepEmbedding(BaseLayer):
    """Sinusoidal embedding of diffusion timesteps followed by an MLP."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures TimeStepEmbedding."""

        # The output dim.
        output_dim: Required[int] = REQUIRED
        # The sinusoid's dim.
        pos_embed_dim: int = 256
        # The first projection (pos_embed_dim -> output_dim).
        embed_proj: Linear.Config = Linear.default_config()
        # The second projection (output_dim -> output_dim).
        output_proj: Linear.Config = Linear.default_config()
        # The activation between the projections.
        activation: str = "nn.silu"
        # The longest timescale of the sinusoid.
        max_timescale: float = 10000
        # An optional norm of the output.
        output_norm: Optional[InstantiableConfig] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "embed_proj",
            cfg.embed_proj.clone(input_dim=cfg.pos_embed_dim, output_dim=cfg.output_dim),
        )
        self._add_child(
            "output_proj",
            cfg.output_proj.clone(input_dim=cfg.output_dim, output_dim=cfg.output_dim),
        )
        if cfg.output_norm is not None:
            self._add_child("output_norm", cfg.output_norm.clone(input_dim=cfg.output_dim))

    def dit_sinusoidal_positional_embeddings(self, positions: Tensor) -> Tensor:
        """Returns [cos, sin] features of the positions, in float32.

        Frequencies are exp(-log(max_timescale) * i / (pos_embed_dim // 2)); an odd
        pos_embed_dim gets a trailing zero column.

        Args:
            positions: [batch] (float).

        Returns:
            [batch, pos_embed_dim] float32.
        """
        cfg = self.config
        half = cfg.pos_embed_dim // 2
        freqs = jnp.exp(
            -jnp.log(jnp.float32(cfg.max_timescale))
            * jnp.arange(half, dtype=jnp.float32)
            / max(1, half)
        )
        angles = positions.astype(jnp.float32)[..., None] * freqs
        signal = jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)
        if cfg.pos_embed_dim % 2:
            signal = jnp.pad(signal, [(0, 0)] * (signal.ndim - 1) + [(0, 1)])
        return signal

    def forward(self, positions: Tensor) -> Tensor:
        """Embeds timesteps.

        Args:
            positions: [batch] (float).

        Returns:
            [batch, output_dim], in the positions' dtype.
        """
        cfg = self.config
        x = self.dit_sinusoidal_positional_embeddings(positions).astype(positions.dtype)
        x = self.output_proj(get_activation_fn(cfg.activation)(self.embed_proj(x)))
        if cfg.output_norm is not None:
            x = self.output_norm(x)
        return x


class LabelEmbedding(BaseLayer):
    """Class-label embedding with label dropout (an extra "no label" id) for guidance."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures LabelEmbedding."""

        # The number of classes.
        num_classes: Required[int] = REQUIRED
        # The embedding dim.
        output_dim: Required[int] = REQUIRED
        # The probability, in training, of replacing a label by the "no label" id num_classes.
        dropout_rate: Optional[float] = None
        # The table (num_classes + 1 rows when dropout_rate > 0).
        emb: Embedding.Config = Embedding.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        extra = int(bool(cfg.dropout_rate) and cfg.dropout_rate > 0)
        self._add_child(
            "emb", cfg.emb.clone(dim=cfg.output_dim, num_embeddings=cfg.num_classes + extra)
        )

    def forward(self, labels: Tensor) -> Tensor:
        """Embeds labels.

        Args:
            labels: [batch] int.

        Returns:
            [batch, output_dim].
        """
        cfg = self.config
        if self.is_training and cfg.dropout_rate:
            drop = jax.random.uniform(self.prng_key, labels.shape) < cfg.dropout_rate
            labels = jnp.where(drop, cfg.num_classes, labels)
        return self.emb(labels)


class AdaptiveLayerNormModulation(BaseLayer):
    """Computes num_outputs modulation tensors (shifts, scales, gates) from a condition."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures AdaptiveLayerNormModulation."""

        # The condition's and each output's dim.
        dim: Required[int] = REQUIRED
        # How many tensors to produce.
        num_outputs: Required[int] = REQUIRED
        # The projection dim -> num_outputs * dim.
        linear: Linear.Config = Linear.default_config()
        # The activation before the projection.
        activation: str = "nn.silu"

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "linear", cfg.linear.clone(input_dim=cfg.dim, output_dim=cfg.num_outputs * cfg.dim)
        )

    def forward(self, input: Tensor) -> list[Tensor]:  # pylint: disable=redefined-builtin
        """Computes the modulation tensors.

        Args:
            input: [batch, dim] or [batch, length, dim].

        Returns:
            num_outputs tensors of [batch, 1|length, dim].

        Raises:
            ValueError: If the input is not rank 2 or 3.
        """
        cfg = self.config
        if input.ndim not in (2, 3):
            raise ValueError(
                f"{self.path()}: the input must be rank 2 or 3, but got the {input.shape} tensor."
            )
        out = self.linear(get_activation_fn(cfg.activation)(input))
        if out.ndim == 2:
            out = out[:, None, :]
        return jnp.split(out, cfg.num_outputs, axis=-1)


class DiTFeedForwardLayer(BaseLayer):
    """The modulated, gated feed-forward sub-layer of a DiT block."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures DiTFeedForwardLayer."""

        # Token dim.
        input_dim: Required[int] = REQUIRED
        # The hidden dim: an int or a function of input_dim (default 4x).
        hidden_dim: Union[int, FunctionConfigBase] = scaled_hidden_dim(scale=4)
        # The first projection.
        linear1: InstantiableConfig = Linear.default_config().set(
            param_partition_spec=[None, "model"]
        )
        # The second projection.
        linear2: InstantiableConfig = Linear.default_config().set(
            param_partition_spec=["model", None]
        )
        # The (stateless, parameter-free) norm.
        norm: InstantiableConfig = LayerNormStateless.default_config()
        # The activation.
        activation: Union[str, tuple[str, str]] = "nn.gelu"
        # Dropout after the activation.
        dropout1: InstantiableConfig = Dropout.default_config()
        # Dropout before the gate.
        dropout2: InstantiableConfig = Dropout.default_config()
        # "prenorm", "postnorm" or "hybridnorm".
        structure: str = "prenorm"

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        hidden = cfg.hidden_dim
        if not isinstance(hidden, int):
            hidden = hidden.set(input_dim=cfg.input_dim).instantiate()
        _add_norms(self, cfg.norm, cfg.structure, cfg.input_dim)
        self._add_child("linear1", cfg.linear1.clone(input_dim=cfg.input_dim, output_dim=hidden))
        self._add_child("linear2", cfg.linear2.clone(input_dim=hidden, output_dim=cfg.input_dim))
        self._add_child("dropout1", cfg.dropout1)
        self._add_child("dropout2", cfg.dropout2)

    # pylint: disable-next=redefined-builtin
    def forward(self, *, input: Tensor, shift: Tensor, scale: Tensor, gate: Tensor) -> Tensor:
        """Applies the sub-layer.

        Args:
            input: [batch, length, input_dim].
            shift: [batch, 1|length, input_dim].
            scale: as shift.
            gate: as shift.

        Returns:
            [batch, length, input_dim].
        """
        cfg = self.config
        if gate.shape != shift.shape:
            raise ValueError(
                f"{self.path()}: gate {gate.shape} and shift {shift.shape} must have one shape."
            )
        x = modulate(x=_pre(self, cfg.structure, input), shift=shift, scale=scale)
        x = self._remat_name(self.linear1(x), "linear1_0")
        x = self.dropout1(get_activation_fn(cfg.activation)(x))
        x = self._remat_name(self.linear2(x), "linear2")
        x = self.dropout2(_post(self, cfg.structure, x))
        return input + x * gate


class DiTAttentionLayer(BaseLayer):
    """The modulated, gated self-attention sub-layer of a DiT block."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures DiTAttentionLayer."""

        # Query (token) dim.
        target_dim: Required[int] = REQUIRED
        # Key/value dim (must equal target_dim: self-attention).
        source_dim: Required[int] = REQUIRED
        # The (stateless) norm.
        norm: LayerNormStateless.Config = LayerNormStateless.default_config()
        # The attention.
        attention: InstantiableConfig = MultiheadAttention.default_config()
        # "prenorm", "postnorm" or "hybridnorm".
        structure: str = "prenorm"

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.target_dim != cfg.source_dim:
            raise ValueError(
                f"{self.path()}: target dim ({cfg.target_dim}) should match source dim "
                f"({cfg.source_dim})."
            )
        _add_norms(self, cfg.norm, cfg.structure, cfg.target_dim)
        self._add_child(
            "attention",
            cfg.attention.clone(
                query_dim=cfg.target_dim,
                key_dim=cfg.source_dim,
                value_dim=cfg.source_dim,
                output_dim=cfg.target_dim,
            ),
        )

    def _modulated(self, x, shift, scale):
        if (shift is None) != (scale is None):
            raise ValueError(f"{self.path()}: shift and scale must be both provided or both None.")
        x = _pre(self, self.config.structure, x)
        if shift is not None:
            x = modulate(x=x, shift=shift, scale=scale)
        return x

    def _residual(self, inputs, x, gate):
        x = _post(self, self.config.structure, x)
        if gate is not None:
            x = x * gate
        return inputs + x

    def forward(
        self,
        *,
        input: Tensor,  # pylint: disable=redefined-builtin
        shift: Optional[Tensor] = None,
        scale: Optional[Tensor] = None,
        gate: Optional[Tensor] = None,
        attention_logit_biases: Optional[Tensor] = None,
        segment_ids: Optional[Tensor] = None,
        query_positions: Optional[Tensor] = None,
    ) -> Tensor:
        """Applies the sub-layer.

        Args:
            input: [batch, length, target_dim].
            shift: Optional [batch, 1|length, target_dim] (with scale).
            scale: Optional, as shift (with shift).
            gate: Optional, as shift.
            attention_logit_biases: Optional [batch, length, length] added to the logits.
            segment_ids: Optional [batch, length] int; tokens attend within their segment.
            query_positions: Optional [batch, length] positions of the queries.

        Returns:
            [batch, length, target_dim].

        Raises:
            ValueError: If only one of shift and scale is given.
        """
        x = self._modulated(input, shift, scale)
        x = self.attention(
            query=x,
            attention_logit_biases=attention_logit_biases,
            segment_ids=segment_ids,
            query_positions=query_positions,
        ).data
        return self._residual(input, x, gate)

    @nowrap
    def init_states(self, *, batch_size: int, max_len: int, dtype: jnp.dtype) -> NestedTensor:
        """Returns the decoding cache: {"attention": the attention's cache}.

        Args:
            batch_size: Cache batch size.
            max_len: Cache length.
            dtype: Cache dtype.

        Returns:
            The cache.
        """
        return dict(
            attention=self.attention.init_states(
                batch_size=batch_size, max_len=max_len, dtype=dtype
            )
        )

    def extend_step(
        self,
        cached_states: NestedTensor,
        target: Tensor,
        *,
        shift: Optional[Tensor] = None,
        scale: Optional[Tensor] = None,
        gate: Optional[Tensor] = None,
    ) -> tuple[NestedTensor, Tensor]:
        """Applies the sub-layer to the next tokens, attending to the cache (causal masks).

        Args:
            cached_states: From init_states or a previous step.
            target: [batch, step_length, target_dim].
            shift: Optional [batch, 1|step_length, target_dim].
            scale: Optional, as shift.
            gate: Optional, as shift.

        Returns:
            (the updated cache, [batch, step_length, target_dim]).
        """
        x = self._modulated(target, shift, scale)
        states, out = self.attention.extend_step(cached_states["attention"], x)
        return dict(attention=states), self._residual(target, out.data, gate)


class DiTBlock(BaseLayer):
    """A DiT block: adaLN-modulated attention, then feed-forward."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures DiTBlock."""

        # Token dim.
        input_dim: Required[int] = REQUIRED
        # The attention sub-layer.
        attention: DiTAttentionLayer.Config = DiTAttentionLayer.default_config()
        # The feed-forward sub-layer.
        feed_forward: DiTFeedForwardLayer.Config = DiTFeedForwardLayer.default_config()
        # The modulation: (shift, scale, gate) for attention, then for feed-forward.
        adaln: AdaptiveLayerNormModulation.Config = (
            AdaptiveLayerNormModulation.default_config().set(num_outputs=6)
        )

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "attention", cfg.attention.clone(target_dim=cfg.input_dim, source_dim=cfg.input_dim)
        )
        self._add_child("feed_forward", cfg.feed_forward.clone(input_dim=cfg.input_dim))
        self._add_child("adaln", cfg.adaln.clone(dim=cfg.input_dim))

    def forward(
        self,
        *,
        input: Tensor,  # pylint: disable=redefined-builtin
        condition: Tensor,
        segment_ids: Optional[Tensor] = None,
    ) -> Tensor:
        """Applies the block.

        Args:
            input: [batch, length, input_dim].
            condition: [batch, input_dim] or [batch, length, input_dim].
            segment_ids: Optional [batch, length] int for segment-aware attention.

        Returns:
            [batch, length, input_dim].
        """
        s1, c1, g1, s2, c2, g2 = self.adaln(condition)
        x = self.attention(input=input, shift=s1, scale=c1, gate=g1, segment_ids=segment_ids)
        return self.feed_forward(input=x, shift=s2, scale=c2, gate=g2)

    @nowrap
    def init_states(self, *, batch_size: int, max_len: int, dtype: jnp.dtype) -> NestedTensor:
        """Returns the decoding cache: {"attention": the attention layer's cache}.

        Args:
            batch_size: Cache batch size.
            max_len: Cache length.
            dtype: Cache dtype.

        Returns:
            The cache.
        """
        return dict(
            attention=self.attention.init_states(
                batch_size=batch_size, max_len=max_len, dtype=dtype
            )
        )

    def extend_step(
        self, cached_states: NestedTensor, target: Tensor, *, condition: Tensor
    ) -> tuple[NestedTensor, Tensor]:
        """Applies the block to the next tokens.

        Args:
            cached_states: From init_states or a previous step.
            target: [batch, step_length, input_dim].
            condition: [batch, input_dim] or [batch, step_length, input_dim].

        Returns:
            (the updated cache, [batch, step_length, input_dim]).
        """
        s1, c1, g1, s2, c2, g2 = self.adaln(condition)
        states, x = self.attention.extend_step(
            cached_states["attention"], target, shift=s1, scale=c1, gate=g1
        )
        return dict(attention=states), self.feed_forward(input=x, shift=s2, scale=c2, gate=g2)


class DiTFinalLayer(BaseLayer):
    """The DiT output layer: linear(modulate(norm(x)))."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures DiTFinalLayer."""

        # Token dim.
        input_dim: Required[int] = REQUIRED
        # Output dim (patch_size**2 * channels).
        output_dim: Required[int] = REQUIRED
        # The (stateless) norm.
        norm: LayerNormStateless.Config = LayerNormStateless.default_config()
        # The output projection.
        linear: Linear.Config = Linear.default_config()
        # The modulation: (shift, scale).
        adaln: AdaptiveLayerNormModulation.Config = (
            AdaptiveLayerNormModulation.default_config().set(num_outputs=2)
        )

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("norm", cfg.norm.clone(input_dim=cfg.input_dim))
        self._add_child("adaln", cfg.adaln.clone(dim=cfg.input_dim))
        self._add_child(
            "linear", cfg.linear.clone(input_dim=cfg.input_dim, output_dim=cfg.output_dim)
        )

    # pylint: disable-next=redefined-builtin
    def forward(self, *, input: Tensor, condition: Tensor) -> Tensor:
        """Applies the layer.

        Args:
            input: [batch, length, input_dim].
            condition: [batch, input_dim] or [batch, length, input_dim].

        Returns:
            [batch, length, output_dim].
        """
        shift, scale = self.adaln(input=condition)
        return self.linear(modulate(x=self.norm(input), shift=shift, scale=scale))
