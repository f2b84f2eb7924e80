"""Token generation of `InferenceRunner` on the KV cache (public under `axlearn.common.inference`).

`DecodingMixin` holds the runner's sampling, streaming and beam-search methods; it needs the
runner's `params`, `_mesh`, `_to_mesh`, `_cached_jit`, `context_length` and `config.model`.
`logits_modifier` maps a sampling setting (temperature, top-k, top-p) to a logits modifier.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common import decoding, logit_modifiers
from axlearn.common.module import functional as F
from axlearn.common.utils import NestedTensor, Tensor


class BeamResult(NamedTuple):
    """The best beam of a prompt.

    Fields:
        tokens: The generated ids (without EOS) of the best finished beam, or of the best live
            beam if none finished.
        score: Its (length-normalized, if finished) log-probability.
        live_tokens: The best live (unfinished) beam's ids; with one beam this is greedy
            decoding.
        live_score: Its log-probability.
    """

    tokens: list[int]
    score: float
    live_tokens: list[int]
    live_score: float


class DecodingMixin:
    """Sampling, streaming and beam search of `InferenceRunner` (see the module docstring)."""

    def _check_length(self, prefix_length: int, max_new_tokens: int) -> int:
        """Returns the decoders' `max_sequence_length` for `max_new_tokens` new tokens.

        The decoders' outputs hold input positions 1..length (position j holds input position
        j + 1), so the new tokens after a prompt of `prefix_length` tokens fill
        `prefix_length - 1 + max_new_tokens` positions (asking for one more would decode, and for
        beam search score, a token the caller never sees).
        """
        if max_new_tokens < 1:
            raise ValueError(
                f"{self.path()}: max_new_tokens must be >= 1, got {max_new_tokens}; pass 1 or more."
            )
        context = self.context_length
        if context is not None and prefix_length + max_new_tokens > context:
            raise ValueError(
                f"max_new_tokens={max_new_tokens}: the prompt ({prefix_length} tokens) plus the "
                f"new tokens exceed the model's context of {context} tokens (the sequence length "
                f"it was trained on); ask for at most {max(0, context - prefix_length)} new tokens "
                "(or a shorter prompt)."
            )
        return prefix_length - 1 + max_new_tokens

    @property
    def pad_token_id(self) -> int:
        """The decoder's padding id."""
        return int(self.config.model.decoder.pad_token_id)

    @property
    def eos_token_id(self) -> int:
        """The decoder's end-of-sequence id (also the experiments' prompt token)."""
        return int(self.config.model.decoder.eos_token_id)

    def _decoder_call(
        self, params: NestedTensor, method: str, inputs: dict[str, Any], prng_key: Tensor
    ) -> Any:
        """Calls `model.decoder.<method>(**inputs)` with the model parameters `params`."""
        outputs, _ = F(
            self.model.decoder,
            prng_key=prng_key,
            state=params["decoder"],
            inputs=inputs,
            is_training=False,
            method=method,
        )
        return outputs

    def sample_decode(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        stop_tokens: Optional[Sequence[int]] = None,
        seed: int = 0,
    ) -> list[list[int]]:
        """Samples a continuation of each prompt with `decoding.sample_decode` on the KV cache.

        Args:
            prompts: Token ids, each starting with a prompt token (e.g. BOS; the experiments
                use the EOS id), of any lengths (batched together, right-padded).
            max_new_tokens: The most tokens generated per prompt.
            temperature: 0 is greedy decoding; see `logits_modifier`.
            top_k: See `logits_modifier`.
            top_p: See `logits_modifier`.
            stop_tokens: A row stops after any of these; default: the EOS id.
            seed: The sampling seed; the same seed gives the same tokens.

        Returns:
            Per prompt, the generated ids (without the stop token).

        Raises:
            ValueError: On an empty prompt or a value out of range.
        """
        if max_new_tokens < 1:
            raise ValueError(
                f"{self.path()}: max_new_tokens must be >= 1, got {max_new_tokens}; pass 1 or more."
            )
        modifier = logits_modifier(temperature=temperature, top_k=top_k, top_p=top_p)
        stops = list(stop_tokens) if stop_tokens is not None else [self.eos_token_id]
        prefix = _pad_prompts(prompts, pad_id=self.pad_token_id)
        length = self._check_length(prefix.shape[1], max_new_tokens)
        stop = decoding.StopOnSubsequence([[t] for t in stops]) if stops else _never_stop

        def fn(params, prefix, prng_key):
            return self._decoder_call(
                params,
                "sample_decode",
                dict(
                    input_batch=dict(prefix=prefix),
                    max_sequence_length=length,
                    num_decodes=1,
                    logits_modifier=modifier,
                    stop_decoding_condition=stop,
                ),
                prng_key,
            )

        with jax.set_mesh(self._mesh):
            jitted = self._cached_jit(
                ("sample", length, temperature, top_k, top_p, tuple(stops)), lambda: fn
            )
            outputs = jitted(self.params, self._to_mesh(prefix), jax.random.PRNGKey(seed))
        sequences = np.asarray(jax.device_get(outputs.sequences))[:, 0]
        # Output position j holds input position j + 1: prompt i's first new token is at
        # len(prompt) - 1.
        return [
            _cut(sequences[i, len(p) - 1 : len(p) - 1 + max_new_tokens], stops)
            for i, p in enumerate(prompts)
        ]

    def stream_sample(
        self,
        prompt: Sequence[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        stop_tokens: Optional[Sequence[int]] = None,
        seed: int = 0,
    ) -> Iterator[int]:
        """Yields the tokens of `sample_decode([prompt], ...)` one by one as they are sampled.

        Each step is one jitted call of the decoder's `extend_step` on the KV cache, followed by
        the same key split and draw as `decoding.sample_decode`, so the same seed gives the same
        tokens.

        Args:
            prompt: Token ids starting with a prompt token.
            max_new_tokens: See `sample_decode`.
            temperature: See `sample_decode`.
            top_k: See `sample_decode`.
            top_p: See `sample_decode`.
            stop_tokens: See `sample_decode`.
            seed: See `sample_decode`.

        Yields:
            Token ids (the stop token is not yielded).
        """
        if max_new_tokens < 1:
            raise ValueError(
                f"{self.path()}: max_new_tokens must be >= 1, got {max_new_tokens}; pass 1 or more."
            )
        modifier = logits_modifier(temperature=temperature, top_k=top_k, top_p=top_p)
        stops = list(stop_tokens) if stop_tokens is not None else [self.eos_token_id]
        prefix = _pad_prompts([prompt], pad_id=self.pad_token_id)
        length = self._check_length(prefix.shape[1], max_new_tokens)
        input_ids = np.full((1, length), self.pad_token_id, np.int32)
        input_ids[:, : prefix.shape[1]] = prefix
        time_step = np.asarray([len(prompt) - 1], np.int32)

        def prefill(params, input_ids, time_step, prng_key):
            states, _ = self._decoder_call(
                params,
                "prefill_states",
                dict(time_step=time_step, input_batch=dict(input_ids=input_ids)),
                prng_key,
            )
            return states

        def step(params, states, token, prng_key):
            states, outputs = self._decoder_call(
                params,
                "extend_step",
                dict(cached_states=states, input_ids=token[:, None]),
                prng_key,
            )
            log_probs = jax.nn.log_softmax(outputs["logits"][:, -1].astype(jnp.float32), axis=-1)
            scores = modifier(log_probs) if modifier is not None else log_probs
            prng_key, sample_key = jax.random.split(prng_key)
            token = jax.random.categorical(sample_key, scores, axis=-1).astype(jnp.int32)
            return states, token, prng_key

        key = jax.random.PRNGKey(seed)
        settings = (length, temperature, top_k, top_p)
        step_fn = self._cached_jit(("stream_step", *settings), lambda: step, donate_argnums=(1,))
        with jax.set_mesh(self._mesh):
            states = self._cached_jit(("stream_prefill", length), lambda: prefill)(
                self.params, self._to_mesh(input_ids), self._to_mesh(time_step), key
            )
            token = jnp.asarray(input_ids[:, len(prompt) - 1])
            for _ in range(max_new_tokens):
                states, token, key = step_fn(self.params, states, token, key)
                value = int(jax.device_get(token)[0])
                if value in stops:
                    return
                yield value

    def beam_search_decode(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        num_beams: int,
        length_penalty: float = 0.0,
    ) -> list[BeamResult]:
        """The best beam of each prompt by `decoding.beam_search_decode` on the KV cache.

        Args:
            prompts: As in `sample_decode`.
            max_new_tokens: The most tokens generated per prompt.
            num_beams: The number of beams.
            length_penalty: Scores are divided by ((5 + length) / 6) ** length_penalty.

        Returns:
            Per prompt, the best finished beam (ending with EOS) or, if none finished, the best
            live one: its tokens (without EOS) and score.

        Raises:
            ValueError: On an empty prompt or a value out of range.
        """
        if max_new_tokens < 1:
            raise ValueError(
                f"{self.path()}: max_new_tokens must be >= 1, got {max_new_tokens}; pass 1 or more."
            )
        if num_beams < 1:
            raise ValueError(
                f"{self.path()}: num_beams must be >= 1, got {num_beams}; pass 1 or more."
            )
        prefix = _pad_prompts(prompts, pad_id=self.pad_token_id)
        length = self._check_length(prefix.shape[1], max_new_tokens)
        penalty = decoding.brevity_penalty_fn(alpha=length_penalty)

        def fn(params, prefix, prng_key):
            return self._decoder_call(
                params,
                "beam_search_decode",
                dict(
                    input_batch=dict(prefix=prefix),
                    max_sequence_length=length,
                    num_decodes=num_beams,
                    brevity_penalty=penalty,
                ),
                prng_key,
            )

        with jax.set_mesh(self._mesh):
            jitted = self._cached_jit(("beam", length, num_beams, length_penalty), lambda: fn)
            outputs = jax.device_get(
                jitted(self.params, self._to_mesh(prefix), jax.random.PRNGKey(0))
            )
        results = []
        # A search that ends early pads the rest of its beams.
        stop_and_pad = [self.eos_token_id, self.pad_token_id]
        for i, prompt in enumerate(prompts):
            start = len(prompt) - 1
            if outputs.scores[i, 0] > decoding.NEG_INF / 2:
                seq, score = outputs.sequences[i, 0], float(outputs.scores[i, 0])
            else:
                seq, score = outputs.live_sequences[i, 0], float(outputs.live_scores[i, 0])
            live = outputs.live_sequences[i, 0, start : start + max_new_tokens]
            results.append(
                BeamResult(
                    tokens=_cut(seq[start : start + max_new_tokens], stop_and_pad),
                    score=score,
                    live_tokens=_cut(live, stop_and_pad),
                    live_score=float(outputs.live_scores[i, 0]),
                )
            )
        return results


def logits_modifier(
    *, temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None
) -> Optional[logit_modifiers.LogitsToLogitsFn]:
    """The logit modifier of a sampling setting: temperature, then top-k, then top-p.

    Args:
        temperature: 0 is greedy decoding (top-1); otherwise the softmax temperature.
        top_k: Keep the k most likely tokens.
        top_p: Keep the nucleus of probability p.

    Returns:
        The modifier, or None (plain sampling at temperature 1).

    Raises:
        ValueError: If a value is out of range.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logit_modifiers.top_k_logits(1, break_ties="smallest_index")
    mods = []
    if temperature != 1:
        mods.append(logit_modifiers.scale_by(temperature))
    if top_k is not None:
        mods.append(logit_modifiers.top_k_logits(top_k))
    if top_p is not None:
        mods.append(logit_modifiers.top_p_logits(top_p))
    if not mods:
        return None
    return mods[0] if len(mods) == 1 else logit_modifiers.chain(*mods)


def _pad_prompts(prompts: Sequence[Sequence[int]], *, pad_id: int) -> np.ndarray:
    if not prompts:
        raise ValueError("No prompts given.")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"Prompt {i} is empty: it needs at least a prompt token (e.g. BOS).")
        if pad_id in prompt:
            raise ValueError(f"Prompt {i} contains the pad id {pad_id}: {list(prompt)}")
    width = max(len(p) for p in prompts)
    out = np.full((len(prompts), width), pad_id, np.int32)
    for i, prompt in enumerate(prompts):
        out[i, : len(prompt)] = prompt
    return out


def _never_stop(*, index: Tensor, sequences: Tensor, prefix_len: Tensor) -> Tensor:
    """A stop condition that never fires (`stop_tokens=[]`)."""
    del index, prefix_len
    return jnp.zeros(sequences.shape[:2], bool)


def _cut(tokens: Sequence[int], stop_tokens: Sequence[int]) -> list[int]:
    """Tokens up to (excluding) the first stop token."""
    out = []
    for t in tokens:
        if t in stop_tokens:
            break
        out.append(int(t))
    return out
