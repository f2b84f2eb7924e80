"""The decoder-only transformer: embeddings, transformer stack, output norm and LM head.

Decoding with a KV cache:

    states = decoder.init_states(batch_size=B, max_sequence_length=L)           # empty cache
    states, out = decoder.prefill_states(time_step=t, input_ids=ids)           # ids: [B, L]
    states, out = decoder.extend_step(cached_states=states, input_ids=next_ids)  # [B, 1]

`prefill_states` processes all of `input_ids` (logits for every position) and continues at
`time_step`; each `extend_step` writes one token at the current time step and returns its
logits. `sample_decode` runs the whole loop (greedy when temperature is 0).
"""

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
    Configurable,
    InstantiableConfig,
    Required,
    config_class,
)
from axlearn.common.decoding import DecodeOutputs, decode_loop, infer_initial_time_step
from axlearn.common.embedding import TransformerTextEmbeddings
from axlearn.common.layers import Dropout, LayerNorm, set_dropout_rate_recursively
from axlearn.common.module import Module, child_context, new_output_collection
from axlearn.common.utils import NestedTensor, Tensor, with_sharding_constraint


class DecodingLayer(Configurable):
    """The decoding algorithm of a Decoder: KV-cached greedy or sampled generation.

    `decode` runs `axlearn.common.decoding.decode_loop`; subclasses may implement other search
    strategies with the same interface.
    """

    def decode(self, **kwargs) -> DecodeOutputs:
        """Runs the decode loop; see `axlearn.common.decoding.decode_loop` for arguments."""
        return decode_loop(**kwargs)


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


def _segment_ids_from_input_ids(input_ids: Tensor, *, pad_token_id: int) -> Tensor:
    """1 up to and including the last non-pad token of each row, 0 for the trailing padding."""
    non_pad = (input_ids != pad_token_id).astype(jnp.int32)
    return jax.lax.cummax(non_pad, axis=input_ids.ndim - 1, reverse=True)


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
        # The decoding algorithm.
        decoding: InstantiableConfig = DecodingLayer.default_config()

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
        self._decoding = cfg.decoding.instantiate()
        self._pad_token_id = cfg.pad_token_id
        self._eos_token_id = cfg.eos_token_id
        self._logits_partition_spec = cfg.logits_partition_spec

    def _logits(self, x: Tensor) -> dict[str, Tensor]:
        if "output_norm" in self.children:
            x = self.output_norm(x)
        x = self.output_dropout(x)
        if "lm_head" in self.children:
            logits = self.lm_head(x)
        else:
            with child_context("emb_attend", module=self.emb):
                logits = self.emb.attend(x)
        if logits.ndim == len(self._logits_partition_spec):
            logits = with_sharding_constraint(logits, PartitionSpec(*self._logits_partition_spec))
        return dict(logits=logits, hidden_states=x)

    def forward(
        self,
        input_ids: Tensor,
        *,
        input_segment_ids: Optional[Tensor] = None,
        token_type_ids: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
        cross_attention_data: Optional[Tensor] = None,
        cross_attention_logit_biases: Optional[Tensor] = None,
    ) -> dict[str, Tensor]:
        """Computes logits for every position.

        Args:
            input_ids: Int [batch, seq_len].
            input_segment_ids: Optional int [batch, seq_len] segment ids of packed sequences
                (tokens attend only within their segment; 0 is padding).
            token_type_ids: Optional int [batch, seq_len].
            positions: Optional int [batch, seq_len] positions (restarting per packed segment);
                None means arange(seq_len).
            cross_attention_data: Optional [batch, source_len, source_dim].
            cross_attention_logit_biases: Optional cross-attention biases.

        Returns:
            {"logits": [batch, seq_len, vocab], "hidden_states": [batch, seq_len, dim]}.
        """
        x = self.emb(input_ids, token_type_ids=token_type_ids, positions=positions)
        biases = self.compute_attention_logit_biases(
            input_ids, segment_ids=input_segment_ids, positions=positions
        )
        out = self.transformer(
            x,
            self_attention_logit_biases=biases,
            target_segment_ids=input_segment_ids,
            target_positions=positions,
            cross_attention_data=cross_attention_data,
            cross_attention_logit_biases=cross_attention_logit_biases,
        )
        return self._logits(out.data)

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

    def init_states(self, *, batch_size: int, max_sequence_length: int) -> NestedTensor:
        """An empty decoding cache for `batch_size` sequences of up to `max_sequence_length`."""
        spec = jax.ShapeDtypeStruct(
            (batch_size, max_sequence_length, self.config.dim), self.dtype()
        )
        state, _ = self.transformer.init_states(time_step=None, data=spec)
        return dict(
            transformer_state=state,
            input_ids=jnp.full((batch_size, max_sequence_length), self._pad_token_id, jnp.int32),
            time_step=jnp.zeros([batch_size], jnp.int32),
        )

    def prefill_states(
        self, *, time_step: Tensor, input_ids: Tensor
    ) -> tuple[NestedTensor, dict[str, Tensor]]:
        """Processes `input_ids` [batch, max_len] and returns the cache to continue at time_step.

        Args:
            time_step: Int [batch]: where decoding continues (e.g. the prompt lengths).
            input_ids: Int [batch, max_len]: the prompts, right-padded to the cache length.

        Returns:
            (states, outputs) with outputs["logits"] [batch, max_len, vocab] for every position.
        """
        x = self.emb(input_ids)
        biases = self.compute_attention_logit_biases(input_ids)
        state, out = self.transformer.init_states(
            time_step=time_step, data=x, self_attention_logit_biases=biases
        )
        states = dict(transformer_state=state, input_ids=input_ids, time_step=time_step)
        return states, self._logits(out.data)

    def extend_step(
        self, *, cached_states: NestedTensor, input_ids: Tensor
    ) -> tuple[NestedTensor, dict[str, Tensor]]:
        """Consumes one token per row at its time step.

        Args:
            cached_states: From `init_states`, `prefill_states` or `extend_step`.
            input_ids: Int [batch, 1].

        Returns:
            (updated states, outputs) with outputs["logits"] [batch, 1, vocab].
        """
        time_step = cached_states["time_step"]
        cached_ids = cached_states["input_ids"]
        max_len = cached_ids.shape[1]
        one_hot = jax.nn.one_hot(time_step, max_len, dtype=cached_ids.dtype)
        ids = cached_ids * (1 - one_hot) + input_ids * one_hot
        biases = None
        if "attention_mask" in self.children:
            full = self.compute_attention_logit_biases(
                ids, segment_ids=jnp.ones_like(ids), positions=jnp.arange(max_len)[None]
            )
            full = jnp.broadcast_to(full, (ids.shape[0], *full.shape[1:]))
            biases = jnp.take_along_axis(full, time_step[:, None, None, None], axis=2, mode="clip")
        x = self.emb(input_ids, positions=time_step[:, None])
        state, out = self.transformer.extend_step(
            cached_states["transformer_state"], x, self_attention_logit_biases=biases
        )
        states = dict(transformer_state=state, input_ids=ids, time_step=time_step + 1)
        return states, self._logits(out.data)

    def sample_decode(
        self,
        *,
        prefix: Tensor,
        max_decode_len: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        prng_key: Optional[Tensor] = None,
        stop_at_eos: bool = True,
    ) -> DecodeOutputs:
        """Generates `max_decode_len` tokens after each prompt with the KV cache.

        Args:
            prefix: Int [batch, prefix_len] prompts, right-padded with pad_token_id (each row
                needs at least one token).
            max_decode_len: Number of tokens to generate.
            temperature: 0 for greedy decoding, else the sampling temperature.
            top_k: Optional top-k filtering for sampling.
            top_p: Optional nucleus filtering for sampling.
            prng_key: Sampling key; defaults to the invocation's key.
            stop_at_eos: Whether rows stop (emit pad_token_id) after eos_token_id.

        Returns:
            DecodeOutputs with sequences [batch, prefix_len + max_decode_len].
        """
        batch, prefix_len = prefix.shape
        total = prefix_len + max_decode_len
        ids = jnp.concatenate(
            [prefix, jnp.full((batch, max_decode_len), self._pad_token_id, prefix.dtype)], axis=1
        ).astype(jnp.int32)
        time_step = infer_initial_time_step(prefix, pad_id=self._pad_token_id)
        states, out = self.prefill_states(time_step=time_step, input_ids=ids)
        last = jnp.clip(time_step - 1, 0, total - 1)
        init_logits = jnp.take_along_axis(out["logits"], last[:, None, None], axis=1)[:, 0]
        if prng_key is None and temperature > 0:
            prng_key = self.prng_key

        def step_fn(token_ids, states):
            # Summaries from inside the loop are discarded (they would leak scan tracers).
            with child_context(
                "decode_step", module=self, output_collection=new_output_collection()
            ):
                states, step_out = self.extend_step(cached_states=states, input_ids=token_ids)
            return step_out["logits"][:, -1], states

        return self._decoding.decode(
            step_fn=step_fn,
            init_states=states,
            init_logits=init_logits,
            sequences=ids,
            time_step=time_step,
            num_steps=max_decode_len,
            prng_key=prng_key,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_id=self._eos_token_id if stop_at_eos else None,
            pad_id=self._pad_token_id,
        )

    def greedy_decode(self, *, prefix: Tensor, max_decode_len: int, **kwargs) -> DecodeOutputs:
        """`sample_decode` with temperature 0 (argmax at every step)."""
        return self.sample_decode(
            prefix=prefix, max_decode_len=max_decode_len, temperature=0.0, **kwargs
        )
