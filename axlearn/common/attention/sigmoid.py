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
        logits = self._logits(q_proj, k_proj)
        full_biases = self._full_biases(biases, mask, logits.dtype)
        logits = logits.astype(jnp.float32) - math.log(cfg.seq_len)
        if full_biases is not None:
            logits = logits + full_biases.astype(jnp.float32)
        probs = jax.nn.sigmoid(logits).astype(q_proj.dtype)
        probs = self.dropout(probs)
        return self._context(probs, v_proj), probs
