"""Transformer building blocks: attention layer, feed-forward layer and the transformer layer.

Public names are re-exported by `axlearn.common.attention`.
"""

import enum
from collections.abc import Sequence
from typing import NamedTuple, Optional, Union

import jax
import jax.numpy as jnp

from axlearn.common.attention.cache_kwargs import accepts_empty_cache_kwargs
from axlearn.common.attention.multihead import MultiheadAttention
from axlearn.common.attention.residual_gate import (
    check_residual_gate,
    gated_residual,
    residual_gate_parameter_specs,
)
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import (
    REQUIRED,
    FunctionConfigBase,
    InstantiableConfig,
    Required,
    config_class,
    config_for_function,
)
from axlearn.common.kv_cache.base_kv_cache import KVState
from axlearn.common.layers import Dropout, LayerNorm, Linear, StochasticDepth, get_activation_fn
from axlearn.common.module import Module
from axlearn.common.utils import NestedTensor, Tensor

_STRUCTURES = ("prenorm", "postnorm", "hybridnorm", "v2")


class NormPosition(enum.Enum):
    """Where a norm sits in a `structure="v2"` layer (keys of its `norm` dict).

    IN_NORM: on the layer input, before attention / the feed-forward network.
    RES_NORM: on the residual branch's output, before dropout and the residual add.
    OUT_NORM: after the residual add.
    So {IN_NORM} is prenorm, {OUT_NORM} postnorm, {IN_NORM, RES_NORM} hybridnorm.
    """

    IN_NORM = "in_norm"
    RES_NORM = "res_norm"
    OUT_NORM = "out_norm"


def _add_structure_norms(layer: BaseLayer, *, structure: str, norm, dim: int) -> None:
    """Adds the norm children a residual layer of `structure` needs.

    "prenorm"/"postnorm": "norm"; "hybridnorm": "prenorm" and "postnorm"; "v2": the
    `NormPosition` children (`_add_v2_norms`); "nonorm": none.

    Args:
        layer: The layer to add the children to.
        structure: "prenorm", "postnorm", "hybridnorm", "v2" or "nonorm".
        norm: The norm config (a dict {NormPosition: config} for "v2").
        dim: The norms' input_dim.

    Raises:
        NotImplementedError: For any other structure.
    """
    # pylint: disable=protected-access
    if structure in ("prenorm", "postnorm"):
        layer._add_child("norm", norm.clone(input_dim=dim))
    elif structure == "hybridnorm":
        layer._add_child("prenorm", norm.clone(input_dim=dim))
        layer._add_child("postnorm", norm.clone(input_dim=dim))
    elif structure == "v2":
        _add_v2_norms(layer, norm, dim)
    elif structure != "nonorm":
        raise NotImplementedError(f"{layer.path()}: unsupported structure {structure}")


def _add_v2_norms(layer: BaseLayer, norm, dim: int) -> None:
    """Adds the children "in_norm"/"res_norm"/"out_norm" of a structure="v2" layer."""
    if not isinstance(norm, dict):
        raise ValueError(
            f"{layer.path()}: structure='v2' needs norm as a dict {{NormPosition: norm config}}, "
            f"got {type(norm).__name__}"
        )
    for position, norm_cfg in norm.items():
        try:
            position = NormPosition(position.value if isinstance(position, enum.Enum) else position)
        except ValueError as e:
            raise ValueError(
                f"{layer.path()}: norm key {position!r} must be a NormPosition "
                f"({[p.name for p in NormPosition]})"
            ) from e
        layer._add_child(position.value, norm_cfg.clone(input_dim=dim))  # pylint: disable=protected-access


def _maybe_norm(layer: BaseLayer, position: NormPosition, x: Tensor) -> Tensor:
    """Applies the v2 norm at `position` if the layer has one."""
    if position.value in layer.children:
        return layer.children[position.value](x)
    return x


class TransformerAttentionLayer(BaseLayer):
    """Attention with normalization, dropout, stochastic depth and a residual connection.

    structure:
    * prenorm: y = x + drop(attention(norm(x)))
    * postnorm: y = norm(x + drop(attention(x)))
    * hybridnorm: y = x + drop(postnorm(attention(prenorm(x))))
    * v2: y = out_norm(x + drop(res_norm(attention(in_norm(x))))), each norm optional
      (`norm` is a dict {NormPosition: norm config}; children in_norm/res_norm/out_norm); with
      `residual_gate_init`, the sum is the learned gate of `axlearn.common.attention.residual_gate`.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures TransformerAttentionLayer."""

        target_dim: Required[int] = REQUIRED  # Target (query) feature dim.
        source_dim: Required[int] = REQUIRED  # Source (key/value) feature dim.
        # The normalization layer; with structure="v2", a dict {NormPosition: norm config}.
        norm: Union[InstantiableConfig, dict] = LayerNorm.default_config()
        attention: InstantiableConfig = MultiheadAttention.default_config()  # The attention.
        dropout: InstantiableConfig = Dropout.default_config()  # Dropout on the attention output.
        # Stochastic depth on the residual branch.
        stochastic_depth: InstantiableConfig = StochasticDepth.default_config()
        # "prenorm", "postnorm", "hybridnorm" or "v2" (see the class docstring).
        structure: str = "prenorm"
        # structure="v2" only: the initial value of the learned residual gate parameter
        # `residual_gate_theta` (see `axlearn.common.attention.residual_gate`); None: no gate.
        residual_gate_init: Optional[float] = None

    class Output(NamedTuple):
        """data: [batch, target_length, target_dim]; probs and kv_state if requested."""

        data: Tensor
        probs: Optional[Tensor] = None
        kv_state: Optional[KVState] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.structure not in _STRUCTURES:
            raise NotImplementedError(f"{self.path()}: unsupported structure {cfg.structure}")
        _add_structure_norms(self, structure=cfg.structure, norm=cfg.norm, dim=cfg.target_dim)
        check_residual_gate(self, structure=cfg.structure, init=cfg.residual_gate_init)
        self._add_child(
            "attention",
            cfg.attention.clone(
                query_dim=cfg.target_dim,
                key_dim=cfg.source_dim,
                value_dim=cfg.source_dim,
                output_dim=cfg.target_dim,
            ),
        )
        self._add_child("dropout", cfg.dropout)
        self._add_child("stochastic_depth", cfg.stochastic_depth)

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        return residual_gate_parameter_specs(self.config.residual_gate_init)

    def _residual(self, target: Tensor, attend) -> tuple[object, Output]:
        """Runs `attend(normed_target) -> (state, attention Output)` inside the structure."""
        structure = self.config.structure
        if structure == "prenorm":
            state, out = attend(self.norm(target))
            data = target + self.stochastic_depth(self.dropout(out.data))
        elif structure == "postnorm":
            state, out = attend(target)
            data = self.norm(target + self.stochastic_depth(self.dropout(out.data)))
        elif structure == "v2":
            state, out = attend(_maybe_norm(self, NormPosition.IN_NORM, target))
            residual = _maybe_norm(self, NormPosition.RES_NORM, out.data)
            residual = self.stochastic_depth(self.dropout(residual))
            data = gated_residual(self, target, residual)
            data = _maybe_norm(self, NormPosition.OUT_NORM, data)
        else:
            state, out = attend(self.prenorm(target))
            data = target + self.stochastic_depth(self.dropout(self.postnorm(out.data)))
        return state, self.Output(data=data, probs=out.probs, kv_state=out.kv_state)

    def forward(
        self,
        *,
        target: Tensor,
        source: Optional[Tensor] = None,
        kv_state: Optional[KVState] = None,
        attention_logit_biases: Optional[Tensor] = None,
        segment_ids: Optional[Tensor] = None,
        target_positions: Optional[Tensor] = None,
        return_aux: Optional[set[str]] = None,
    ) -> Output:
        """Attends from `target` to `source` (None: self-attention on the normalized target).

        Args:
            target: [batch, target_length, target_dim].
            source: Optional [batch, source_length, source_dim] (cross-attention).
            kv_state: Optional external keys/values (see `MultiheadAttention.forward`).
            attention_logit_biases: Optional biases (see `axlearn.common.attention_bias`).
            segment_ids: Optional [batch, target_length] segment ids (self-attention).
            target_positions: Optional [batch, target_length] positions (e.g. for RoPE).
            return_aux: Optional set; "probs" requests attention probabilities, "kv_state" the
                attended keys/values.

        Returns:
            An Output.
        """

        def attend(x):
            out = self.attention(
                x,
                key=source,
                value=source,
                kv_state=kv_state,
                attention_logit_biases=attention_logit_biases,
                segment_ids=segment_ids,
                query_positions=target_positions,
                return_aux=return_aux,
            )
            return None, out

        return self._residual(target, attend)[1]

    def init_states(
        self,
        *,
        time_step: Optional[Tensor],
        target: Tensor,
        kv_state: Optional[KVState] = None,
        attention_logit_biases: Optional[Tensor] = None,
        return_aux: Optional[set[str]] = None,
    ) -> tuple[NestedTensor, Optional[Output]]:
        """Creates the self-attention cache (see `MultiheadAttention.init_states`)."""
        if time_step is None:
            state, _ = self.attention.init_states(time_step=None, query=target, kv_state=kv_state)
            return dict(attention=state), None

        def attend(x):
            return self.attention.init_states(
                time_step=time_step,
                query=x,
                kv_state=kv_state,
                attention_logit_biases=attention_logit_biases,
                return_aux=return_aux,
            )

        state, output = self._residual(target, attend)
        return dict(attention=state), output

    def extend_step(
        self,
        cached_states: NestedTensor,
        target: Tensor,
        *,
        kv_state: Optional[KVState] = None,
        attention_logit_biases: Optional[Tensor] = None,
        segment_ids: Optional[Tensor] = None,
        is_prefill: bool = False,
        return_aux: Optional[set[str]] = None,
    ) -> tuple[NestedTensor, Output]:
        """Decoding steps or a prefill (see `MultiheadAttention.extend_step`)."""

        def attend(x):
            return self.attention.extend_step(
                cached_states["attention"],
                x,
                kv_state=kv_state,
                attention_logit_biases=attention_logit_biases,
                segment_ids=segment_ids,
                is_prefill=is_prefill,
                return_aux=return_aux,
            )

        state, output = self._residual(target, attend)
        return dict(attention=state), output


def scaled_hidden_dim(scale: float = 4) -> FunctionConfigBase:
    """A `hidden_dim` config for TransformerFeedForwardLayer: round(input_dim * scale).

    Args:
        scale: The multiplier.

    Returns:
        A function config taking `input_dim`.
    """

    def scale_fn(input_dim: int, *, scale: float) -> int:
        return round(input_dim * scale)

    return config_for_function(scale_fn).set(scale=scale)


# Activations whose inputs below these thresholds have (near-)zero gradients.
_DEAD_NEURON_THRESHOLDS = {
    "nn.relu": 0.0,
    "squared_relu": 0.0,
    "nn.silu": -10.0,
    "nn.sigmoid": -10.0,
    "quick_gelu": -4.0,
    "exact_gelu": -4.0,
    "nn.gelu": -4.0,
}


class TransformerFeedForwardLayer(BaseLayer):
    """The feed-forward block: linear1 -> activation -> linear2 with a residual connection.

    With `activation` a pair (a, b) it is a gated unit: linear2(a(linear1_0(x)) * b(linear1_1(x)))
    (e.g. ("nn.silu", "linear") is SwiGLU).

    structure: prenorm y = x + w * ffn(norm(x)); postnorm y = norm(x + w * ffn(x));
    hybridnorm y = x + w * postnorm(ffn(prenorm(x))); nonorm y = w * ffn(x) (no residual);
    v2 y = out_norm(x + w * res_norm(ffn(in_norm(x)))), each norm optional (`norm` a dict
    {NormPosition: norm config}); with `residual_gate_init`, the sum is the learned gate of
    `axlearn.common.attention.residual_gate`.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures TransformerFeedForwardLayer."""

        input_dim: Required[int] = REQUIRED  # Input (and output) feature dim.
        # Hidden dim: an int or a function config of input_dim (e.g. scaled_hidden_dim(4)).
        hidden_dim: Required[Union[int, FunctionConfigBase]] = REQUIRED
        # The first linear layer (one per activation for gated units).
        linear1: InstantiableConfig = Linear.default_config().set(
            param_partition_spec=[None, "model"]
        )
        # The second linear layer.
        linear2: InstantiableConfig = Linear.default_config().set(
            param_partition_spec=["model", None]
        )
        # The normalization layer; with structure="v2", a dict {NormPosition: norm config}.
        norm: Union[InstantiableConfig, dict] = LayerNorm.default_config()
        # An activation name, or a pair of names for a gated linear unit.
        activation: Union[str, tuple[str, str]] = "nn.relu"
        dropout: InstantiableConfig = Dropout.default_config()  # Dropout config.
        # Stochastic depth on the residual branch.
        stochastic_depth: InstantiableConfig = StochasticDepth.default_config()
        # "prenorm", "postnorm", "hybridnorm", "nonorm" or "v2" (see the class docstring).
        structure: str = "prenorm"
        # The weight w of the residual branch.
        residual_weight: float = 1.0
        # structure="v2" only: the initial value of the learned residual gate parameter
        # `residual_gate_theta` (see `axlearn.common.attention.residual_gate`); None: no gate.
        residual_gate_init: Optional[float] = None
        # If True, adds summaries "dead_neurons/{activation}": hidden units whose pre-activation
        # stays in the activation's dead zone across the whole batch.
        add_dead_neuron_summary: Optional[bool] = None
        # Adds "rms_norm/{name}" summaries for these values: "inputs", "linear1_outputs",
        # "linear2_outputs".
        add_value_rms_norm_summary: Sequence[str] = []

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        _add_structure_norms(self, structure=cfg.structure, norm=cfg.norm, dim=cfg.input_dim)
        check_residual_gate(self, structure=cfg.structure, init=cfg.residual_gate_init)
        if isinstance(cfg.hidden_dim, int):
            hidden_dim = cfg.hidden_dim
        else:
            hidden_dim = cfg.hidden_dim.clone(input_dim=cfg.input_dim).instantiate()
        if isinstance(cfg.activation, (tuple, list)):
            if len(cfg.activation) != 2:
                raise ValueError(f"{self.path()}: gated activation needs 2 names: {cfg.activation}")
            for i in range(2):
                self._add_child(
                    f"linear1_{i}",
                    cfg.linear1.clone(input_dim=cfg.input_dim, output_dim=hidden_dim),
                )
        else:
            self._add_child(
                "linear1", cfg.linear1.clone(input_dim=cfg.input_dim, output_dim=hidden_dim)
            )
        self._add_child(
            "linear2", cfg.linear2.clone(input_dim=hidden_dim, output_dim=cfg.input_dim)
        )
        if cfg.structure == "postnorm":
            self._add_child("dropout", cfg.dropout)
        else:
            self._add_child("dropout1", cfg.dropout)
            self._add_child("dropout2", cfg.dropout)
        self._add_child("stochastic_depth", cfg.stochastic_depth)
        for value in cfg.add_value_rms_norm_summary:
            if value not in ("inputs", "linear1_outputs", "linear2_outputs"):
                raise NotImplementedError(f"add_value_rms_norm_summary: {value}")

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        return residual_gate_parameter_specs(self.config.residual_gate_init)

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns the layer output, same shape as `inputs` [..., input_dim]."""
        cfg = self.config
        self._rms_summary(cfg, "inputs", inputs)
        x = inputs
        if cfg.structure == "prenorm":
            x = self.norm(x)
        elif cfg.structure == "hybridnorm":
            x = self.prenorm(x)
        elif cfg.structure == "v2":
            x = _maybe_norm(self, NormPosition.IN_NORM, x)
        x = self._linear1_activation(cfg, x)
        self._rms_summary(cfg, "linear1_outputs", x)
        if cfg.structure != "postnorm":
            x = self.dropout1(x)
        x = self.linear2(x)
        self._rms_summary(cfg, "linear2_outputs", x)
        x = self._remat_name(x, "linear2")
        if cfg.structure == "hybridnorm":
            x = self.postnorm(x)
        elif cfg.structure == "v2":
            x = _maybe_norm(self, NormPosition.RES_NORM, x)
        x = self.dropout(x) if cfg.structure == "postnorm" else self.dropout2(x)
        x = self.stochastic_depth(x)
        if cfg.residual_weight != 1:
            x = x * cfg.residual_weight
        if cfg.structure == "nonorm":
            return x
        if cfg.structure == "postnorm":
            return self.norm(x + inputs)
        if cfg.structure == "v2":
            return _maybe_norm(self, NormPosition.OUT_NORM, gated_residual(self, inputs, x))
        return x + inputs

    def _linear1_activation(self, cfg, x: Tensor) -> Tensor:
        if isinstance(cfg.activation, (tuple, list)):
            outputs = []
            for i, name in enumerate(cfg.activation):
                h = self._remat_name(self.children[f"linear1_{i}"](x), f"linear1_{i}")
                outputs.append(self._activation(cfg, h, name))
            return outputs[0] * outputs[1]
        h = self._remat_name(self.linear1(x), "linear1_0")
        return self._activation(cfg, h, cfg.activation)

    def _activation(self, cfg, x: Tensor, name: str) -> Tensor:
        threshold = _DEAD_NEURON_THRESHOLDS.get(name)
        if cfg.add_dead_neuron_summary and threshold is not None:
            max_per_unit = jnp.max(x.reshape(-1, x.shape[-1]), axis=0)
            self.add_summary(f"dead_neurons/{name}", jnp.sum(max_per_unit < threshold))
        return get_activation_fn(name)(x)

    def _rms_summary(self, cfg, name: str, x: Tensor):
        if name in cfg.add_value_rms_norm_summary:
            rms = jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32))))
            self.add_summary(f"rms_norm/{name}", rms)


class BaseTransformerLayer(BaseLayer):
    """The interface of transformer layers and stacks: input_dim, Output, forward/decoding."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseTransformerLayer."""

        input_dim: Required[int] = REQUIRED  # Input (and output) feature dim.

    class Output(NamedTuple):
        """Outputs of a transformer layer (or stack).

        Fields:
            data: [batch, target_length, input_dim].
            self_attention_probs: [..., batch, num_heads, target_length, target_length] if
                "self_attention_probs" is in return_aux (stacks add a leading layer axis).
            self_attention_kv_state: The self-attention's keys/values (`KVState`) if
                "self_attention_kv_state" is in return_aux (stacks add a leading layer axis).
            cross_attention_probs: Likewise for cross-attention, if requested.
        """

        data: Tensor
        self_attention_probs: Optional[Tensor] = None
        self_attention_kv_state: Optional[KVState] = None
        cross_attention_probs: Optional[Tensor] = None


class TransformerLayer(BaseTransformerLayer):
    """A transformer layer: self-attention, optional cross-attention, then feed-forward."""

    @config_class
    class Config(BaseTransformerLayer.Config):
        """Configures TransformerLayer."""

        # The self-attention layer config.
        self_attention: InstantiableConfig = TransformerAttentionLayer.default_config()
        # Optional cross-attention layer config.
        cross_attention: Optional[InstantiableConfig] = None
        # The feed-forward layer config.
        feed_forward: InstantiableConfig = TransformerFeedForwardLayer.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "self_attention",
            cfg.self_attention.clone(target_dim=cfg.input_dim, source_dim=cfg.input_dim),
        )
        if cfg.cross_attention is not None:
            self._add_child("cross_attention", cfg.cross_attention.clone(target_dim=cfg.input_dim))
        self._add_child("feed_forward", cfg.feed_forward.clone(input_dim=cfg.input_dim))

    def _finish(
        self, self_out, cross_attention_data, cross_biases, return_aux
    ) -> BaseTransformerLayer.Output:
        """Cross-attention (if `cross_attention_data`) and feed-forward after self-attention."""
        data, self_probs = self_out.data, self_out.probs
        self_kv = (
            self_out.kv_state if return_aux and "self_attention_kv_state" in return_aux else None
        )
        cross_probs = None
        if cross_attention_data is not None:
            if "cross_attention" not in self.children:
                raise ValueError(
                    f"{self.path()}: cross_attention_data given but no cross_attention"
                )
            aux = {"probs"} if return_aux and "cross_attention_probs" in return_aux else None
            out = self.cross_attention(
                target=data,
                source=cross_attention_data,
                attention_logit_biases=cross_biases,
                return_aux=aux,
            )
            data, cross_probs = out.data, out.probs
        data = self.feed_forward(data)
        return self.Output(
            data=data,
            self_attention_probs=self_probs,
            self_attention_kv_state=self_kv,
            cross_attention_probs=cross_probs,
        )

    @staticmethod
    def _self_aux(return_aux):
        """The self-attention's return_aux for this layer's `return_aux`."""
        aux = set()
        if return_aux and "self_attention_probs" in return_aux:
            aux.add("probs")
        if return_aux and "self_attention_kv_state" in return_aux:
            aux.add("kv_state")
        return aux or None

    def forward(
        self,
        data: Tensor,
        *,
        self_attention_kv_state: Optional[KVState] = None,
        self_attention_logit_biases: Optional[Tensor] = None,
        cross_attention_data: Optional[Tensor] = None,
        cross_attention_logit_biases: Optional[Tensor] = None,
        target_segment_ids: Optional[Tensor] = None,
        target_positions: Optional[Tensor] = None,
        return_aux: Optional[set[str]] = None,
    ) -> BaseTransformerLayer.Output:
        """Computes the layer output.

        Args:
            data: [batch, target_length, input_dim].
            self_attention_kv_state: Optional external self-attention keys/values.
            self_attention_logit_biases: Optional self-attention biases.
            cross_attention_data: Optional [batch, source_length, source_dim].
            cross_attention_logit_biases: Optional cross-attention biases.
            target_segment_ids: Optional [batch, target_length] segment ids.
            target_positions: Optional [batch, target_length] positions.
            return_aux: Optional set of Output fields to populate.

        Returns:
            An Output.
        """
        out = self.self_attention(
            target=data,
            kv_state=self_attention_kv_state,
            attention_logit_biases=self_attention_logit_biases,
            segment_ids=target_segment_ids,
            target_positions=target_positions,
            return_aux=self._self_aux(return_aux),
        )
        output = self._finish(out, cross_attention_data, cross_attention_logit_biases, return_aux)
        self.add_module_output("output", output.data)
        return output

    @accepts_empty_cache_kwargs(input_name="data", dim_field="input_dim")
    def init_states(
        self,
        *,
        time_step: Optional[Tensor] = None,
        data: Union[Tensor, jax.ShapeDtypeStruct, None] = None,
        self_attention_kv_state: Optional[KVState] = None,
        self_attention_logit_biases: Optional[Tensor] = None,
        cross_attention_data: Optional[Tensor] = None,
        cross_attention_logit_biases: Optional[Tensor] = None,
        return_aux: Optional[set[str]] = None,
    ) -> tuple[NestedTensor, Optional[BaseTransformerLayer.Output]]:
        """Creates the decoding cache: empty (time_step None) or prefilled from `data`."""
        state, out = self.self_attention.init_states(
            time_step=time_step,
            target=data,
            kv_state=self_attention_kv_state,
            attention_logit_biases=self_attention_logit_biases,
            return_aux=self._self_aux(return_aux),
        )
        if out is None:
            return dict(self_attention=state), None
        output = self._finish(out, cross_attention_data, cross_attention_logit_biases, return_aux)
        return dict(self_attention=state), output

    def extend_step(
        self,
        cached_states: NestedTensor,
        data: Tensor,
        *,
        self_attention_kv_state: Optional[KVState] = None,
        self_attention_logit_biases: Optional[Tensor] = None,
        cross_attention_data: Optional[Tensor] = None,
        cross_attention_logit_biases: Optional[Tensor] = None,
        target_segment_ids: Optional[Tensor] = None,
        is_prefill: bool = False,
        return_aux: Optional[set[str]] = None,
    ) -> tuple[NestedTensor, BaseTransformerLayer.Output]:
        """Decoding steps on `data` [batch, steps, input_dim], or a prefill (`is_prefill`; see
        `MultiheadAttention.extend_step` for it and `target_segment_ids`)."""
        state, out = self.self_attention.extend_step(
            cached_states["self_attention"],
            data,
            kv_state=self_attention_kv_state,
            segment_ids=target_segment_ids,
            is_prefill=is_prefill,
            attention_logit_biases=self_attention_logit_biases,
            return_aux=self._self_aux(return_aux),
        )
        output = self._finish(out, cross_attention_data, cross_attention_logit_biases, return_aux)
        return dict(self_attention=state), output
