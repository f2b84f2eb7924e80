"""The decoder-only transformer: embeddings, transformer stack, output norm and LM head.

Signatures follow AXLearn's `axlearn.common.decoder`:

    out = decoder(input_batch=dict(input_ids=ids))                       # {"logits", ...}
    states = decoder.init_states(batch_size=B, max_sequence_length=L)     # empty cache
    states, out = decoder.prefill_states(time_step=t, input_batch=dict(input_ids=ids))
    states, out = decoder.extend_step(cached_states=states, input_ids=next_ids)  # [B, 1]
    out = decoder.sample_decode(input_batch=dict(prefix=p), max_sequence_length=L, num_decodes=n)
    out = decoder.beam_search_decode(input_batch=dict(prefix=p), max_sequence_length=L,
                                     num_decodes=n)

`prefill_states` processes all of `input_ids` [B, L] (logits for every position) and leaves the
cache holding positions < `time_step`; each `extend_step` writes one token per row at its time
step and returns its logits. `sample_decode` and `beam_search_decode` (run by the `decoding`
child, a `DecodingLayer`) use `axlearn.common.decoding`'s conventions: the prompt starts with a
prompt token (e.g. BOS) and the outputs drop it.
"""

import contextlib
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.attention import (
    CausalAttentionLogitBiasLayer,
    StackedTransformerLayer,
)
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import (
    REQUIRED,
    ConfigOr,
    Configurable,
    InstantiableConfig,
    Required,
    config_class,
    maybe_instantiate,
)
from axlearn.common.decoding import (
    BeamSearchOutputs,
    BrevityPenaltyFn,
    SampleOutputs,
    StopDecodingCondition,
    StopOnSubsequence,
    beam_search_decode,
    infer_initial_time_step,
    sample_decode,
)
from axlearn.common.embedding import TransformerTextEmbeddings
from axlearn.common.layers import Dropout, Embedding, LayerNorm, set_dropout_rate_recursively
from axlearn.common.logit_modifiers import LogitsToLogitsFn
from axlearn.common.module import (
    Module,
    child_context,
    current_context,
    functional,
    new_output_collection,
    nowrap,
)
from axlearn.common.utils import (
    Nested,
    NestedTensor,
    Tensor,
    validate_contains_paths,
    with_sharding_constraint,
)


@contextlib.contextmanager
def _temporary_output_collection():
    """Sends summaries/outputs of the enclosed calls to a throw-away collection.

    Used inside decoding loops, whose summaries would otherwise leak loop tracers. No child
    context is entered, so the module path is unchanged.
    """
    ctx = current_context()
    saved = ctx.output_collection
    ctx.output_collection = new_output_collection()
    try:
        yield
    finally:
        ctx.output_collection = saved


def _scores_from_logits(
    logits: Tensor, logits_modifier: Optional[LogitsToLogitsFn] = None
) -> Tensor:
    """log_softmax(logits) in float32, then the optional modifier."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    if logits_modifier is not None:
        log_probs = logits_modifier(log_probs)
    return log_probs


def _cross_attention_step_kwargs(kwargs: dict, *, rows: int, time_step: Optional[Tensor]) -> dict:
    """Fits the cross-attention inputs of a decoding step to its `rows` (batch * num_decodes).

    `cross_attention_data` [batch, source_len, dim] and `cross_attention_logit_biases`
    [batch, (heads,) target_len, source_len] are repeated per decode (row b * n + k reads example
    b, as `decoding.flatten_decoding_dim` orders them); biases with target_len > 1 keep the row of
    each decode's `time_step` (the query position of the step).

    Args:
        kwargs: The decoding kwargs (other keys pass through unchanged).
        rows: The step's leading dim.
        time_step: Int [rows], the position of the step's token (needed for per-position biases).

    Returns:
        The kwargs for `extend_step`.

    Raises:
        ValueError: If rows is not a multiple of the cross-attention batch.
    """
    out = dict(kwargs)
    for key in ("cross_attention_data", "cross_attention_logit_biases"):
        x = out.get(key)
        if x is None:
            continue
        if rows % x.shape[0] != 0:
            raise ValueError(
                f"{key} has batch {x.shape[0]}, which does not divide the {rows} decoding rows."
            )
        x = jnp.repeat(x, rows // x.shape[0], axis=0)
        if key == "cross_attention_logit_biases":
            if x.ndim == 3:
                x = x[:, None]
            if x.shape[-2] > 1:
                if time_step is None:
                    raise ValueError(
                        "cross_attention_logit_biases with target_len > 1 need the cache's "
                        "time_step to pick each step's row."
                    )
                x = jnp.take_along_axis(x, time_step[:, None, None, None], axis=2, mode="clip")
        out[key] = x
    return out


class DecodingLayer(Configurable):
    """The decoding algorithms of a decoder: sampling and beam search on its KV cache.

    Works with any decoder offering `prefill_states(time_step=, input_batch=)`,
    `extend_step(cached_states=, input_ids=)` and `prng_key`.
    """

    @config_class
    class Config(Configurable.Config):
        """Configures DecodingLayer (pad and EOS ids come from the decoder)."""

    def __init__(self, cfg: Config, *, decoder: Module, pad_token_id: int, eos_token_id: int):
        super().__init__(cfg)
        self._decoder = decoder
        self._pad_token_id = pad_token_id
        self._eos_token_id = eos_token_id

    def _prefill(
        self, input_batch: Nested[Tensor], max_sequence_length: int, **kwargs
    ) -> tuple[Tensor, Tensor, NestedTensor, NestedTensor]:
        validate_contains_paths(input_batch, paths=["prefix"])
        prefix = input_batch["prefix"]
        if prefix.shape[1] > max_sequence_length:
            raise ValueError(
                f"{self.path()}: prefix length {prefix.shape[1]} > max_sequence_length "
                f"{max_sequence_length}; shorten the prefix or raise max_sequence_length."
            )
        pad = jnp.full(
            (prefix.shape[0], max_sequence_length - prefix.shape[1]),
            self._pad_token_id,
            prefix.dtype,
        )
        input_ids = jnp.concatenate([prefix, pad], axis=1).astype(jnp.int32)
        time_step = infer_initial_time_step(prefix, pad_id=self._pad_token_id)
        batch = {k: v for k, v in input_batch.items() if k != "prefix"}
        batch["input_ids"] = input_ids
        states, outputs = self._decoder.prefill_states(
            time_step=time_step, input_batch=batch, **kwargs
        )
        return input_ids, time_step, states, outputs

    def _tokens_to_scores(self, logits_modifier: Optional[LogitsToLogitsFn], **kwargs):
        def tokens_to_scores(token_ids: Tensor, cache: NestedTensor):
            step_kwargs = _cross_attention_step_kwargs(
                kwargs, rows=token_ids.shape[0], time_step=cache.get("time_step")
            )
            with _temporary_output_collection():
                cache, outputs = self._decoder.extend_step(
                    cached_states=cache, input_ids=token_ids, **step_kwargs
                )
            return _scores_from_logits(outputs["logits"][:, -1], logits_modifier), cache

        return tokens_to_scores

    def sample_decode(
        self,
        *,
        input_batch: Nested[Tensor],
        max_sequence_length: int,
        num_decodes: int,
        logits_modifier: Optional[ConfigOr[LogitsToLogitsFn]] = None,
        stop_decoding_condition: Optional[StopDecodingCondition] = None,
        **kwargs,
    ) -> SampleOutputs:
        """Samples `num_decodes` continuations of each prompt.

        Args:
            input_batch: {"prefix": int [batch, prefix_len]} prompts starting with a prompt
                token, right-padded with pad_token_id; other keys go to `prefill_states`.
            max_sequence_length: Length of the cache and of the returned sequences.
            num_decodes: Samples per prompt.
            logits_modifier: Applied to the log-probabilities before sampling (e.g.
                `logit_modifiers.top_k_logits(1)` for greedy decoding).
            stop_decoding_condition: Default: stop after eos_token_id.
            **kwargs: Passed to `prefill_states` and `extend_step`.

        Returns:
            SampleOutputs with sequences [batch, num_decodes, max_sequence_length].
        """
        prng_key = self._decoder.prng_key
        if prng_key is None:
            raise ValueError(
                f"{self.path()}: sample_decode needs a PRNG key (got None): invoke the model with "
                "one (e.g. functional(model, prng_key, ...)); greedy decoding also needs one."
            )
        logits_modifier = maybe_instantiate(logits_modifier)
        input_ids, time_step, states, outputs = self._prefill(
            input_batch, max_sequence_length, **kwargs
        )
        scores = _scores_from_logits(outputs["logits"], logits_modifier)
        # Score of input token j + 1 given tokens <= j.
        next_ids = jnp.roll(input_ids, -1, axis=1)[..., None]
        input_token_scores = jnp.take_along_axis(scores, next_ids, axis=-1)[..., 0]
        return sample_decode(
            inputs=input_ids,
            time_step=time_step,
            cache=states,
            tokens_to_scores=self._tokens_to_scores(logits_modifier, **kwargs),
            stop_decoding_condition=(
                stop_decoding_condition or StopOnSubsequence([[self._eos_token_id]])
            ),
            num_decodes=num_decodes,
            prng_key=prng_key,
            pad_id=self._pad_token_id,
            input_token_scores=input_token_scores,
        )

    def beam_search_decode(
        self,
        *,
        input_batch: Nested[Tensor],
        max_sequence_length: int,
        num_decodes: int,
        brevity_penalty: Optional[BrevityPenaltyFn] = None,
        **kwargs,
    ) -> BeamSearchOutputs:
        """Beam search with `num_decodes` beams.

        Args:
            input_batch: {"prefix": ...} as in `sample_decode`.
            max_sequence_length: Length of the cache and of the returned sequences.
            num_decodes: Number of beams.
            brevity_penalty: Length normalization (see `decoding.brevity_penalty_fn`).
            **kwargs: Passed to `prefill_states` and `extend_step`.

        Returns:
            BeamSearchOutputs.
        """
        input_ids, time_step, states, _ = self._prefill(input_batch, max_sequence_length, **kwargs)
        return beam_search_decode(
            inputs=input_ids,
            time_step=time_step,
            cache=states,
            tokens_to_scores=self._tokens_to_scores(None, **kwargs),
            eos_id=self._eos_token_id,
            num_decodes=num_decodes,
            brevity_penalty=brevity_penalty,
            pad_id=self._pad_token_id,
        )


class LmHead(BaseLayer):
    """An untied output head: logits = x @ weight.T with weight [vocab_size, embedding_dim]."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures LmHead."""

        vocab_size: Required[int] = REQUIRED  # Output vocabulary size.
        embedding_dim: Required[int] = REQUIRED  # Input hidden dim.

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.param_partition_spec = (None, "model")
        return cfg

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        return dict(
            weight=ParameterSpec(
                shape=(cfg.vocab_size, cfg.embedding_dim), mesh_axes=cfg.param_partition_spec
            )
        )

    def forward(self, x: Tensor) -> Tensor:
        """Returns logits [..., vocab_size]."""
        return jnp.einsum("...d,vd->...v", x, self.parameters["weight"])


def _segment_ids_from_causal_input_ids(input_ids: Tensor, *, pad_token_id: int) -> Tensor:
    """1 up to and including the last non-pad token of each row, 0 for the trailing padding."""
    non_pad = (input_ids != pad_token_id).astype(jnp.int32)
    return jax.lax.cummax(non_pad, axis=input_ids.ndim - 1, reverse=True)


# The earlier name.
_segment_ids_from_input_ids = _segment_ids_from_causal_input_ids


class Decoder(BaseLayer):
    """A decoder-only transformer mapping token ids to next-token logits."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures Decoder."""

        # Optional layer producing self-attention biases (causal + segments). May be None when
        # the attention layers mask causally themselves (attention.causal=True).
        attention_mask: Optional[InstantiableConfig] = (
            CausalAttentionLogitBiasLayer.default_config()
        )
        vocab_size: Required[int] = REQUIRED  # Vocabulary size.
        dim: Required[int] = REQUIRED  # Model (embedding) dim.
        # Dropout rate for child Dropout layers whose rate is unset.
        dropout_rate: float = 0.0
        # The input embeddings.
        emb: InstantiableConfig = TransformerTextEmbeddings.default_config()
        # The transformer stack.
        transformer: InstantiableConfig = StackedTransformerLayer.default_config()
        # Optional normalization of the transformer output.
        output_norm: Optional[InstantiableConfig] = LayerNorm.default_config()
        # Dropout on the transformer output (rate defaults to dropout_rate).
        output_dropout: InstantiableConfig = Dropout.default_config()
        # Optional untied LM head (e.g. LmHead); None ties the head to emb.token_emb.
        lm_head: Optional[InstantiableConfig] = None
        pad_token_id: int = 0  # Padding token id.
        eos_token_id: int = 1  # End-of-sequence token id.
        # Partition spec of the logits [batch, seq_len, vocab].
        logits_partition_spec: tuple = ("data", None, "model")
        # The decoding algorithms (sample_decode, beam_search_decode).
        decoding: InstantiableConfig = DecodingLayer.default_config()
        # None, or jnp.float32 to run the LM head's matmul in float32 (the head input is upcast;
        # the logits are cast back to the head input's dtype).
        logits_forward_dtype: Optional[jnp.dtype] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        set_dropout_rate_recursively(cfg, dropout_rate=cfg.dropout_rate, set_only_if_none=True)
        if cfg.attention_mask is not None:
            self._add_child("attention_mask", cfg.attention_mask)
        self._add_child("emb", cfg.emb.clone(dim=cfg.dim, vocab_size=cfg.vocab_size))
        self._add_child("transformer", cfg.transformer.clone(input_dim=cfg.dim))
        if cfg.output_norm is not None:
            self._add_child("output_norm", cfg.output_norm.clone(input_dim=cfg.dim))
        self._add_child("output_dropout", cfg.output_dropout)
        if cfg.lm_head is not None:
            self._add_child(
                "lm_head", cfg.lm_head.clone(vocab_size=cfg.vocab_size, embedding_dim=cfg.dim)
            )
        self._decoding = cfg.decoding.instantiate(
            decoder=self, pad_token_id=cfg.pad_token_id, eos_token_id=cfg.eos_token_id
        )
        self._pad_token_id = cfg.pad_token_id
        self._eos_token_id = cfg.eos_token_id
        self._logits_partition_spec = cfg.logits_partition_spec
        if cfg.logits_forward_dtype is not None and cfg.logits_forward_dtype != jnp.float32:
            raise ValueError(
                f"{self.path()}.logits_forward_dtype must be None or jnp.float32, got "
                f"{jnp.dtype(cfg.logits_forward_dtype).name}; set it to None or jnp.float32."
            )

    def _head_input(self, x: Tensor) -> Tensor:
        """The transformer output after the output norm and dropout: what the LM head reads."""
        if "output_norm" in self.children:
            x = self.output_norm(x)
        return self.output_dropout(x)

    def lm_head_weight(self) -> Tensor:
        """The LM head's weight [vocab_size, dim] (the tied token embedding table by default).

        Returns:
            `lm_head.weight` if the head is untied, else `emb.token_emb.weight`.

        Raises:
            NotImplementedError: If the head or the tied embedding is not the plain
                `LmHead` / `layers.Embedding` (whose logits are hidden @ weight.T).
        """
        if "lm_head" in self.children:
            if type(self.lm_head) is not LmHead:
                raise NotImplementedError(
                    f"{self.path()}.lm_head is a {type(self.lm_head).__name__}; the chunked loss "
                    "supports LmHead only (unset the model's logits_chunk_size)."
                )
            return self.parameters["lm_head"]["weight"]
        token_emb = self.emb.token_emb
        if type(token_emb) is not Embedding:
            raise NotImplementedError(
                f"{self.path()}.emb.token_emb is a {type(token_emb).__name__}; the chunked loss "
                "supports layers.Embedding only (unset the model's logits_chunk_size)."
            )
        return self.parameters["emb"]["token_emb"]["weight"]

    @nowrap
    def lm_head_soft_cap(self) -> Optional[float]:
        """The soft cap of the logits (`emb.soft_cap_logits` of a tied head), or None."""
        if "lm_head" in self.children:
            return None
        return getattr(self.emb.config, "soft_cap_logits", None)

    def _logits(self, x: Tensor) -> dict[str, Tensor]:
        x = self._head_input(x)
        return dict(logits=self._head_logits(x), hidden_states=x)

    def _head_logits(self, x: Tensor) -> Tensor:
        """The LM head (untied `lm_head` or tied `emb.attend`) applied to head inputs `x`."""
        forward_dtype = self.config.logits_forward_dtype
        out_dtype = x.dtype
        if forward_dtype is not None:
            x = x.astype(forward_dtype)
        if "lm_head" in self.children:
            logits = self.lm_head(x)
        else:
            with child_context("emb_attend", module=self.emb):
                logits = self.emb.attend(x)
        if forward_dtype is not None:
            logits = logits.astype(out_dtype)
        if logits.ndim == len(self._logits_partition_spec):
            logits = with_sharding_constraint(logits, PartitionSpec(*self._logits_partition_spec))
        return logits

    def compute_logits(self, forward_outputs: dict[str, Tensor]) -> Tensor:
        """Logits [batch, seq_len, vocab] from `forward`'s outputs (AXLearn's two-step form).

        Args:
            forward_outputs: The dict `forward` returns; its "hidden_states" (the LM head's
                input) are projected by the head again.

        Returns:
            The logits, equal to forward_outputs["logits"].

        Raises:
            KeyError: If forward_outputs has no "hidden_states".
        """
        if "hidden_states" not in forward_outputs:
            raise KeyError(
                f"{self.path()}.compute_logits: forward_outputs has no 'hidden_states' (keys "
                f"{sorted(forward_outputs)}); pass the dict Decoder.forward returns."
            )
        return self._head_logits(forward_outputs["hidden_states"])

    def forward(
        self,
        input_batch: Nested[Tensor],
        *,
        cross_attention_data: Optional[Tensor] = None,
        cross_attention_logit_biases: Optional[Tensor] = None,
    ) -> dict[str, Tensor]:
        """Computes logits for every position.

        Args:
            input_batch: A dict with
                input_ids: Int [batch, seq_len].
                input_segment_ids: Optional int [batch, seq_len] segment ids of packed
                    sequences (tokens attend only within their segment; 0 is padding).
                token_type_ids: Optional int [batch, seq_len].
                positions: Optional int [batch, seq_len] positions (restarting per packed
                    segment); None means arange(seq_len).
            cross_attention_data: Optional [batch, source_len, source_dim].
            cross_attention_logit_biases: Optional cross-attention biases.

        Returns:
            {"logits": [batch, seq_len, vocab], "hidden_states": [batch, seq_len, dim]}.

        Raises:
            KeyError: If input_batch has no "input_ids".
        """
        out = self._transformer_output(
            input_batch,
            cross_attention_data=cross_attention_data,
            cross_attention_logit_biases=cross_attention_logit_biases,
        )
        return self._logits(out)

    def head_inputs(
        self,
        input_batch: Nested[Tensor],
        *,
        cross_attention_data: Optional[Tensor] = None,
        cross_attention_logit_biases: Optional[Tensor] = None,
    ) -> dict[str, Tensor]:
        """What `forward` computes before the LM head, for a loss that applies the head itself.

        Args:
            input_batch: As in `forward`.
            cross_attention_data: As in `forward`.
            cross_attention_logit_biases: As in `forward`.

        Returns:
            {"hidden_states": [batch, seq_len, dim] (after output norm and dropout),
             "lm_head_weight": [vocab, dim]} (logits would be hidden_states @ lm_head_weight.T).
        """
        out = self._transformer_output(
            input_batch,
            cross_attention_data=cross_attention_data,
            cross_attention_logit_biases=cross_attention_logit_biases,
        )
        return dict(hidden_states=self._head_input(out), lm_head_weight=self.lm_head_weight())

    def _transformer_output(
        self,
        input_batch: Nested[Tensor],
        *,
        cross_attention_data: Optional[Tensor],
        cross_attention_logit_biases: Optional[Tensor],
    ) -> Tensor:
        """The transformer stack's output [batch, seq_len, dim] (before the output norm)."""
        validate_contains_paths(input_batch, paths=["input_ids"])
        input_ids = input_batch["input_ids"]
        segment_ids = input_batch.get("input_segment_ids")
        positions = input_batch.get("positions")
        x = self.emb(
            input_ids, token_type_ids=input_batch.get("token_type_ids"), positions=positions
        )
        biases = self.compute_attention_logit_biases(
            input_ids, segment_ids=segment_ids, positions=positions
        )
        out = self.transformer(
            x,
            self_attention_logit_biases=biases,
            target_segment_ids=segment_ids,
            target_positions=positions,
            cross_attention_data=cross_attention_data,
            cross_attention_logit_biases=cross_attention_logit_biases,
        )
        return out.data

    def compute_attention_logit_biases(
        self,
        input_ids: Tensor,
        *,
        segment_ids: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
    ) -> Optional[Tensor]:
        """Self-attention biases from `attention_mask` ([batch, 1, T, T]), or None if unset.

        Without segment ids, tokens up to each row's last non-pad token form one segment and
        the trailing padding another; without positions, arange(seq_len) is used.
        """
        if "attention_mask" not in self.children:
            return None
        if segment_ids is None:
            segment_ids = _segment_ids_from_input_ids(input_ids, pad_token_id=self._pad_token_id)
        if positions is None:
            positions = jnp.arange(input_ids.shape[-1])[None]
        return self.attention_mask(segment_ids=segment_ids, positions=positions)

    def init_states(
        self, *, batch_size: int, max_sequence_length: int, dtype: Optional[jnp.dtype] = None
    ) -> NestedTensor:
        """An empty decoding cache for `batch_size` sequences of up to `max_sequence_length`.

        Args:
            batch_size: Number of sequences.
            max_sequence_length: Cache length.
            dtype: The activation dtype the caches store in (unless their `cache_dtype` is
                set); None means the layer dtype.

        Returns:
            {"transformer_state", "input_ids", "time_step"}.
        """
        if current_context() is None:
            # Called directly on the layer: an empty cache needs no parameters.
            kwargs = dict(batch_size=batch_size, max_sequence_length=max_sequence_length)
            state, _ = functional(
                self, None, None, dict(kwargs, dtype=dtype), method="init_states", is_training=False
            )
            return state
        spec = jax.ShapeDtypeStruct(
            (batch_size, max_sequence_length, self.config.dim), dtype or self.dtype()
        )
        state, _ = self.transformer.init_states(time_step=None, data=spec)
        return dict(
            transformer_state=state,
            input_ids=jnp.full((batch_size, max_sequence_length), self._pad_token_id, jnp.int32),
            time_step=jnp.zeros([batch_size], jnp.int32),
        )

    def prefill_states(
        self,
        *,
        time_step: Tensor,
        input_batch: Nested[Tensor],
        cross_attention_data: Optional[Tensor] = None,
        cross_attention_logit_biases: Optional[Tensor] = None,
    ) -> tuple[NestedTensor, dict[str, Tensor]]:
        """Processes `input_batch["input_ids"]` [batch, max_len]; the cache continues at time_step.

        Args:
            time_step: Int [batch]: where decoding continues; the cache holds the positions
                before it (later positions are overwritten by `extend_step`).
            input_batch: {"input_ids": int [batch, max_len]} (optional "token_type_ids"), the
                prompts right-padded to the cache length. Packed inputs are not supported.
            cross_attention_data: Optional [batch, source_len, source_dim].
            cross_attention_logit_biases: Optional cross-attention biases.

        Returns:
            (states, outputs) with outputs["logits"] [batch, max_len, vocab] for every position.

        Raises:
            ValueError: If input_batch has "input_segment_ids".
        """
        validate_contains_paths(input_batch, paths=["input_ids"])
        if input_batch.get("input_segment_ids") is not None:
            raise ValueError(
                f"{self.path()}: prefill_states does not support input_segment_ids (given); "
                "pass the batch without them (one sequence per row)."
            )
        input_ids = input_batch["input_ids"]
        x = self.emb(input_ids, token_type_ids=input_batch.get("token_type_ids"))
        biases = self.compute_attention_logit_biases(input_ids)
        state, out = self.transformer.init_states(
            time_step=time_step,
            data=x,
            self_attention_logit_biases=biases,
            cross_attention_data=cross_attention_data,
            cross_attention_logit_biases=cross_attention_logit_biases,
        )
        states = dict(transformer_state=state, input_ids=input_ids, time_step=time_step)
        return states, self._logits(out.data)

    def extend_step(
        self,
        *,
        cached_states: NestedTensor,
        input_ids: Optional[Tensor] = None,
        input_batch: Optional[Nested[Tensor]] = None,
        is_prefill: bool = False,
        cross_attention_data: Optional[Tensor] = None,
        cross_attention_logit_biases: Optional[Tensor] = None,
    ) -> tuple[NestedTensor, dict[str, Tensor]]:
        """Consumes `steps` tokens per row from its time step (or prefills an empty cache).

        Args:
            cached_states: From `init_states`, `prefill_states` or `extend_step`.
            input_ids: Int [batch, steps] (or give `input_batch`).
            input_batch: AXLearn's form: {"input_ids": [batch, steps]} with optional
                "input_segment_ids" (with `is_prefill`: 0 marks padding after the prompt).
            is_prefill: Whether `input_ids` is a prompt filling an empty cache: every position
                gets its logits (as `prefill_states`) and time_step becomes the prompt length
                (the non-zero segment ids; all steps without them).
            cross_attention_data: Optional [batch, source_len, source_dim].
            cross_attention_logit_biases: Optional biases [batch, (heads,) steps, source_len].

        Returns:
            (updated states, outputs) with outputs["logits"] [batch, steps, vocab].

        Raises:
            ValueError: If both or neither of input_ids and input_batch are given.
        """
        segment_ids = None
        if (input_ids is None) == (input_batch is None):
            raise ValueError(
                f"{self.path()}.extend_step: pass exactly one of input_ids and input_batch "
                f"(got input_ids={'set' if input_ids is not None else None}, "
                f"input_batch={'set' if input_batch is not None else None})."
            )
        if input_batch is not None:
            validate_contains_paths(input_batch, paths=["input_ids"])
            input_ids = input_batch["input_ids"]
            segment_ids = input_batch.get("input_segment_ids")
        time_step = cached_states["time_step"]
        cached_ids = cached_states["input_ids"]
        batch, steps = input_ids.shape
        max_len = cached_ids.shape[1]
        positions = time_step[:, None] + jnp.arange(steps)[None]
        write = jax.nn.one_hot(positions, max_len, dtype=cached_ids.dtype)  # [batch, steps, L].
        ids = cached_ids * (1 - write.sum(axis=1)) + jnp.einsum(
            "bt,btl->bl", input_ids.astype(cached_ids.dtype), write
        )
        biases = None
        if "attention_mask" in self.children:
            if is_prefill:
                # The prompt attends to its own tokens, as in `prefill_states`.
                biases = self.compute_attention_logit_biases(input_ids)
            else:
                full = self.compute_attention_logit_biases(
                    ids, segment_ids=jnp.ones_like(ids), positions=jnp.arange(max_len)[None]
                )
                full = jnp.broadcast_to(full, (batch, *full.shape[1:]))
                biases = jnp.take_along_axis(full, positions[:, None, :, None], axis=2, mode="clip")
        x = self.emb(input_ids, positions=positions)
        prefill_kwargs = dict(is_prefill=True, target_segment_ids=segment_ids) if is_prefill else {}
        state, out = self.transformer.extend_step(
            cached_states["transformer_state"],
            x,
            self_attention_logit_biases=biases,
            cross_attention_data=cross_attention_data,
            cross_attention_logit_biases=cross_attention_logit_biases,
            **prefill_kwargs,
        )
        if is_prefill and segment_ids is not None:
            advance = jnp.sum(segment_ids != 0, axis=1).astype(time_step.dtype)
        else:
            advance = steps
        states = dict(transformer_state=state, input_ids=ids, time_step=time_step + advance)
        return states, self._logits(out.data)

    def sample_decode(
        self,
        *,
        input_batch: Nested[Tensor],
        max_sequence_length: int,
        num_decodes: int,
        **kwargs,
    ) -> SampleOutputs:
        """Sample decoding; see `DecodingLayer.sample_decode`."""
        return self._decoding.sample_decode(
            input_batch=input_batch,
            max_sequence_length=max_sequence_length,
            num_decodes=num_decodes,
            **kwargs,
        )

    def beam_search_decode(
        self,
        *,
        input_batch: Nested[Tensor],
        max_sequence_length: int,
        num_decodes: int,
        **kwargs,
    ) -> BeamSearchOutputs:
        """Beam search; see `DecodingLayer.beam_search_decode`."""
        return self._decoding.beam_search_decode(
            input_batch=input_batch,
            max_sequence_length=max_sequence_length,
            num_decodes=num_decodes,
            **kwargs,
        )
