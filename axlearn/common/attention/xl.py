"""Transformer-XL relative-position self-attention (https://arxiv.org/abs/1901.02860).

Public names are re-exported by `axlearn.common.attention`.

The logit of query i and key j is

    (q_i + u) . k_j + (q_i + v) . r_{i-j}

where u and v are learned per-head biases (`u_bias`, `v_bias`) and r_d is the projection
(`pos_proj`) of a sinusoidal embedding (`pos_emb`) of the distance d = i - j. The relative
embeddings are ordered by descending distance, T-1 down to -(T-1), as in XLNet: entry
`j - i + T - 1` of the table belongs to the pair (i, j).
"""

import enum
import math
from typing import Optional

import jax.numpy as jnp

from axlearn.common.attention.multihead import MultiheadAttention
from axlearn.common.attention.qkv import BaseMultiheadLinear
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.module import Module
from axlearn.common.param_init import FanAxes
from axlearn.common.utils import Tensor


class SinusoidalPositionalEmbedding(BaseLayer):
    """Sinusoidal embeddings of (possibly negative or fractional) positions.

    For `dim` = 2K and timescales tau_k growing geometrically from `min_timescale` to
    `max_timescale` (k = 0..K-1), position p maps to [sin(p / tau_0..K-1), cos(p / tau_0..K-1)].
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures SinusoidalPositionalEmbedding."""

        dim: Required[int] = REQUIRED  # Embedding dim; must be even.
        min_timescale: float = 1  # The smallest timescale (fastest-varying channel).
        max_timescale: float = 10_000  # The largest timescale (slowest-varying channel).

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.dim % 2:
            raise ValueError(f"{self.path()}.dim={cfg.dim} must be even; set an even dim.")

    def forward(self, positions: Tensor) -> Tensor:
        """Returns [..., dim] embeddings of `positions` [...] (float32)."""
        cfg = self.config
        half = cfg.dim // 2
        log_increment = math.log(cfg.max_timescale / cfg.min_timescale) / max(half - 1, 1)
        inv_timescales = jnp.exp(jnp.arange(half, dtype=jnp.float32) * -log_increment)
        inv_timescales = inv_timescales / cfg.min_timescale
        scaled = positions.astype(jnp.float32)[..., None] * inv_timescales
        return jnp.concatenate([jnp.sin(scaled), jnp.cos(scaled)], axis=-1)


class MultiheadRelativePositionLinear(BaseMultiheadLinear):
    """Projects relative position embeddings [length, model_dim] to [length, num_heads, head_dim].

    Parameter `weight` [model_dim, num_heads, per_head_dim] (and `bias` [num_heads, per_head_dim]
    if `bias`); fan axes in=0, out=(1, 2) like `MultiheadInputLinear`.
    """

    def _weight_fan_axes(self) -> FanAxes:
        return FanAxes(in_axis=0, out_axis=(1, 2))

    def _bias_spec(self, cfg) -> ParameterSpec:
        return ParameterSpec(
            shape=(cfg.num_heads, cfg.per_head_dim), mesh_axes=tuple(cfg.param_partition_spec)[1:]
        )

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns [length, num_heads, per_head_dim] from `inputs` [length, model_dim]."""
        return self._project("ld,dnh->lnh", inputs)


def rel_pos_to_abs_pos(x: Tensor) -> Tensor:
    """Turns scores indexed by relative offset into scores indexed by key position.

    Args:
        x: [..., T, 2T-1], where x[..., i, k] belongs to the offset k - (T - 1) from query i.

    Returns:
        [..., T, T], out[..., i, j] = x[..., i, j - i + T - 1] (the score of offset j - i).

    Raises:
        ValueError: If the last axis is not 2T-1 for T the second-to-last axis.
    """
    t, width = x.shape[-2], x.shape[-1]
    if width != 2 * t - 1:
        raise ValueError(f"rel_pos_to_abs_pos: last axis {width} must be 2 * {t} - 1 = {2 * t - 1}")
    index = jnp.arange(t)[None, :] - jnp.arange(t)[:, None] + (t - 1)
    index = jnp.broadcast_to(index, x.shape[:-1] + (t,))
    return jnp.take_along_axis(x, index, axis=-1)


def xl_attention_logits(
    q_proj: Tensor, k_proj: Tensor, relative_pos_emb: Tensor, u: Tensor, v: Tensor
) -> Tensor:
    """Transformer-XL attention logits (unscaled).

    logits[b, n, i, j] = (q[b, i, n] + u[n]) . k[b, j, n]
                         + (q[b, i, n] + v[n]) . relative_pos_emb[j - i + T - 1, n].

    Args:
        q_proj: [batch, T, num_heads, per_head_dim] queries.
        k_proj: [batch, T, num_heads, per_head_dim] keys (self-attention: same length).
        relative_pos_emb: [2T-1, num_heads, per_head_dim], entry k for offset k - (T - 1) =
            j - i, i.e. distance i - j descending from T-1 to -(T-1).
        u: [num_heads, per_head_dim] content bias.
        v: [num_heads, per_head_dim] position bias.

    Returns:
        [batch, num_heads, T, T] logits.
    """
    content = jnp.einsum("btnh,bsnh->bnts", q_proj + u, k_proj)
    position = jnp.einsum("btnh,lnh->bntl", q_proj + v, relative_pos_emb)
    return content + rel_pos_to_abs_pos(position)


class _ScalePosition(enum.Enum):
    """Where the query scale factor (e.g. 1/sqrt(per_head_dim)) is applied."""

    LOGIT = 0  # To the logits (XLNet).
    QUERY = 1  # To the queries, before the u/v biases are added (Lingvo).


class MultiheadAttentionXL(MultiheadAttention):
    """Multi-head self-attention with Transformer-XL relative position logits.

    Children (besides MultiheadAttention's): `pos_emb` (sinusoidal, no parameters) and
    `pos_proj` (`MultiheadRelativePositionLinear`); parameters `u_bias` and `v_bias`
    [num_heads, per_head_dim] (initialized to 0, like every `*bias`). Self-attention only, and
    no decoding (`extend_step`).

    `scale_position` LOGIT (XLNet): the query scale factor multiplies the whole logit
    ((q + u) . k + (q + v) . r) * s; QUERY (Lingvo): it multiplies the query only,
    (s q + u) . k + (s q + v) . r. Any per-dim scale or norm of `query_scale` applies to q in
    both cases.
    """

    ScalePosition = _ScalePosition

    @config_class
    class Config(MultiheadAttention.Config):
        """Configures MultiheadAttentionXL."""

        # Dim of the sinusoidal relative position embedding; None means query_dim.
        pos_emb_dim: Optional[int] = None
        # The relative position embedding (its dim is set from pos_emb_dim).
        pos_emb: InstantiableConfig = SinusoidalPositionalEmbedding.default_config()
        # The projection of position embeddings to heads (no bias by default, as in XLNet).
        pos_proj: InstantiableConfig = MultiheadRelativePositionLinear.default_config().set(
            bias=False
        )
        # Where the query scale factor is applied (see the class docstring).
        scale_position: _ScalePosition = _ScalePosition.LOGIT

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.scale_position not in tuple(_ScalePosition):
            raise ValueError(
                f"{self.path()}.scale_position={cfg.scale_position!r}; set it to "
                "MultiheadAttentionXL.ScalePosition.LOGIT or .QUERY."
            )
        pos_emb_dim = cfg.pos_emb_dim or cfg.query_dim
        self._add_child("pos_emb", cfg.pos_emb.clone(dim=pos_emb_dim))
        self._add_child(
            "pos_proj",
            cfg.pos_proj.clone(
                model_dim=pos_emb_dim, num_heads=cfg.num_heads, per_head_dim=self.per_head_dim()
            ),
        )

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        specs = dict(super()._create_layer_parameter_specs())
        for name in ("u_bias", "v_bias"):
            specs[name] = ParameterSpec(
                shape=(cfg.num_heads, self.per_head_dim()),
                mesh_axes=("model", None),
            )
        return specs

    def _logits(self, q_proj: Tensor, k_proj: Tensor) -> Tensor:
        """XL logits [B, N, T, T] from scaled queries q_proj [B, T, N, H], keys [B, T, N, H]."""
        cfg = self.config
        t, s = q_proj.shape[1], k_proj.shape[1]
        if t != s or k_proj.shape[2] != q_proj.shape[2]:
            raise ValueError(
                f"{self.path()}: MultiheadAttentionXL is self-attention with num_heads key heads "
                f"only (got {t} queries, {s} keys, {k_proj.shape[2]} key heads); use "
                "MultiheadAttention for cross-attention, grouped heads or decoding."
            )
        # Distances i - j descending from T-1 to -(T-1).
        distances = jnp.arange(t - 1, -t, -1)
        rel_emb = self.pos_proj(self.pos_emb(distances).astype(q_proj.dtype))
        # The query scale factor (a plain float, e.g. 1/sqrt(per_head_dim)).
        scale = self.scale_query._scale_fn(self.per_head_dim())  # pylint: disable=protected-access
        logit_scale = cfg.scale_position == _ScalePosition.LOGIT
        if logit_scale and scale != 1:
            q_proj = q_proj / jnp.asarray(scale, q_proj.dtype)
        logits = xl_attention_logits(
            q_proj,
            k_proj,
            rel_emb,
            self.parameters["u_bias"].astype(q_proj.dtype),
            self.parameters["v_bias"].astype(q_proj.dtype),
        )
        if logit_scale and scale != 1:
            logits = logits * jnp.asarray(scale, logits.dtype)
        if cfg.atten_logit_cap is not None and cfg.atten_logit_cap > 0:
            cap = jnp.asarray(cfg.atten_logit_cap, logits.dtype)
            logits = cap * jnp.tanh(logits / cap)
        return logits

    def extend_step(self, cached_states, query, **kwargs):
        """Not supported: relative position logits need the whole sequence."""
        raise NotImplementedError(
            f"{self.path()}: MultiheadAttentionXL does not support extend_step decoding; use "
            "MultiheadAttention for decoding."
        )
