"""The sequence transducer (RNN-T, Graves 2012, https://arxiv.org/abs/1211.3711) and its loss.

For T acoustic frames and U labels the alignment lattice has (T + 1) x (U + 1) nodes: from node
(t, u) a blank moves to (t + 1, u) with probability `blank[t, u]`, and label y_u moves to
(t, u + 1) with probability `y[t, u]`. An alignment is a path from (0, 0) to (T, U) whose last
step is a blank from (T - 1, U). So:

- `log_prob_blank` is [T, U + 1]: log P(blank | frame t, labels y[:u]);
- `log_prob_y` is [T + 1, U]: log P(y_u | frame t, labels y[:u]) (row T is never used by a
  complete path, it only lets the arrays be rectangular);
- `log_prob_prefix_alignments` gives log alpha[t, u] (all paths from (0, 0) to (t, u)),
  `log_prob_suffix_alignments` log beta[t, u] (from (t, u) to the end), and
  `log_prob_alignments` log alpha[T, U] = log P(y | x), with a custom gradient from alpha and
  beta.

alpha is computed one anti-diagonal (t + u = k) at a time with a scan, as in Bagby et al.
(2018), "Efficient implementation of recurrent neural network transducer in TensorFlow": the
inputs are "tilted" so that each anti-diagonal is one row.

`apply_paddings` turns padded [am_max_len, lm_max_len] log-probabilities into arrays whose
alignment probability is that of the unpadded (T, U) lattice, so a batch of different lengths
is one vmapped computation. `Transducer` is the joint network (tanh(am + lm) -> vocab logits)
with its loss.
"""

from typing import NamedTuple, Protocol

import jax
from jax import numpy as jnp
from jax.experimental import checkify

from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import (
    REQUIRED,
    InstantiableConfig,
    Required,
    config_class,
    config_for_function,
)
from axlearn.common.layers import Linear, get_activation_fn
from axlearn.common.module import Module
from axlearn.common.utils import NestedTensor, Tensor

# A log-probability that stands for log(0) but keeps arithmetic finite.
_NEG_INF = -1e30


class LogitsToLogProbFn(Protocol):
    """Maps joint logits [..., vocab_size] to blank and token log-probabilities."""

    def __call__(self, logits: Tensor) -> dict[str, Tensor]:
        """Returns dict(log_prob_blank=[...], log_prob_tokens=[..., vocab_size]).

        exp(log_prob_blank) + sum(exp(log_prob_tokens)) is 1; log_prob_tokens is ~-inf at the
        blank id.
        """
        raise NotImplementedError(type(self))


def classic_logits_to_log_probs(*, blank_id: int, blank_logit_bias: float = 0) -> LogitsToLogProbFn:
    """One softmax over the vocabulary, blank included (Graves 2012).

    Args:
        blank_id: The blank's id in [0, vocab_size).
        blank_logit_bias: Added to the blank logit before the softmax.

    Returns:
        A LogitsToLogProbFn.
    """

    def fn(logits: Tensor) -> dict[str, Tensor]:
        blank = jax.nn.one_hot(blank_id, logits.shape[-1], dtype=logits.dtype)
        log_probs = jax.nn.log_softmax(logits + blank_logit_bias * blank)
        return dict(
            log_prob_blank=log_probs[..., blank_id],
            log_prob_tokens=log_probs + _NEG_INF * blank,
        )

    return fn


def hat_logits_to_log_probs(*, blank_id: int, blank_logit_bias: float = 0) -> LogitsToLogProbFn:
    """HAT (https://arxiv.org/abs/2003.07705): a sigmoid for blank, a softmax over the labels.

    P(blank) = sigmoid(blank logit + bias); P(token) = (1 - P(blank)) * softmax(label logits).

    Args:
        blank_id: The blank's id in [0, vocab_size).
        blank_logit_bias: Added to the blank logit before the sigmoid.

    Returns:
        A LogitsToLogProbFn.
    """

    def fn(logits: Tensor) -> dict[str, Tensor]:
        blank_logit = logits[..., blank_id] + blank_logit_bias
        blank = jax.nn.one_hot(blank_id, logits.shape[-1], dtype=logits.dtype)
        # log sigmoid(z) = -softplus(-z); log(1 - sigmoid(z)) = -softplus(z).
        label_log_probs = jax.nn.log_softmax(logits + _NEG_INF * blank)
        return dict(
            log_prob_blank=-jax.nn.softplus(-blank_logit),
            log_prob_tokens=label_log_probs - jax.nn.softplus(blank_logit)[..., None],
        )

    return fn


def log_probs_from_blank_and_tokens(
    log_prob_blank: Tensor, log_prob_tokens: Tensor, *, blank_id: int
) -> Tensor:
    """Merges blank and token log-probabilities into one [..., vocab_size] tensor.

    Args:
        log_prob_blank: [...].
        log_prob_tokens: [..., vocab_size].
        blank_id: The blank's id.

    Returns:
        [..., vocab_size]: log_prob_blank at blank_id, log_prob_tokens elsewhere.
    """
    is_blank = jnp.arange(log_prob_tokens.shape[-1]) == blank_id
    return jnp.where(is_blank, log_prob_blank[..., None], log_prob_tokens)


def _tilt(x: Tensor, pad_value: Tensor) -> Tensor:
    """Shears [R, C] into [R + C - 1, C] so that x[i, j] lands at row i + j.

    Args:
        x: [R, C].
        pad_value: The value of the entries no x maps to.

    Returns:
        y with y[i, j] = x[i - j, j] where 0 <= i - j < R, else pad_value.
    """
    r, c = x.shape
    src = jnp.arange(r + c - 1)[:, None] - jnp.arange(c)[None, :]
    valid = (src >= 0) & (src < r)
    gathered = jnp.take_along_axis(x, jnp.clip(src, 0, r - 1), axis=0)
    return jnp.where(valid, gathered, jnp.asarray(pad_value, x.dtype))


def _untilt(y: Tensor) -> Tensor:
    """Undoes `_tilt`: [R + C - 1, C] -> [R, C] with x[i, j] = y[i + j, j].

    Args:
        y: [R + C - 1, C].

    Returns:
        x of shape [R, C].
    """
    rc1, c = y.shape
    r = rc1 + 1 - c
    rows = jnp.arange(r)[:, None] + jnp.arange(c)[None, :]
    return jnp.take_along_axis(y, rows, axis=0)


def log_prob_prefix_alignments(log_prob_blank: Tensor, log_prob_y: Tensor) -> Tensor:
    """log alpha[t, u]: the log probability of all paths from (0, 0) to (t, u).

    alpha[0, 0] = 1 and
    alpha[t, u] = alpha[t - 1, u] * blank[t - 1, u] + alpha[t, u - 1] * y[t, u - 1].

    Args:
        log_prob_blank: [T, U + 1].
        log_prob_y: [T + 1, U].

    Returns:
        [T + 1, U + 1].
    """
    num_labels = log_prob_y.shape[1]
    dtype = log_prob_blank.dtype
    # Row k of the tilted arrays holds the anti-diagonal t + u = k.
    tilted_blank = _tilt(log_prob_blank, pad_value=_NEG_INF)  # [T + U, U + 1].
    tilted_y = _tilt(log_prob_y, pad_value=_NEG_INF)  # [T + U, U].
    first = jnp.full([num_labels + 1], -jnp.inf, dtype=dtype).at[0].set(0)

    def next_diagonal(alpha_k, diag):
        # alpha_k[u] = log alpha[k - u, u]; returns alpha_{k+1}.
        blank_k, y_k = diag
        from_blank = alpha_k + blank_k
        from_label = jnp.concatenate(
            [jnp.full([1], -jnp.inf, dtype=dtype), alpha_k[:-1] + y_k], axis=0
        )
        alpha_next = jnp.logaddexp(from_blank, from_label)
        return alpha_next, alpha_next

    _, diagonals = jax.lax.scan(next_diagonal, first, (tilted_blank, tilted_y))
    return _untilt(jnp.concatenate([first[None], diagonals], axis=0))


def log_prob_suffix_alignments(log_prob_blank: Tensor, log_prob_y: Tensor) -> Tensor:
    """log beta[t, u]: the log probability of all paths from (t, u) to (T, U).

    Args:
        log_prob_blank: [T, U + 1].
        log_prob_y: [T + 1, U].

    Returns:
        [T + 1, U + 1]; beta[0, 0] is P(y | x).
    """
    reversed_prefix = log_prob_prefix_alignments(log_prob_blank[::-1, ::-1], log_prob_y[::-1, ::-1])
    return reversed_prefix[::-1, ::-1]


def log_prob_gradients(
    *,
    log_prob_blank: Tensor,
    log_prob_y: Tensor,
    log_prob_prefix: Tensor,
    log_prob_suffix: Tensor,
) -> tuple[Tensor, Tensor]:
    """d log P(y|x) / d log_prob_blank and d log_prob_y, from alpha and beta.

    The derivative for an edge is the share of P(y|x) carried by paths through it:
    alpha[source] * p(edge) * beta[target] / P(y|x).

    Args:
        log_prob_blank: [T, U + 1].
        log_prob_y: [T + 1, U].
        log_prob_prefix: log alpha, [T + 1, U + 1].
        log_prob_suffix: log beta, [T + 1, U + 1].

    Returns:
        (grad_blank [T, U + 1], grad_y [T + 1, U]).
    """
    log_total = log_prob_suffix[0, 0]
    grad_blank = jnp.exp(log_prob_prefix[:-1] + log_prob_blank + log_prob_suffix[1:] - log_total)
    grad_y = jnp.exp(log_prob_prefix[:, :-1] + log_prob_y + log_prob_suffix[:, 1:] - log_total)
    return grad_blank, grad_y


@jax.custom_vjp
def log_prob_alignments(log_prob_blank: Tensor, log_prob_y: Tensor) -> Tensor:
    """log P(y | x): the log probability of all alignments (log alpha[T, U]).

    Its gradient is computed from alpha and beta (`log_prob_gradients`), not by
    differentiating the scan.

    Args:
        log_prob_blank: [T, U + 1].
        log_prob_y: [T + 1, U].

    Returns:
        A scalar.
    """
    return log_prob_prefix_alignments(log_prob_blank, log_prob_y)[-1, -1]


def _log_prob_alignments_fwd(log_prob_blank: Tensor, log_prob_y: Tensor):
    prefix = log_prob_prefix_alignments(log_prob_blank, log_prob_y)
    return prefix[-1, -1], (log_prob_blank, log_prob_y, prefix)


def _log_prob_alignments_bwd(res, g):
    log_prob_blank, log_prob_y, prefix = res
    grad_blank, grad_y = log_prob_gradients(
        log_prob_blank=log_prob_blank,
        log_prob_y=log_prob_y,
        log_prob_prefix=prefix,
        log_prob_suffix=log_prob_suffix_alignments(log_prob_blank, log_prob_y),
    )
    return g * grad_blank, g * grad_y


log_prob_alignments.defvjp(_log_prob_alignments_fwd, _log_prob_alignments_bwd)


def apply_paddings(
    log_prob_blank: Tensor, log_prob_y: Tensor, am_paddings: Tensor, lm_paddings: Tensor
) -> dict[str, Tensor]:
    """Masks padded log-probabilities so the padded lattice has the unpadded alignment prob.

    With T = the number of non-padded frames and U + 1 = the number of non-padded tokens (BOS
    and the U labels), every edge outside the (T, U) lattice gets log 0 (`_NEG_INF`), except a
    path of log 1 edges from (T, U) to the padded corner: blanks down column U, then labels
    along the extra last row. The final blank of the real lattice must leave from (T - 1, U),
    so the other blanks of row T - 1 are removed.

    Args:
        log_prob_blank: [am_max_len, lm_max_len] (the upper-left [T, U + 1] is used).
        log_prob_y: [am_max_len, lm_max_len] (the upper-left [T + 1, U] is used).
        am_paddings: [am_max_len], 0 for the T frames, then 1s.
        lm_paddings: [lm_max_len], 0 for the U + 1 tokens, then 1s (not all 1s: under
            `checkify` that is a check failure).

    Returns:
        dict(log_prob_blank=[am_max_len, lm_max_len], log_prob_y=[am_max_len + 1,
        lm_max_len - 1]) whose `log_prob_alignments` equals the unpadded lattice's.
    """
    checkify.check(jnp.sum(1 - lm_paddings) > 0, "lm_paddings cannot be all 1s.")
    am_len, lm_len = am_paddings.shape[0], lm_paddings.shape[0]
    num_frames = jnp.sum(1 - am_paddings).astype(jnp.int32)  # T.
    last_label = (jnp.sum(1 - lm_paddings) - 1).astype(jnp.int32)  # U.
    t = jnp.arange(am_len)[:, None]
    u = jnp.arange(lm_len)[None, :]

    keep_blank = ((t < num_frames - 1) & (u <= last_label)).at[num_frames - 1, last_label].set(True)
    blank = jnp.where(keep_blank, log_prob_blank, _NEG_INF)
    blank = jnp.where((t >= num_frames) & (u == last_label), 0.0, blank).astype(
        log_prob_blank.dtype
    )

    # One extra row (index am_len) so that an example of am_max_len frames has its row T.
    t1 = jnp.arange(am_len + 1)[:, None]
    y = jnp.concatenate([log_prob_y, jnp.full([1, lm_len], _NEG_INF, log_prob_y.dtype)], axis=0)
    y = jnp.where((t1 < num_frames) & (u < last_label), y, _NEG_INF)
    y = jnp.where((t1 == am_len) & (u >= last_label), 0.0, y).astype(log_prob_y.dtype)
    return dict(log_prob_blank=blank, log_prob_y=y[:, :-1])


class _Seq(NamedTuple):
    data: Tensor
    paddings: Tensor


class Transducer(BaseLayer):
    """The RNN-T joint network and loss.

    `predict(am_data, lm_data)` gives log-probabilities for every (frame, token) pair from
    `proj(activation(am + lm))`; `forward` gives the mean negative log P(y | x) over the valid
    examples of a padded batch.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures Transducer."""

        # The dim of the acoustic and label encodings.
        input_dim: Required[int] = REQUIRED
        # The vocabulary size (blank included).
        vocab_size: Required[int] = REQUIRED
        # The activation of am + lm before the projection.
        activation_fn: str = "nn.tanh"
        # The projection input_dim -> vocab_size.
        proj: Linear.Config = Linear.default_config()
        # A config instantiating to a LogitsToLogProbFn (set its blank_id).
        logits_to_log_probs: InstantiableConfig = config_for_function(classic_logits_to_log_probs)

    def __init__(self, cfg: Config, *, parent: Module):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("proj", cfg.proj.set(input_dim=cfg.input_dim, output_dim=cfg.vocab_size))
        self._logits_to_log_probs = cfg.logits_to_log_probs.instantiate()

    def predict(self, am_data: Tensor, lm_data: Tensor) -> dict[str, Tensor]:
        """Log-probabilities of blank and tokens for every (frame, token) pair.

        Args:
            am_data: [..., am_len, input_dim].
            lm_data: [..., lm_len, input_dim].

        Returns:
            dict(log_prob_blank=[..., am_len, lm_len],
            log_prob_tokens=[..., am_len, lm_len, vocab_size]).
        """
        activation = get_activation_fn(self.config.activation_fn)
        hidden = activation(am_data[..., :, None, :] + lm_data[..., None, :, :])
        return self._logits_to_log_probs(self.proj(hidden))

    def forward(
        self,
        *,
        am_data: Tensor,
        am_paddings: Tensor,
        lm_data: Tensor,
        lm_paddings: Tensor,
        target_labels: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The transducer loss of a padded batch.

        Args:
            am_data: [batch, am_max_len, input_dim].
            am_paddings: [batch, am_max_len], 0s then 1s (1 = padding frame).
            lm_data: [batch, lm_max_len, input_dim], usually from [BOS] + labels.
            lm_paddings: [batch, lm_max_len], U + 1 0s (BOS and the labels) then 1s.
            target_labels: int [batch, lm_max_len], the labels (no BOS or EOS).

        Returns:
            (loss, per_example): loss is the mean of the valid examples' -log P(y|x);
            per_example has "log_prob_blank", "log_prob_y" (padded as by `apply_paddings`),
            "log_prob_alignments", "is_valid_example" and "loss" ([batch], 0 when invalid).
        """
        cfg = self.config

        def example_fn(am: _Seq, lm: _Seq, labels: Tensor) -> NestedTensor:
            labels_onehot = jax.nn.one_hot(labels, cfg.vocab_size)

            # One frame at a time, keeping only blank and the target label of the vocab
            # log-probabilities (no [am_len, lm_len, vocab] tensor).
            def frame_fn(am_t: Tensor):
                pred = self.predict(am_t[None], lm.data)
                log_prob_y = jnp.sum(pred["log_prob_tokens"][0] * labels_onehot, axis=-1)
                return pred["log_prob_blank"][0], log_prob_y

            log_prob_blank, log_prob_y = jax.lax.map(frame_fn, am.data)
            _, padded = checkify.checkify(apply_paddings, errors=checkify.user_checks)(
                log_prob_blank=log_prob_blank,
                log_prob_y=log_prob_y,
                am_paddings=am.paddings,
                lm_paddings=lm.paddings,
            )
            return dict(log_prob_alignments=log_prob_alignments(**padded), **padded)

        per_example = jax.vmap(example_fn)(
            _Seq(am_data, am_paddings), _Seq(lm_data, lm_paddings), target_labels
        )
        is_valid = jnp.logical_and(
            jnp.sum(1 - lm_paddings, axis=-1) > 0, jnp.sum(1 - am_paddings, axis=-1) > 0
        )
        per_example["is_valid_example"] = is_valid
        per_example["loss"] = -per_example["log_prob_alignments"] * is_valid
        loss = per_example["loss"].sum() / jnp.maximum(1, is_valid.sum())
        return loss, per_example
