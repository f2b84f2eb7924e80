"""DeBERTa (https://arxiv.org/abs/2006.03654): disentangled self-attention and the V2 encoder.

- `deberta_relative_position_bucket`: the relative position d(i, j) = i - j of each query/key
  pair, kept exact within `num_directional_buckets // 2` and log-bucketed beyond, up to
  `max_distance`, then shifted into [0, 2 * num_directional_buckets].
- `DisentangledSelfAttention`: multi-head self-attention whose logits add, to the
  content-to-content term, content-to-position (C2P: the query against the projected relative
  position embeddings) and position-to-content (P2C: the key against them) terms, each scaled so
  that the sum is scaled by 1 / sqrt(per_head_dim * (1 + number of terms)).
- `DeBERTaV2RelativePositionalEmbedding`: the table of relative position embeddings, read
  through a LayerNorm.
- `DeBERTaV2Encoder`: an `Encoder` holding one relative position embedding shared (as
  "relative_pos_emb") by the attention of every layer.
- `deberta_v2_self_attention_config`, `deberta_v2_encoder_config`, `deberta_v2_model_config`:
  DeBERTa V2/V3 defaults (post-norm layers, shared query/key projections for the positions).

Hugging Face's `DebertaV2Model` with `relative_attention=True`, `norm_rel_ebd="layer_norm"`,
`pos_att_type` the configured types, `position_buckets` = num_directional_buckets (or
max_distance) and `max_relative_positions` = max_distance computes the same function
(`tests/common/test_deberta.py` converts our weights into it). `share_att_key=True` there is
`share_projections=True` here; without it, HF's `pos_query_proj` has a bias that ours does not
(P2C uses no bias, as the original implementation).
"""

from collections.abc import Sequence
from enum import Enum
from typing import Optional, Union

import jax.numpy as jnp
import numpy as np

from axlearn.common.attention import (
    BaseStackedTransformerLayer,
    MultiheadAttention,
    MultiheadInputLinear,
    QKVLinear,
    RepeatedTransformerLayer,
    scaled_hidden_dim,
)
from axlearn.common.bert import BertModel, bert_embedding_config, bert_model_config
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.embedding import Embedding
from axlearn.common.encoder import Encoder
from axlearn.common.kv_cache.base_kv_cache import KVState
from axlearn.common.layers import BaseClassificationHead, Dropout, LayerNorm, RedirectToSharedModule
from axlearn.common.module import Module, child_context
from axlearn.common.param_init import PARAM_REGEXP_WEIGHT, DefaultInitializer, WeightInitializer
from axlearn.common.utils import Tensor

__all__ = [
    "DeBERTaV2Encoder",
    "DeBERTaV2RelativePositionalEmbedding",
    "DisentangledAttentionType",
    "DisentangledSelfAttention",
    "deberta_relative_position_bucket",
    "deberta_v2_encoder_config",
    "deberta_v2_model_config",
    "deberta_v2_self_attention_config",
]


def _deberta_make_log_bucket_position(
    relative_position: Tensor, *, num_directional_buckets: int, max_distance: int
) -> Tensor:
    """Buckets signed relative positions: exact near zero, logarithmic further out.

    With m = num_directional_buckets // 2, a position x with |x| <= m is kept; otherwise it
    becomes sign(x) * (m + ceil(log(|x| / m) / log((max_distance - 1) / m) * (m - 1))), so that
    |x| = max_distance - 1 reaches num_directional_buckets - 1 and larger |x| keep growing
    (they are clipped when the bucket is used to index the embeddings).

    The log terms are float32 in the order Hugging Face's `make_log_bucket_position` computes
    them, so that the ceil lands on the same side where the exact value is an integer. A NumPy
    input is computed with NumPy (as `deberta_relative_position_bucket` does, the positions being
    static), whose float32 log agrees with PyTorch's more often than XLA's.

    Args:
        relative_position: An int array (NumPy or JAX) of any shape.
        num_directional_buckets: Buckets in each direction (at least 2).
        max_distance: The distance mapped to the last bucket (at least 2).

    Returns:
        An int array (of the input's kind) of the shape of `relative_position`.
    """
    xp = np if isinstance(relative_position, np.ndarray) else jnp
    exact = num_directional_buckets // 2
    sign = xp.sign(relative_position)
    # Positions inside (-exact, exact) are not log-bucketed; clamping them keeps log() finite.
    magnitude = xp.maximum(xp.abs(relative_position), exact - 1)
    ratio = magnitude.astype(np.float32) / np.float32(exact)
    log_ratio = xp.log(ratio) / xp.log(np.float32((max_distance - 1) / exact))
    bucketed = exact + xp.ceil(log_ratio * np.float32(exact - 1)).astype(relative_position.dtype)
    return xp.where(magnitude <= exact, relative_position, sign * bucketed)


def deberta_relative_position_bucket(
    *,
    query_len: int,
    key_len: int,
    num_directional_buckets: int,
    max_distance: int,
) -> Tensor:
    """DeBERTa's relative position bucket of each (query i, key j): bucket(i - j) + buckets.

    Args:
        query_len: Number of query positions.
        key_len: Number of key positions.
        num_directional_buckets: Buckets in each direction (at least 2).
        max_distance: The distance mapped to the last bucket in each direction (at least 2).

    Returns:
        An int32 Tensor [query_len, key_len]; values within [0, 2 * num_directional_buckets]
        for distances up to max_distance.

    Raises:
        ValueError: If num_directional_buckets or max_distance is below 2.
    """
    if num_directional_buckets < 2 or max_distance < 2:
        raise ValueError(
            "num_directional_buckets and max_distance must be at least 2, got "
            f"num_directional_buckets={num_directional_buckets}, max_distance={max_distance}."
        )
    # The positions are static: computed with NumPy (see `_deberta_make_log_bucket_position`).
    relative = np.arange(query_len, dtype=np.int32)[:, None] - np.arange(key_len, dtype=np.int32)
    bucket = _deberta_make_log_bucket_position(
        relative, num_directional_buckets=num_directional_buckets, max_distance=max_distance
    )
    return jnp.asarray(bucket + num_directional_buckets)


class DisentangledAttentionType(Enum):
    """The position terms of disentangled attention (content-to-content is always included).

    C2P: content-to-position (the query against the relative position keys).
    P2C: position-to-content (the relative position queries against the key).
    """

    C2P = 1
    P2C = 2


class DisentangledSelfAttention(MultiheadAttention):
    """DeBERTa's disentangled self-attention.

    logits[i, j] = (q_i . k_j + [C2P] q_i . pk_{d(i,j)} + [P2C] k_j . pq_{d(j,i)})
    / sqrt(per_head_dim * (1 + len(attention_type))), where d is `deberta_relative_position_bucket`
    (clipped to [0, 2 * buckets - 1]) and pk / pq are the relative position embeddings (the first
    2 * buckets rows of `pos_emb`, after `pos_emb_dropout`) projected by `pos_k_proj` and
    `pos_q_proj`. Queries and keys must have the same length.

    Children: those of MultiheadAttention, pos_emb, pos_emb_dropout, and pos_k_proj (with C2P) and
    pos_q_proj (with P2C). The query and key projections are shared with descendants as "q_proj"
    and "k_proj" (so `pos_q_proj`/`pos_k_proj` may redirect to them).
    """

    @config_class
    class Config(MultiheadAttention.Config):
        """Configures DisentangledSelfAttention."""

        # The position terms to add (DisentangledAttentionType values, no repeats).
        attention_type: Required[Sequence[DisentangledAttentionType]] = REQUIRED
        # The distance reaching the last relative position bucket in each direction (>= 2).
        max_distance: Required[int] = REQUIRED
        # Relative position buckets in each direction (>= 2); None means max_distance.
        num_directional_buckets: Optional[int] = None
        # The relative position embeddings (`embeddings()` of >= 2 * buckets rows of hidden_dim),
        # usually a RedirectToSharedModule to the encoder's shared embedding.
        pos_emb: Required[InstantiableConfig] = REQUIRED
        # Dropout on the relative position embeddings.
        pos_emb_dropout: InstantiableConfig = Dropout.default_config()
        # Projection of the position embeddings into P2C queries; None: a MultiheadInputLinear
        # without bias. A RedirectToSharedModule to "q_proj" shares the query projection.
        pos_q_proj: Optional[InstantiableConfig] = None
        # Projection of the position embeddings into C2P keys; None: a MultiheadInputLinear
        # with bias. A RedirectToSharedModule to "k_proj" shares the key projection.
        pos_k_proj: Optional[InstantiableConfig] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._validate_config()
        self._add_child("pos_emb", cfg.pos_emb)
        self._add_child("pos_emb_dropout", cfg.pos_emb_dropout)
        self._share_with_descendants(self.i_proj.q_proj, shared_module_name="q_proj")
        self._share_with_descendants(self.i_proj.k_proj, shared_module_name="k_proj")
        types = set(cfg.attention_type)
        if DisentangledAttentionType.C2P in types:
            self._add_child("pos_k_proj", self._pos_proj_config(cfg.pos_k_proj, bias=True))
        if DisentangledAttentionType.P2C in types:
            self._add_child("pos_q_proj", self._pos_proj_config(cfg.pos_q_proj, bias=False))

    def _pos_proj_config(self, proj: Optional[InstantiableConfig], *, bias: bool):
        if proj is not None:
            return proj
        cfg = self.config
        return MultiheadInputLinear.default_config().set(
            model_dim=cfg.hidden_dim or cfg.query_dim,
            num_heads=cfg.num_heads,
            per_head_dim=self.per_head_dim(),
            bias=bias,
        )

    def _validate_config(self):
        cfg = self.config
        if isinstance(cfg.attention_type, (str, DisentangledAttentionType)):
            raise ValueError(
                f"{self.path()}.attention_type must be a collection of DisentangledAttentionType, "
                f"got {cfg.attention_type!r}; e.g. {{DisentangledAttentionType.C2P}}."
            )
        types = list(cfg.attention_type)
        invalid = [t for t in types if not isinstance(t, DisentangledAttentionType)]
        if invalid:
            raise ValueError(
                f"{self.path()}.attention_type has invalid entries {invalid}; valid: "
                f"{[t.name for t in DisentangledAttentionType]} (DisentangledAttentionType)."
            )
        if len(set(types)) != len(types):
            # The count of terms sets the logit scale, so a repeat is ambiguous.
            raise ValueError(f"{self.path()}.attention_type has duplicates: {types}.")
        if cfg.max_distance < 2:
            raise ValueError(
                f"{self.path()}.max_distance must be at least 2, got {cfg.max_distance}."
            )
        if cfg.num_directional_buckets is not None and cfg.num_directional_buckets < 2:
            raise ValueError(
                f"{self.path()}.num_directional_buckets must be None or at least 2, got "
                f"{cfg.num_directional_buckets}."
            )
        if cfg.causal or cfg.mask is not None:
            raise ValueError(f"{self.path()}: causal/mask are not supported (bidirectional only).")
        if self.num_kv_heads != cfg.num_heads:
            raise ValueError(
                f"{self.path()}.input_linear has {self.num_kv_heads} key/value heads; "
                f"disentangled attention needs num_heads={cfg.num_heads} of them."
            )
        for name in ("q_proj", "k_proj"):
            if not hasattr(self.i_proj, name):
                raise ValueError(
                    f"{self.path()}.input_linear must have separate q_proj and k_proj children "
                    f"(e.g. QKVLinear), got {type(self.i_proj).__name__}."
                )

    def num_directional_buckets(self) -> int:
        """Relative position buckets in each direction (the config's, else max_distance).

        Returns:
            The number of buckets.
        """
        cfg = self.config
        return cfg.num_directional_buckets or cfg.max_distance

    # Queries and keys stay unscaled until `_attention_scores` (each term scales its own).
    def _cache_convention(self, k_proj: Tensor, v_proj: Tensor, *, positions: Tensor):
        del positions
        return k_proj, KVState(k_proj=k_proj, v_proj=v_proj)

    def _scale_for_attention(self, q_proj, k_proj, *, query_positions, key_positions):
        del query_positions, key_positions
        return q_proj, k_proj

    def _scale_qk(self, *, q_proj, k_proj, query_positions=None, key_positions=None):
        del query_positions, key_positions
        return q_proj, k_proj

    def _logits(self, q_proj: Tensor, k_proj: Tensor) -> Tensor:
        return self._compute_logits(q_proj, k_proj)

    def _compute_logits(self, q_proj: Tensor, k_proj: Tensor) -> Tensor:
        """Content-to-content scores plus the disentangled position terms: [B, N, T, S]."""
        logits = self._attention_scores(q_proj, k_proj)
        return logits + self._disentangled_attention_bias(q_proj=q_proj, k_proj=k_proj)

    def _attention_scores(self, q_proj: Tensor, k_proj: Tensor) -> Tensor:
        """Scores [B, N, T, S] of q [B or 1, T, N, H] and k [B or 1, S, N, H], each term's scale.

        The query is multiplied by (1 + len(attention_type)) ** -0.5 and then by `scale_query`
        (1 / sqrt(per_head_dim) by default); the key by `scale_key`.
        """
        batch = max(q_proj.shape[0], k_proj.shape[0])
        q_proj = jnp.broadcast_to(q_proj, (batch,) + q_proj.shape[1:])
        k_proj = jnp.broadcast_to(k_proj, (batch,) + k_proj.shape[1:])
        q_proj = q_proj * (1 + len(self.config.attention_type)) ** -0.5
        q_proj = self.scale_query(q_proj, positions=None)
        k_proj = self.scale_key(k_proj, positions=None)
        return super()._logits(q_proj, k_proj)

    def _disentangled_attention_bias(
        self,
        *,
        q_proj: Tensor,
        k_proj: Tensor,
        relative_pos_emb: Optional[Tensor] = None,
        relative_pos: Optional[Tensor] = None,
    ) -> Union[Tensor, int]:
        """The C2P and P2C terms of the logits.

        Args:
            q_proj: Unscaled queries [batch, query_len, num_heads, per_head_dim].
            k_proj: Unscaled keys [batch, key_len, num_heads, per_head_dim].
            relative_pos_emb: Optional [>= 2 * buckets, hidden_dim] embeddings; None: those of
                `pos_emb` after `pos_emb_dropout`.
            relative_pos: Optional [batch or 1, query_len, key_len] buckets in
                [0, 2 * buckets]; None: `deberta_relative_position_bucket`.

        Returns:
            [batch, num_heads, query_len, key_len] (0 if attention_type is empty).

        Raises:
            NotImplementedError: If query_len != key_len.
            ValueError: If the embeddings have fewer than 2 * buckets rows.
        """
        cfg = self.config
        query_len, key_len = q_proj.shape[1], k_proj.shape[1]
        if query_len != key_len:
            raise NotImplementedError(
                f"{self.path()}: disentangled attention needs query_len == key_len, got "
                f"query_len={query_len} and key_len={key_len}."
            )
        buckets = self.num_directional_buckets()
        span = 2 * buckets
        if relative_pos_emb is None:
            relative_pos_emb = self.pos_emb_dropout(self.pos_emb.embeddings())
        if relative_pos_emb.shape[0] < span:
            raise ValueError(
                f"{self.path()}.pos_emb has {relative_pos_emb.shape[0]} embeddings, fewer than "
                f"2 * num_directional_buckets = {span}; set its num_embeddings to at least {span}."
            )
        if relative_pos is None:
            relative_pos = deberta_relative_position_bucket(
                query_len=query_len,
                key_len=key_len,
                num_directional_buckets=buckets,
                max_distance=cfg.max_distance,
            )[None]
        # [1, 2 * buckets, hidden_dim]: the asymmetric range of Equation (3).
        pos_emb = relative_pos_emb[:span][None]
        # [batch or 1, 1, query_len, key_len].
        relative_pos = relative_pos[:, None]
        batch = q_proj.shape[0]
        index_shape = (batch, cfg.num_heads, query_len, key_len)
        types = set(cfg.attention_type)
        score = 0
        if DisentangledAttentionType.C2P in types:
            # [batch, num_heads, query_len, 2 * buckets].
            with child_context("c2p_attn_scores", module=self):
                c2p = self._attention_scores(q_proj, self.pos_k_proj(pos_emb))
            index = jnp.broadcast_to(jnp.clip(relative_pos, 0, span - 1), index_shape)
            score = score + jnp.take_along_axis(c2p, index, axis=-1)
        if DisentangledAttentionType.P2C in types:
            # [batch, num_heads, key_len, 2 * buckets].
            with child_context("p2c_attn_scores", module=self):
                p2c = self._attention_scores(k_proj, self.pos_q_proj(pos_emb))
            # Entry [j, i] holds key j against the position d(j, i) = span - d(i, j).
            index = jnp.broadcast_to(jnp.clip(span - relative_pos, 0, span - 1), index_shape)
            score = score + jnp.swapaxes(jnp.take_along_axis(p2c, index, axis=-1), -1, -2)
        return score


class DeBERTaV2RelativePositionalEmbedding(Embedding):
    """The relative position table, read through a LayerNorm (`embeddings()`)."""

    @config_class
    class Config(Embedding.Config):
        """Configures DeBERTaV2RelativePositionalEmbedding."""

        # The norm over the table's rows (input_dim is set to dim).
        norm: InstantiableConfig = LayerNorm.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("norm", cfg.norm.set(input_dim=cfg.dim))

    def embeddings(self) -> Tensor:
        """The normalized table.

        Returns:
            [num_embeddings, dim].
        """
        return self.norm(super().embeddings())


class DeBERTaV2Encoder(Encoder):
    """An Encoder with one relative position embedding shared by all its layers' attention.

    The embedding is the child "relative_pos_emb" (dim set to the encoder's), shared with
    descendants under the same name; the default attention reads it through a
    RedirectToSharedModule.
    """

    @config_class
    class Config(Encoder.Config):
        """Configures DeBERTaV2Encoder."""

        # The shared relative position embedding (dim is set to the encoder's dim).
        relative_pos_emb: InstantiableConfig = DeBERTaV2RelativePositionalEmbedding.default_config()

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.transformer = RepeatedTransformerLayer.default_config()
        cfg.transformer.layer.self_attention.attention = (
            DisentangledSelfAttention.default_config().set(
                pos_emb=RedirectToSharedModule.default_config().set(
                    shared_module="relative_pos_emb",
                    method_map=dict(embeddings="embeddings"),
                )
            )
        )
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("relative_pos_emb", cfg.relative_pos_emb.set(dim=cfg.dim))
        self._share_with_descendants(self.relative_pos_emb, shared_module_name="relative_pos_emb")


def deberta_v2_self_attention_config(
    *,
    num_heads: int,
    max_distance: int,
    hidden_dropout: float = 0.1,
    attention_dropout: float = 0.1,
    share_projections: bool = True,
    num_directional_buckets: Optional[int] = None,
    attention_type: Sequence[DisentangledAttentionType] = (
        DisentangledAttentionType.P2C,
        DisentangledAttentionType.C2P,
    ),
    base_cfg: Optional[DisentangledSelfAttention.Config] = None,
) -> DisentangledSelfAttention.Config:
    """A DeBERTa V2 self-attention config.

    Args:
        num_heads: Attention heads.
        max_distance: The distance of the last relative position bucket.
        hidden_dropout: Dropout rate on the relative position embeddings.
        attention_dropout: Dropout rate on the attention probabilities.
        share_projections: Whether the position projections are the query/key projections
            (HF's `share_att_key`; needs a QKVLinear input_linear).
        num_directional_buckets: Buckets in each direction (None: max_distance).
        attention_type: The position terms (default C2P and P2C, as DeBERTa V2/V3).
        base_cfg: Optional base config (cloned); default DisentangledSelfAttention's.

    Returns:
        The attention config.

    Raises:
        ValueError: If share_projections is set and input_linear is not a QKVLinear.
    """
    cfg = base_cfg.clone() if base_cfg else DisentangledSelfAttention.default_config()
    cfg.set(
        num_heads=num_heads,
        max_distance=max_distance,
        num_directional_buckets=num_directional_buckets,
        attention_type=attention_type,
    )
    cfg.dropout.rate = attention_dropout
    cfg.pos_emb_dropout.rate = hidden_dropout
    if share_projections:
        if not isinstance(cfg.input_linear, QKVLinear.Config):
            raise ValueError(
                "share_projections needs input_linear to be a QKVLinear (separate q/k "
                f"projections), got {cfg.input_linear.klass.__name__}."
            )
        cfg.pos_q_proj = RedirectToSharedModule.default_config().set(shared_module="q_proj")
        cfg.pos_k_proj = RedirectToSharedModule.default_config().set(shared_module="k_proj")
    return cfg


def deberta_v2_encoder_config(
    *,
    dim: int,
    vocab_size: int,
    num_layers: int,
    max_distance: int,
    max_position_embeddings: Optional[int] = None,
    num_directional_buckets: Optional[int] = None,
    base_cfg: Optional[DeBERTaV2Encoder.Config] = None,
    stack_cls: Optional[type[BaseStackedTransformerLayer]] = None,
) -> DeBERTaV2Encoder.Config:
    """A DeBERTa V2 encoder config: post-norm layers, GELU feed-forward of 4x dim.

    Args:
        dim: Hidden dim.
        vocab_size: Vocabulary size.
        num_layers: Transformer layers.
        max_distance: The distance of the last relative position bucket (not a sequence
            length; see `max_position_embeddings`).
        max_position_embeddings: Learned absolute positions added to the token embeddings
            (HF's `position_biased_input`); None: none.
        num_directional_buckets: Buckets in each direction (None: max_distance); the relative
            position embedding has twice as many rows.
        base_cfg: Optional base config (cloned); default `DeBERTaV2Encoder.default_config()`.
        stack_cls: Optional stack class (default RepeatedTransformerLayer); the layer config
            (with its DisentangledSelfAttention) is kept.

    Returns:
        The encoder config. The attention's num_heads is still to be set (e.g. by
        `deberta_v2_self_attention_config(base_cfg=...)`).
    """
    cfg = base_cfg.clone() if base_cfg else DeBERTaV2Encoder.default_config()
    cfg.set(dim=dim, vocab_size=vocab_size)
    cfg.relative_pos_emb.set(num_embeddings=2 * (num_directional_buckets or max_distance))
    if stack_cls is not None:
        cfg.transformer = stack_cls.default_config().set(layer=cfg.transformer.layer)
    cfg.transformer.num_layers = num_layers
    layer = cfg.transformer.layer
    layer.self_attention.structure = "postnorm"
    layer.feed_forward.set(
        structure="postnorm", activation="nn.gelu", hidden_dim=scaled_hidden_dim(4)
    )
    cfg.emb = bert_embedding_config(
        max_position_embeddings=max_position_embeddings, layer_norm_epsilon=1e-7
    )
    return cfg


def deberta_v2_model_config(
    *,
    encoder_cfg: DeBERTaV2Encoder.Config,
    head_cfg: Optional[BaseClassificationHead.Config] = None,
) -> BertModel.Config:
    """A DeBERTa V2 model: a BertModel of `encoder_cfg`, weights drawn from N(0, 0.02^2).

    As `bert_model_config`, every LayerNorm's eps is set to `bert_layer_norm_epsilon`.

    Args:
        encoder_cfg: The encoder (e.g. from `deberta_v2_encoder_config`).
        head_cfg: Optional head (default the tied MLM head).

    Returns:
        The model config.
    """
    cfg = bert_model_config(
        vocab_size=encoder_cfg.vocab_size,
        hidden_dim=encoder_cfg.dim,
        encoder_cfg=encoder_cfg,
        head_cfg=head_cfg,
    )
    # Hugging Face DeBERTa V2's initializer_range (normal, not truncated).
    cfg.param_init = DefaultInitializer.default_config().set(
        init_by_param_name={
            PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                fan=None, scale=0.02, distribution="normal"
            )
        }
    )
    return cfg
