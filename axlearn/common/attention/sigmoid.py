"""Sigmoid attention: element-wise sigmoid probabilities instead of a softmax.

Public names are re-exported by `axlearn.common.attention`.

probs = sigmoid(logits + biases - log(seq_len)): the -log(seq_len) bias keeps the total
attention mass near that of a softmax over `seq_len` keys at initialization. Masked positions
(biases of NEG_INF) get probability 0.
"""

import math

import jax
import jax.numpy as jnp

from axlearn.common.attention.multihead import MultiheadAttention
from axlearn.common.config import REQUIRED, Required, config_class


class SigmoidAttention(MultiheadAttention):
    """Multi-head (or grouped-query) attention with sigmoid probabilities."""

    @config_class
    class Config(MultiheadAttention.Config):
        """Configures SigmoidAttention."""

        seq_len: Required[int] = REQUIRED  # The maximum sequence length (bias -log(seq_len)).

    def _compute_attention(self, *, q_proj, k_proj, v_proj, biases, mask, need_probs):
        del need_probs
        cfg = self.config
        batch, target_len, num_heads, head_dim = q_proj.shape
        source_len, kv_heads = k_proj.shape[1], k_proj.shape[2]
        groups = num_heads // kv_heads
        q = q_proj.reshape(batch, target_len, kv_heads, groups, head_dim)
        logits = jnp.einsum("btkgh,bskh->bkgts", q, k_proj)
        logits = logits.reshape(batch, num_heads, target_len, source_len)
        if cfg.atten_logit_cap is not None and cfg.atten_logit_cap > 0:
            cap = jnp.asarray(cfg.atten_logit_cap, logits.dtype)
            logits = cap * jnp.tanh(logits / cap)
        full_biases = self._full_biases(biases, mask, logits.dtype)
        logits = logits.astype(jnp.float32) - math.log(cfg.seq_len)
        if full_biases is not None:
            logits = logits + full_biases.astype(jnp.float32)
        probs = jax.nn.sigmoid(logits).astype(q_proj.dtype)
        probs = self.dropout(probs)
        grouped = probs.reshape(batch, kv_heads, groups, target_len, source_len)
        context = jnp.einsum("bkgts,bskh->btkgh", grouped, v_proj)
        context = context.reshape(batch, target_len, num_heads, head_dim).astype(v_proj.dtype)
        return context, probs
