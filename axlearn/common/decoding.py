"""Autoregressive decoding: sampling and beam search over a cached decoder.

Both loops follow AXLearn's conventions. `inputs` [batch, length] holds each prompt, starting
with a prompt token (e.g. BOS) and right-padded with `pad_id`; `time_step` [batch] is the index
of each prompt's last token (`infer_initial_time_step`). The loop feeds the token at `time_step`
to `tokens_to_scores(token_ids [batch * num_decodes, 1], cache) -> (log_probs [batch *
num_decodes, vocab], cache)` (e.g. `Decoder.extend_step` on a KV cache prefilled up to
`time_step`), writes the chosen token at `time_step + 1`, and so on. Non-pad tokens of `inputs`
after `time_step` are forced (teacher forcing). Outputs drop the first (prompt) token: their
position j holds the token at input position j + 1.

`sample_decode` draws `num_decodes` samples per prompt from softmax(scores) (temperature, top-k
and top-p go into `tokens_to_scores` through `axlearn.common.logit_modifiers`; top-k with k=1 is
greedy decoding) and stops rows on a `StopDecodingCondition` (e.g. `StopOnSubsequence([[eos]])`).
`beam_search_decode` keeps `num_decodes` beams and returns the best finished (EOS-terminated)
and live sequences.
"""

from typing import Callable, Literal, NamedTuple, Optional, Protocol

import jax
import jax.numpy as jnp

from axlearn.common.decoding_conditions import (  # noqa: F401 (public under this module's path)
    CompositeDecodingCondition,
    StopDecodingCondition,
    StopOnMaxLength,
    StopOnSubsequence,
)
from axlearn.common.decoding_merge import (  # noqa: F401 (public under this module's path)
    PrefixMerger,
    _merge_prefixes,
    compute_merge_matrix_by_prefix_ids,
)
from axlearn.common.utils import NestedTensor, Tensor, vectorized_tree_map

# "Effectively -inf" for scores: finite so that sums of a few stay finite.
NEG_INF = -1.0e7

# Logits of disallowed tokens after top-k / top-p filtering.
_MASKED_LOGIT = -1e30


def top_k_logits(logits: Tensor, k: int) -> Tensor:
    """Keeps the `k` largest logits of the last axis (ties at the k-th value are kept).

    Args:
        logits: [..., vocab].
        k: Number of tokens to keep (>= 1).

    Returns:
        Logits with the others set to a very negative value.

    Raises:
        ValueError: If k < 1.
    """
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    k = min(k, logits.shape[-1])
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return jnp.where(logits < kth, _MASKED_LOGIT, logits)


def top_p_logits(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering: keeps the smallest set of most likely tokens with probability >= p.

    The most likely token is always kept.

    Args:
        logits: [..., vocab].
        p: Cumulative probability threshold in (0, 1].

    Returns:
        Logits with the others set to a very negative value.

    Raises:
        ValueError: If p is not in (0, 1].
    """
    if not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    order = jnp.argsort(-logits, axis=-1)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits.astype(jnp.float32), axis=-1)
    # Mass strictly before each token in sorted order; keep a token if that mass is < p.
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < p
    keep = jnp.zeros_like(keep_sorted)
    keep = jnp.put_along_axis(keep, order, keep_sorted, axis=-1, inplace=False)
    return jnp.where(keep, logits, _MASKED_LOGIT)


def sample_tokens(
    prng_key: Optional[Tensor],
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
) -> Tensor:
    """Picks next tokens: argmax if temperature == 0, else samples softmax(logits / temperature).

    Args:
        prng_key: PRNG key (unused and may be None for temperature 0).
        logits: [batch, vocab].
        temperature: Softmax temperature (>= 0).
        top_k: If set, sample among the top_k most likely tokens only.
        top_p: If set, sample from the nucleus of probability top_p only.

    Returns:
        Int32 token ids [batch].

    Raises:
        ValueError: If temperature is negative or a key is missing for sampling.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    logits = logits.astype(jnp.float32)
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if prng_key is None:
        raise ValueError("Sampling with temperature > 0 needs a prng_key")
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_logits(logits, top_k)
    if top_p is not None:
        logits = top_p_logits(logits, top_p)
    return jax.random.categorical(prng_key, logits, axis=-1).astype(jnp.int32)


def infer_initial_time_step(prefix: Tensor, *, pad_id: int) -> Tensor:
    """The index of each prompt's last non-pad token (0 for an all-padding prompt).

    Padding inside a prompt is allowed; only the last non-pad token counts.

    Args:
        prefix: Int tensor [batch, ..., length].
        pad_id: The padding id.

    Returns:
        Int32 [batch, ...] with values in [0, length).
    """
    positions = jnp.arange(prefix.shape[-1], dtype=jnp.int32)
    return jnp.max(jnp.where(prefix != pad_id, positions, 0), axis=-1).astype(jnp.int32)


# ------------------------------------------------------------------------------------------
# The decoding dimension.
# ------------------------------------------------------------------------------------------


def add_decoding_dim(x: Tensor, num_decodes: int) -> Tensor:
    """Tiles a non-scalar [batch, ...] into [batch, num_decodes, ...] (scalars pass through)."""
    if x.ndim == 0:
        return x
    return jnp.repeat(jnp.expand_dims(x, 1), num_decodes, axis=1)


def flatten_decoding_dim(x: Tensor) -> Tensor:
    """Merges the first two axes of a non-scalar: [batch, num_decodes, ...] -> [batch * n, ...]."""
    if x.ndim == 0:
        return x
    return x.reshape((-1, *x.shape[2:]))


def unflatten_decoding_dim(x: Tensor, batch_size: int, num_decodes: int) -> Tensor:
    """Splits the first axis of a non-scalar: [batch * num_decodes, ...] -> [batch, n, ...].

    Raises:
        ValueError: If the first axis is not batch_size * num_decodes.
    """
    if x.ndim == 0:
        return x
    if x.shape[0] != batch_size * num_decodes:
        raise ValueError(
            f"Expected a leading axis of {batch_size} * {num_decodes}, got shape {x.shape}"
        )
    return x.reshape((batch_size, num_decodes, *x.shape[1:]))


def _gather_beams(
    nested: NestedTensor,
    beam_indices: Tensor,
    batch_size: int,
    old_beam_size: int,
    new_beam_size: int,
    one_hot: bool = True,
) -> NestedTensor:
    """Reorders beams: out[b, k] = x[b, beam_indices[b, k]] for every leaf with ndim > 1.

    Args:
        nested: A tree of [batch_size, old_beam_size, ...] leaves (leaves of ndim <= 1, e.g.
            scalars, pass through).
        beam_indices: Int [batch_size, new_beam_size] with values in [0, old_beam_size).
        batch_size: The batch size.
        old_beam_size: The beams of the leaves.
        new_beam_size: The beams of the result.
        one_hot: Gather by a one-hot contraction (partitions well under SPMD) instead of
            indexing.

    Returns:
        The tree with [batch_size, new_beam_size, ...] leaves.

    Raises:
        ValueError: If beam_indices is not [batch_size, new_beam_size].
    """
    if tuple(beam_indices.shape) != (batch_size, new_beam_size):
        raise ValueError(
            f"beam_indices.shape {tuple(beam_indices.shape)} != "
            f"(batch_size, new_beam_size) ({batch_size}, {new_beam_size})"
        )

    def gather(x):
        if x.ndim < 2:
            return x
        if one_hot:
            dtype = jnp.int32 if x.dtype == jnp.bool_ else x.dtype
            selector = jax.nn.one_hot(beam_indices, old_beam_size, dtype=dtype)
            out = jnp.einsum("bno,bo...->bn...", selector, jnp.asarray(x, dtype))
            return out.astype(x.dtype)
        idx = beam_indices.reshape(beam_indices.shape + (1,) * (x.ndim - 2))
        return jnp.take_along_axis(jnp.asarray(x), idx, axis=1)

    return vectorized_tree_map(gather, nested)


def _gather_decodes(tree: NestedTensor, indices: Tensor) -> NestedTensor:
    """out[b, k] = x[b, indices[b, k]] for every [batch, num_decodes, ...] leaf of `tree`."""
    batch, beams = indices.shape
    return _gather_beams(tree, indices, batch, beams, beams, one_hot=False)


def _write_at(buffer: Tensor, index: Tensor, value: Tensor) -> Tensor:
    """buffer[b, k, index[b]] = value[b, k]; an index past the end writes nothing."""
    mask = jax.nn.one_hot(index, buffer.shape[-1], dtype=jnp.bool_)[:, None, :]
    return jnp.where(mask, value[..., None].astype(buffer.dtype), buffer)


def _read_at(buffer: Tensor, index: Tensor) -> Tensor:
    """buffer[b, k, index[b]] (indices past the end read the last position)."""
    return jnp.take_along_axis(buffer, index[:, None, None], axis=2, mode="clip")[..., 0]


def _run_loop(loop: str, cond_fn, body_fn, init):
    if loop == "lax":
        return jax.lax.while_loop(cond_fn, body_fn, init)
    if loop == "python":
        state = init
        while bool(cond_fn(state)):
            state = body_fn(state)
        return state
    raise NotImplementedError(f"loop must be 'lax' or 'python', got {loop!r}")


def _check_inputs(inputs: Tensor, time_step: Tensor, max_decode_len: int) -> None:
    """Checks the batch sizes and that the prompts fit in `max_decode_len` positions.

    Raises:
        ValueError: If they do not.
    """
    if inputs.shape[0] != time_step.shape[0]:
        raise ValueError(
            f"Expected inputs.shape[0] ({inputs.shape[0]}) == time_step.shape[0] "
            f"({time_step.shape[0]})."
        )
    if inputs.shape[1] > max_decode_len:
        raise ValueError(
            f"Expected inputs.shape[1] ({inputs.shape[1]}) <= max_decode_len ({max_decode_len})."
        )


# ------------------------------------------------------------------------------------------
# Stop conditions.
# ------------------------------------------------------------------------------------------


class SampleOutputs(NamedTuple):
    """Results of `sample_decode`.

    Fields:
        sequences: Int32 [batch, num_decodes, max_decode_len]: position j is the token at input
            position j + 1 (prompt tokens, then samples; pad_id after a stop).
        token_scores: Float32 [batch, num_decodes, max_decode_len]: log-probability of each
            token in `sequences` under the (modified) scores; 0 after a stop.
    """

    sequences: Tensor
    token_scores: Tensor


TokensToScoresFn = Callable[[Tensor, NestedTensor], tuple[Tensor, NestedTensor]]


class DecodingState(NamedTuple):
    """The loop state of `sample_decode`.

    Fields:
        cur_index: Int32 [batch]: the position of the token fed next.
        sequences: Int32 [batch, num_decodes, max_decode_len] (max_decode_len counts the first,
            prompt token).
        token_scores: Float32 [batch, num_decodes, max_decode_len]: log-probabilities.
        stop_decoding: Bool [batch, num_decodes]: which sequences stopped.
        cache: The decoder state, leaves [batch, num_decodes, ...] (or scalars).
        prng_key: The random key.
    """

    cur_index: Tensor
    sequences: Tensor
    token_scores: Tensor
    stop_decoding: Tensor
    cache: NestedTensor
    prng_key: Tensor


def _decode_init(
    *,
    inputs: Tensor,
    time_step: Tensor,
    num_decodes: int,
    max_decode_len: int,
    cache: NestedTensor,
    prng_key: Tensor,
    pad_id: int,
    token_scores: Optional[Tensor] = None,
) -> DecodingState:
    """The initial `sample_decode` state.

    Args:
        inputs: Int [batch, length], length <= max_decode_len.
        time_step: Int [batch]: index of each prompt's last token.
        num_decodes: Samples per prompt.
        max_decode_len: Length of the sequences, counting the first (prompt) token.
        cache: Decoder state after the prompt, leaves [batch, ...] (tiled num_decodes times).
        prng_key: The random key.
        pad_id: The padding id (fills `sequences` after `inputs`).
        token_scores: Optional float [batch, length'] (length' < max_decode_len): entry j scores
            input token j + 1 (the first token has no score).

    Returns:
        The state.

    Raises:
        ValueError: If shapes are inconsistent.
    """
    _check_inputs(inputs, time_step, max_decode_len)
    batch_size, length = inputs.shape
    sequences = jnp.full((batch_size, num_decodes, max_decode_len), pad_id, jnp.int32)
    sequences = sequences.at[:, :, :length].set(jnp.asarray(inputs)[:, None, :].astype(jnp.int32))
    scores = jnp.zeros((batch_size, num_decodes, max_decode_len), jnp.float32)
    if token_scores is not None:
        n = token_scores.shape[1]
        if n >= max_decode_len:
            raise ValueError(f"Expected token_scores.shape[1] ({n}) < {max_decode_len}.")
        scores = scores.at[:, :, 1 : 1 + n].set(
            jnp.asarray(token_scores)[:, None, :].astype(jnp.float32)
        )
    return DecodingState(
        cur_index=jnp.asarray(time_step).astype(jnp.int32),
        sequences=sequences,
        token_scores=scores,
        stop_decoding=jnp.zeros((batch_size, num_decodes), bool),
        cache=vectorized_tree_map(lambda x: add_decoding_dim(x, num_decodes), cache),
        prng_key=prng_key,
    )


def sample_decode(
    *,
    inputs: Tensor,
    time_step: Tensor,
    cache: NestedTensor,
    tokens_to_scores: TokensToScoresFn,
    stop_decoding_condition: StopDecodingCondition,
    num_decodes: int,
    prng_key: Tensor,
    max_decode_len: Optional[int] = None,
    loop: Literal["lax", "python"] = "lax",
    pad_id: int = 0,
    input_token_scores: Optional[Tensor] = None,
) -> SampleOutputs:
    """Samples `num_decodes` continuations of each prompt (see the module docstring).

    Args:
        inputs: Int [batch, length]: prompts padded with `pad_id`, length <= max_decode_len + 1.
        time_step: Int [batch]: index of each prompt's last token.
        cache: Decoder state after the prompt (leaves [batch, ...], scalars, or stacked under a
            VDict); it is tiled `num_decodes` times.
        tokens_to_scores: (token_ids [batch * n, 1], cache) -> (scores [batch * n, vocab],
            cache). Tokens are drawn from softmax(scores).
        stop_decoding_condition: When a sequence stops (it then emits pad_id).
        num_decodes: Samples per prompt.
        prng_key: Random key.
        max_decode_len: Length of the sequences (default: inputs.shape[1]).
        loop: "lax" (jax.lax.while_loop) or "python" (for debugging).
        pad_id: The padding id (it also marks where forced prompt tokens end).
        input_token_scores: Optional float [batch, length'] scores of the prompt tokens
            (entry j scores input token j + 1), length' < max_decode_len + 1.

    Returns:
        SampleOutputs.

    Raises:
        ValueError: If shapes are inconsistent.
    """
    batch_size = inputs.shape[0]
    if max_decode_len is None:
        max_decode_len = inputs.shape[1]
    total = max_decode_len + 1  # One more slot: the output drops the first token.
    init = _decode_init(
        inputs=inputs,
        time_step=time_step,
        num_decodes=num_decodes,
        max_decode_len=total,
        cache=cache,
        prng_key=prng_key,
        pad_id=pad_id,
        token_scores=input_token_scores,
    )
    prefix_len = init.cur_index + 1

    def cond_fn(state: DecodingState):
        active = (state.cur_index < total - 1) & ~state.stop_decoding.all(axis=1)
        return active.any()

    def body_fn(state: DecodingState) -> DecodingState:
        index = state.cur_index
        token_ids = flatten_decoding_dim(_read_at(state.sequences, index)[..., None])
        flat_cache = vectorized_tree_map(flatten_decoding_dim, state.cache)
        scores, flat_cache = tokens_to_scores(token_ids, flat_cache)
        scores = unflatten_decoding_dim(scores, batch_size, num_decodes).astype(jnp.float32)
        new_cache = vectorized_tree_map(
            lambda x: unflatten_decoding_dim(x, batch_size, num_decodes), flat_cache
        )
        prng_key, sample_key = jax.random.split(state.prng_key)
        sampled = jax.random.categorical(sample_key, scores, axis=-1).astype(jnp.int32)
        next_index = index + 1
        forced = _read_at(state.sequences, next_index)
        out_of_prompt = forced == pad_id
        token = jnp.where(out_of_prompt, sampled, forced)
        log_prob = jnp.take_along_axis(scores, token[..., None], axis=-1)[..., 0]
        stopped = state.stop_decoding
        token = jnp.where(stopped, pad_id, token)
        log_prob = jnp.where(stopped, 0.0, log_prob)
        sequences = _write_at(state.sequences, next_index, token)
        token_scores = _write_at(state.token_scores, next_index, log_prob)
        stop_now = out_of_prompt & stop_decoding_condition(
            index=jnp.minimum(next_index, total - 1),
            sequences=sequences,
            prefix_len=prefix_len,
        )
        return DecodingState(
            cur_index=next_index,
            sequences=sequences,
            token_scores=token_scores,
            stop_decoding=stopped | stop_now,
            cache=new_cache,
            prng_key=prng_key,
        )

    final = _run_loop(loop, cond_fn, body_fn, init)
    return SampleOutputs(
        sequences=final.sequences[:, :, 1:], token_scores=final.token_scores[:, :, 1:]
    )


# ------------------------------------------------------------------------------------------
# Beam search.
# ------------------------------------------------------------------------------------------


class BrevityPenaltyFn(Protocol):
    """Normalizes beam scores by length."""

    def __call__(self, *, length: Tensor, raw_scores: Tensor) -> Tensor:
        """Returns normalized scores of the shape of `raw_scores`.

        Args:
            length: Sequence lengths, broadcastable to raw_scores [batch, num_decodes].
            raw_scores: Summed log-probabilities.
        """


def brevity_penalty_fn(*, alpha: float = 0.0, bp_type: Literal["t5", "hf"] = "t5"):
    """A brevity penalty dividing scores by a length penalty (alpha=0: no normalization).

    Args:
        alpha: The exponent.
        bp_type: "t5": ((5 + length) / 6) ** alpha; "hf": length ** alpha.

    Returns:
        A BrevityPenaltyFn.

    Raises:
        NotImplementedError: For another bp_type.
    """
    if bp_type not in ("t5", "hf"):
        raise NotImplementedError(f"bp_type must be 't5' or 'hf', got {bp_type!r}")

    def fn(*, length: Tensor, raw_scores: Tensor) -> Tensor:
        length = jnp.asarray(length, jnp.float32)
        base = (5.0 + length) / 6.0 if bp_type == "t5" else length
        return raw_scores / jnp.power(base, alpha)

    return fn


class BeamSearchOutputs(NamedTuple):
    """Results of `beam_search_decode`, best first.

    Fields:
        sequences: Int32 [batch, num_decodes, max_decode_len]: finished sequences (ending with
            EOS), position j holding input position j + 1.
        scores: Float32 [batch, num_decodes]: their length-normalized log-probabilities
            (NEG_INF-ish for empty slots).
        live_sequences: Int32 [batch, num_decodes, max_decode_len]: the best unfinished ones.
        live_scores: Float32 [batch, num_decodes]: their (unnormalized) log-probabilities.
    """

    sequences: Tensor
    scores: Tensor
    live_sequences: Tensor
    live_scores: Tensor


class _BeamState(NamedTuple):
    """The loop state of `beam_search_decode` (lengths count the first, prompt token).

    Fields:
        cur_index: Int32 [batch]: the position of the token fed next.
        live_scores: Float32 [batch, beams]: log-probabilities of the live beams.
        finished_scores: Float32 [batch, beams]: normalized scores of the finished ones.
        live_seqs: Int32 [batch, beams, max_decode_len].
        finished_seqs: Int32 [batch, beams, max_decode_len].
        cache: The decoder state, leaves [batch, beams, ...] (or scalars).
        prefix_merger: The PrefixMerger's state (None without one).
    """

    cur_index: Tensor
    live_scores: Tensor
    finished_scores: Tensor
    live_seqs: Tensor
    finished_seqs: Tensor
    cache: NestedTensor
    prefix_merger: NestedTensor


def _beam_init(
    *,
    inputs: Tensor,
    time_step: Tensor,
    beam_size: int,
    max_decode_len: int,
    cache: NestedTensor,
    pad_id: int,
    prefix_merger: Optional[PrefixMerger] = None,
) -> _BeamState:
    """The initial beam search state: every beam holds the prompt, only the first one is alive.

    Args:
        inputs: Int [batch, length], length <= max_decode_len.
        time_step: Int [batch]: index of each prompt's last token.
        beam_size: The number of beams.
        max_decode_len: Length of the sequences, counting the first (prompt) token.
        cache: Decoder state after the prompt, leaves [batch, ...] (tiled beam_size times).
        pad_id: The padding id (fills the sequences after `inputs`).
        prefix_merger: Optional; its `init_state` gets the initial live sequences.

    Returns:
        The state.

    Raises:
        ValueError: If shapes are inconsistent.
    """
    _check_inputs(inputs, time_step, max_decode_len)
    batch_size, length = inputs.shape
    live_seqs = jnp.full((batch_size, beam_size, max_decode_len), pad_id, jnp.int32)
    live_seqs = live_seqs.at[:, :, :length].set(jnp.asarray(inputs)[:, None, :].astype(jnp.int32))
    first_only = jnp.asarray([0.0] + [NEG_INF] * (beam_size - 1), jnp.float32)
    return _BeamState(
        cur_index=jnp.asarray(time_step).astype(jnp.int32),
        live_scores=jnp.tile(first_only, (batch_size, 1)),
        finished_scores=jnp.full((batch_size, beam_size), NEG_INF, jnp.float32),
        live_seqs=live_seqs,
        finished_seqs=jnp.zeros((batch_size, beam_size, max_decode_len), jnp.int32),
        cache=vectorized_tree_map(lambda x: add_decoding_dim(x, beam_size), cache),
        prefix_merger=None if prefix_merger is None else prefix_merger.init_state(tokens=live_seqs),
    )


def beam_search_decode(
    *,
    inputs: Tensor,
    time_step: Tensor,
    cache: NestedTensor,
    tokens_to_scores: TokensToScoresFn,
    eos_id: int,
    num_decodes: int,
    max_decode_len: Optional[int] = None,
    loop: Literal["lax", "python"] = "lax",
    brevity_penalty: Optional[BrevityPenaltyFn] = None,
    pad_id: int = 0,
    prefix_merger: Optional[PrefixMerger] = None,
) -> BeamSearchOutputs:
    """Beam search with `num_decodes` beams (see the module docstring for the conventions).

    At every step each live beam is extended by every token; a candidate ending in `eos_id`
    competes for the finished set (score normalized by `brevity_penalty` at its length), the
    others for the `num_decodes` live beams. The search stops at `max_decode_len` or once no
    live beam can beat the worst finished one. Note that one beam is not greedy decoding: every
    beam's EOS continuation is a finished candidate.

    Args:
        inputs: Int [batch, length]: prompts padded with `pad_id`, length <= max_decode_len + 1.
        time_step: Int [batch]: index of each prompt's last token.
        cache: Decoder state after the prompt (see `sample_decode`).
        tokens_to_scores: (token_ids [batch * beams, 1], cache) -> (log_probs [batch * beams,
            vocab], cache); higher is better.
        eos_id: End-of-sequence id.
        num_decodes: Number of beams (and of returned sequences).
        max_decode_len: Length of the sequences (default: inputs.shape[1]).
        loop: "lax" or "python".
        brevity_penalty: Length normalization of finished scores (default: none).
        pad_id: The padding id.
        prefix_merger: Optional `PrefixMerger`: it is updated with every token fed to
            `tokens_to_scores` (prompt tokens included, EOS not), and before each step the live
            beams it merges pool their probabilities into the receiving beam.

    Returns:
        BeamSearchOutputs.

    Raises:
        ValueError: If shapes are inconsistent.
    """
    if brevity_penalty is None:
        brevity_penalty = brevity_penalty_fn(alpha=0.0)
    batch_size = inputs.shape[0]
    beams = num_decodes
    if max_decode_len is None:
        max_decode_len = inputs.shape[1]
    total = max_decode_len + 1
    init = _beam_init(
        inputs=inputs,
        time_step=time_step,
        beam_size=beams,
        max_decode_len=total,
        cache=cache,
        pad_id=pad_id,
        prefix_merger=prefix_merger,
    )
    first_only = init.live_scores[:1]
    inputs = jnp.asarray(inputs).astype(jnp.int32)

    def cond_fn(state: _BeamState):
        not_at_end = state.cur_index < total - 1
        best_live = brevity_penalty(
            length=jnp.asarray(total), raw_scores=state.live_scores.max(axis=1)
        )
        worst_finished = state.finished_scores.min(axis=1)
        return (not_at_end & ~(worst_finished > best_live)).any()

    def body_fn(state: _BeamState) -> _BeamState:
        index = state.cur_index
        next_index = index + 1
        current = _read_at(state.live_seqs, index)  # [batch, beams].
        flat_cache = vectorized_tree_map(flatten_decoding_dim, state.cache)
        log_probs, flat_cache = tokens_to_scores(
            flatten_decoding_dim(current[..., None]), flat_cache
        )
        log_probs = unflatten_decoding_dim(log_probs, batch_size, beams).astype(jnp.float32)
        new_cache = vectorized_tree_map(
            lambda x: unflatten_decoding_dim(x, batch_size, beams), flat_cache
        )
        live_scores, merger_state = state.live_scores, state.prefix_merger
        if prefix_merger is not None:
            merger_state = prefix_merger.update(tokens=current, state=merger_state)
            live_scores = _merge_prefixes(
                prefix_merger.compute(merger_state), log_probs=live_scores
            )
        vocab = log_probs.shape[-1]
        log_probs = log_probs + live_scores[..., None]  # [batch, beams, vocab].
        finishing_scores = log_probs[:, :, eos_id]
        log_probs = log_probs.at[:, :, eos_id].add(NEG_INF)  # Live beams do not end in EOS.
        top_scores, top_flat = jax.lax.top_k(log_probs.reshape(batch_size, beams * vocab), beams)
        top_tokens, top_beams = top_flat % vocab, top_flat // vocab

        # Inside the prompt, the next token is forced and only the first beam stays alive.
        forced = jnp.take_along_axis(inputs, next_index[:, None], axis=1, mode="clip")
        in_prompt = forced != pad_id  # [batch, 1].
        new_live_scores = jnp.where(in_prompt, first_only, top_scores)
        tokens = jnp.where(in_prompt, forced, top_tokens)
        live_seqs = _write_at(_gather_decodes(state.live_seqs, top_beams), next_index, tokens)
        live_cache = _gather_decodes(new_cache, top_beams)
        if prefix_merger is not None:
            merger_state = _gather_decodes(merger_state, top_beams)

        finishing_scores = brevity_penalty(length=next_index[:, None], raw_scores=finishing_scores)
        finishing_scores = jnp.where(in_prompt, NEG_INF, finishing_scores)
        finishing_seqs = _write_at(
            state.live_seqs, next_index, jnp.full((batch_size, beams), eos_id)
        )
        all_scores = jnp.concatenate([state.finished_scores, finishing_scores], axis=1)
        all_seqs = jnp.concatenate([state.finished_seqs, finishing_seqs], axis=1)
        finished_scores, best = jax.lax.top_k(all_scores, beams)
        finished_seqs = _gather_beams(all_seqs, best, batch_size, 2 * beams, beams, one_hot=False)

        # Rows past the end keep their state (rows start at different time steps).
        done = next_index >= total

        def keep(old, new):
            mask = done.reshape(done.shape + (1,) * (new.ndim - 1))
            return jnp.where(mask, old, new)

        return _BeamState(
            cur_index=next_index,
            live_scores=keep(state.live_scores, new_live_scores),
            finished_scores=keep(state.finished_scores, finished_scores),
            live_seqs=keep(state.live_seqs, live_seqs),
            finished_seqs=keep(state.finished_seqs, finished_seqs),
            cache=live_cache,
            prefix_merger=merger_state,
        )

    final = _run_loop(loop, cond_fn, body_fn, init)
    return BeamSearchOutputs(
        sequences=final.finished_seqs[:, :, 1:],
        scores=final.finished_scores,
        live_sequences=final.live_seqs[:, :, 1:],
        live_scores=final.live_scores,
    )
