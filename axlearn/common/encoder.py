"""Encoders: token embeddings and a transformer stack with bidirectional (or causal) attention.

- `Encoder`: input ids [batch, seq_len] -> hidden states [batch, seq_len, dim]; padding
  (`pad_token_id`) and segments are masked by `attention_mask` (full attention by default).
- `CausalEncoder`: the same with causal masking, optionally with `num_cls_tokens` learned tokens
  appended after the inputs (as CoCa's text encoder); returns a dict of hidden states. It decodes
  one token at a time with `init_states` / `prefill_states` / `extend_step` (no cls tokens).
- `EncoderModel`: a `BaseModel` around an encoder with an optional classification `head`
  (`layers.BaseClassificationHead`), e.g. BERT's.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp

from axlearn.common import param_init
from axlearn.common.attention import (
    AttentionLogitBiasLayer,
    BaseTransformerLayer,
    CausalAttentionLogitBiasLayer,
    FullAttentionLogitBiasLayer,
)
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.base_model import BaseModel
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.embedding import TransformerTextEmbeddings
from axlearn.common.layers import BaseClassificationHead, set_dropout_rate_recursively
from axlearn.common.module import Module, child_context, current_context, functional
from axlearn.common.utils import Nested, NestedTensor, Tensor

__all__ = ["CausalEncoder", "Encoder", "EncoderModel"]


class Encoder(BaseLayer):
    """Embeds input ids and runs a transformer stack over them (bidirectional by default)."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures Encoder."""

        dim: Required[int] = REQUIRED  # Hidden dim.
        vocab_size: Required[int] = REQUIRED  # Vocabulary size.
        pad_token_id: Required[int] = REQUIRED  # The input id of padding (masked out).
        # Dropout rate of every descendant whose rate is None.
        dropout_rate: float = 0.0
        # Self-attention masking from segment ids and positions.
        attention_mask: AttentionLogitBiasLayer.Config = (
            FullAttentionLogitBiasLayer.default_config()
        )
        # The input embedding (dim and vocab_size are set from this config).
        emb: TransformerTextEmbeddings.Config = TransformerTextEmbeddings.default_config()
        # The transformer stack (input_dim is set to dim).
        transformer: Required[BaseTransformerLayer.Config] = REQUIRED
        # Optional layer applied to the stack's output (e.g. a prenorm encoder's final norm).
        output: Optional[InstantiableConfig] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        set_dropout_rate_recursively(cfg, dropout_rate=cfg.dropout_rate, set_only_if_none=True)
        self._add_child("emb", cfg.emb.set(dim=cfg.dim, vocab_size=cfg.vocab_size))
        self._add_child("transformer", cfg.transformer.set(input_dim=cfg.dim))
        if cfg.output is not None:
            self._add_child("output", cfg.output.set(input_dim=cfg.dim))
        self._add_child("attention_mask", cfg.attention_mask)

    def _embed(
        self, input_ids: Tensor, *, token_type_ids: Optional[Tensor], positions: Optional[Tensor]
    ) -> Tensor:
        return self.emb(
            input_batch=dict(inputs=input_ids, token_type_ids=token_type_ids, positions=positions)
        )

    def forward(
        self,
        input_ids: Tensor,
        input_segment_ids: Optional[Tensor] = None,
        token_type_ids: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
    ) -> Tensor:
        """Computes hidden states of the input tokens.

        Args:
            input_ids: [batch, seq_len] ints in [0, vocab_size).
            input_segment_ids: Optional [batch, seq_len] segment ids (0: padding); tokens attend
                within their segment. Given together with `positions`.
            token_type_ids: Optional [batch, seq_len] ints in [0, type_vocab_size).
            positions: Optional [batch, seq_len] positions; None: arange(seq_len).

        Returns:
            [batch, seq_len, dim].
        """
        x = self._embed(input_ids, token_type_ids=token_type_ids, positions=positions)
        biases = self.compute_attention_logit_biases(
            input_ids, segment_ids=input_segment_ids, positions=positions
        )
        outputs = self.transformer(x, self_attention_logit_biases=biases)
        self.add_module_output("transformer_outputs", outputs)
        x = outputs.data
        if "output" in self.children:
            x = self.output(x)
        return x

    def compute_attention_logit_biases(
        self,
        input_ids: Tensor,
        *,
        segment_ids: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
    ) -> Tensor:
        """Returns self-attention biases [batch, 1 or heads, seq_len, seq_len].

        Args:
            input_ids: [batch, seq_len].
            segment_ids: Optional [batch, seq_len] (0: padding); None: input_ids != pad_token_id.
            positions: Optional [batch, seq_len]; given exactly when segment_ids is.

        Returns:
            The biases (0 where a query may attend a key, a large negative value elsewhere).

        Raises:
            ValueError: If only one of segment_ids and positions is given.
        """
        if (segment_ids is None) != (positions is None):
            raise ValueError(
                f"{self.path()}: segment_ids and positions must be given together (got "
                f"{'segment_ids' if positions is None else 'positions'} only)."
            )
        if segment_ids is None:
            segment_ids = (input_ids != self.config.pad_token_id).astype(jnp.int32)
            positions = jnp.arange(input_ids.shape[-1])[None, :]
        return self.attention_mask(segment_ids=segment_ids, positions=positions)

    def attend(self, x: Tensor) -> Tensor:
        """Returns logits [batch, seq_len, vocab_size] of hidden states `x` by the token embedding.

        Args:
            x: [batch, seq_len, dim].

        Returns:
            The logits.
        """
        with child_context("emb_attend", module=self.emb):
            return self.emb.attend(x)


class CausalEncoder(Encoder):
    """An `Encoder` with causal masking and optional learned tokens appended (CoCa)."""

    @config_class
    class Config(Encoder.Config):
        """Configures CausalEncoder."""

        # Causal self-attention masking.
        attention_mask: AttentionLogitBiasLayer.Config = (
            CausalAttentionLogitBiasLayer.default_config()
        )
        # Number of learned tokens appended after the inputs (0: none).
        num_cls_tokens: int = 0

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        if cfg.num_cls_tokens <= 0:
            return {}
        return dict(
            cls_token=ParameterSpec(
                shape=(1, cfg.num_cls_tokens, cfg.dim),
                mesh_axes=(None, None, "model"),
                initializer=param_init.gaussian_initializer(std=1.0 / math.sqrt(cfg.dim)),
            )
        )

    def forward(
        self,
        input_ids: Tensor,
        input_segment_ids: Optional[Tensor] = None,
        token_type_ids: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
    ) -> NestedTensor:
        """Computes causal hidden states (see `Encoder.forward` for the arguments).

        Returns:
            {"hidden_states": [batch, seq_len + num_cls_tokens, dim]} and, with `output` set,
            "normalized_states" (its output, same shape).

        Raises:
            ValueError: With cls tokens, if segment ids are given.
        """
        cfg = self.config
        batch, seq_len = input_ids.shape
        x = self._embed(input_ids, token_type_ids=token_type_ids, positions=positions)
        if cfg.num_cls_tokens > 0:
            if input_segment_ids is not None:
                raise ValueError(
                    f"{self.path()}: input_segment_ids are not supported with num_cls_tokens="
                    f"{cfg.num_cls_tokens}; pass None."
                )
            if positions is not None:
                cls_positions = jnp.arange(cfg.num_cls_tokens)[None, :] + seq_len
                positions = jnp.concatenate(
                    [positions, jnp.tile(cls_positions, (batch, 1))], axis=1
                )
            # Ids other than the pad id, so that the cls tokens are not masked as padding.
            dummy = jnp.full((batch, cfg.num_cls_tokens), cfg.pad_token_id + 1, input_ids.dtype)
            input_ids = jnp.concatenate([input_ids, dummy], axis=1)
            cls_tokens = jnp.tile(self.parameters["cls_token"], (batch, 1, 1)).astype(x.dtype)
            x = jnp.concatenate([x, cls_tokens], axis=1)
        biases = self.compute_attention_logit_biases(
            input_ids, segment_ids=input_segment_ids, positions=positions
        )
        outputs = self.transformer(x, self_attention_logit_biases=biases)
        self.add_module_output("transformer_outputs", outputs)
        result = dict(hidden_states=outputs.data)
        if "output" in self.children:
            result["normalized_states"] = self.output(outputs.data)
        return result

    def init_states(
        self, *, batch_size: int, max_sequence_length: int, dtype: Optional[jnp.dtype] = None
    ) -> NestedTensor:
        """An empty decoding cache for `batch_size` sequences of up to `max_sequence_length`.

        May be called on the layer directly (outside a `functional` call): an empty cache needs
        no parameters.

        Args:
            batch_size: Number of sequences.
            max_sequence_length: Cache length.
            dtype: The dtype the caches store activations in; None means the layer dtype.

        Returns:
            {"transformer_state", "input_ids" (all pad_token_id), "time_step" (zeros [batch])}.
        """
        if current_context() is None:
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
            input_ids=jnp.full(
                (batch_size, max_sequence_length), self.config.pad_token_id, jnp.int32
            ),
            time_step=jnp.zeros([batch_size], jnp.int32),
        )

    def prefill_states(
        self, *, time_step: Tensor, input_ids: Tensor, token_type_ids: Optional[Tensor] = None
    ) -> tuple[NestedTensor, NestedTensor]:
        """Processes `input_ids` [batch, max_len] at once; decoding continues at `time_step`.

        Args:
            time_step: Int [batch]: the number of leading tokens per row the cache keeps (later
                positions are overwritten by `extend_step`).
            input_ids: Int [batch, max_len], the cache length.
            token_type_ids: Optional [batch, max_len].

        Returns:
            (states, {"hidden_states": [batch, max_len, dim]}) with the hidden states of every
            position (as `forward` without `output`).
        """
        x = self._embed(input_ids, token_type_ids=token_type_ids, positions=None)
        biases = self.compute_attention_logit_biases(input_ids)
        state, out = self.transformer.init_states(
            time_step=time_step, data=x, self_attention_logit_biases=biases
        )
        states = dict(transformer_state=state, input_ids=input_ids, time_step=time_step)
        return states, dict(hidden_states=out.data)

    def extend_step(
        self, *, cached_states: NestedTensor, input_batch: Nested[Tensor]
    ) -> tuple[NestedTensor, NestedTensor]:
        """Consumes one token per row at its time step.

        A row whose time step is past the cache length leaves the cache unchanged.

        Args:
            cached_states: From `init_states`, `prefill_states` or `extend_step`.
            input_batch: {"input_ids": int [batch, 1]} and optional "token_type_ids" [batch, 1].

        Returns:
            (updated states, {"hidden_states": [batch, 1, dim]}) (the `output` layer, if any, is
            not applied, as in AXLearn).

        Raises:
            ValueError: If input_ids is not [batch, 1].
        """
        input_ids = input_batch["input_ids"]
        if input_ids.ndim != 2 or input_ids.shape[1] != 1:
            raise ValueError(
                f"{self.path()}.extend_step: input_batch['input_ids'] must be [batch, 1] (one "
                f"token per row), got shape {tuple(input_ids.shape)}."
            )
        time_step = cached_states["time_step"]
        cached_ids = cached_states["input_ids"]
        max_len = cached_ids.shape[-1]
        write = jax.nn.one_hot(time_step, max_len, dtype=cached_ids.dtype)  # [batch, max_len].
        ids = cached_ids * (1 - write) + input_ids.astype(cached_ids.dtype) * write
        full = self.compute_attention_logit_biases(
            ids,
            segment_ids=(ids != self.config.pad_token_id).astype(jnp.int32),
            positions=jnp.arange(max_len)[None, :],
        )
        full = jnp.broadcast_to(full, (ids.shape[0], *full.shape[1:]))
        # The query row of each time step (clipped past the end): [batch, heads, 1, max_len].
        biases = jnp.take_along_axis(full, time_step[:, None, None, None], axis=2, mode="clip")
        x = self._embed(
            input_ids,
            token_type_ids=input_batch.get("token_type_ids"),
            positions=time_step[:, None],
        )
        state, out = self.transformer.extend_step(
            cached_states["transformer_state"], x, self_attention_logit_biases=biases
        )
        states = dict(transformer_state=state, input_ids=ids, time_step=time_step + 1)
        return states, dict(hidden_states=out.data)


class EncoderModel(BaseModel):
    """An encoder-only model (e.g. BERT): per-token outputs and, with a head, logits and a loss."""

    @config_class
    class Config(BaseModel.Config):
        """Configures EncoderModel."""

        dim: Required[int] = REQUIRED  # Hidden dim.
        vocab_size: Required[int] = REQUIRED  # Vocabulary size.
        # The encoder (dim and vocab_size are set from this config).
        encoder: InstantiableConfig = Encoder.default_config()
        # Optional head (input_dim is set to dim).
        head: Optional[BaseClassificationHead.Config] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("encoder", cfg.encoder.set(dim=cfg.dim, vocab_size=cfg.vocab_size))
        if cfg.head is not None:
            self._add_child("head", cfg.head.set(input_dim=cfg.dim))

    def forward(
        self, input_batch: dict[str, Tensor], return_aux: bool = False
    ) -> tuple[Optional[Tensor], NestedTensor]:
        """Returns (loss, aux): the head's loss (None without a head) and the predictions.

        Args:
            input_batch: "input_ids" [..., seq_len], "target_labels" (the head's targets),
                optional "token_type_ids" and "soft_labels".
            return_aux: Whether to return the predictions (else an empty dict).

        Returns:
            (loss, predictions if return_aux else {}).
        """
        predictions = self.predict(input_batch)
        loss = None
        if "head" in self.children:
            with child_context("head_loss", module=self.head):
                loss = self.head.loss(
                    logits=predictions["logits"],
                    target_labels=input_batch["target_labels"],
                    soft_labels=input_batch.get("soft_labels"),
                )
        return loss, predictions if return_aux else {}

    def predict(self, input_batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Returns {"sequence_output": [..., seq_len, dim]} and, with a head, "logits".

        Args:
            input_batch: "input_ids" [..., seq_len] and optional "token_type_ids" (same shape).

        Returns:
            The predictions.
        """
        input_ids = input_batch["input_ids"]
        token_type_ids = input_batch.get("token_type_ids")
        batch_shape, seq_len = input_ids.shape[:-1], input_ids.shape[-1]
        if token_type_ids is not None:
            token_type_ids = token_type_ids.reshape((-1, seq_len))
        output = self.encoder(
            input_ids=input_ids.reshape((-1, seq_len)), token_type_ids=token_type_ids
        )
        predictions = dict(sequence_output=output.reshape(batch_shape + (seq_len, -1)))
        if self.config.head is not None:
            predictions["logits"] = self.head(
                input_batch=dict(hidden_states=predictions["sequence_output"], **input_batch)
            )
        return predictions
