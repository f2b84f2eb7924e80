"""An encoder-decoder (sequence-to-sequence) model: an `Encoder` and a cross-attending `Decoder`.

    model = EncoderDecoderModel.default_config().set(encoder=..., decoder=...)
    batch = dict(source=dict(input_ids=src), target=dict(input_ids=tgt), target_labels=labels)
    loss, aux = model(input_batch=batch, return_aux=True)   # aux: hidden_states, per_token_loss

The decoder's layers need a `cross_attention` config; its source dim is set to the encoder's dim.
Source tokens equal to `encoder.pad_token_id` are hidden from the cross-attention; with
"input_segment_ids" given on both sides (packed batches), target tokens attend only to source
tokens of their own segment. Decoding (`sample_decode`, `beam_search_decode`) encodes the
source once and runs the decoder's decoding on it (see `decoder.DecodingLayer`).
"""

from typing import Optional

from jax import numpy as jnp

from axlearn.common.attention_bias import NEG_INF, make_segment_mask
from axlearn.common.base_encoder_decoder import BaseEncoderDecoderModel
from axlearn.common.config import ConfigOr, config_class
from axlearn.common.decoder import Decoder
from axlearn.common.decoding import BeamSearchOutputs, SampleOutputs
from axlearn.common.encoder import Encoder
from axlearn.common.logit_modifiers import LogitsToLogitsFn
from axlearn.common.loss import cross_entropy
from axlearn.common.metrics import WeightedSummary
from axlearn.common.module import Module, child_context
from axlearn.common.utils import Nested, Tensor, validate_contains_paths

__all__ = ["EncoderDecoderModel"]


class EncoderDecoderModel(BaseEncoderDecoderModel):
    """Encodes input_batch["source"], decodes input_batch["target"] and scores the labels."""

    @config_class
    class Config(BaseEncoderDecoderModel.Config):
        """Configures EncoderDecoderModel."""

        z_loss_scale: float = 0.0  # Scale of the auxiliary z-loss (logsumexp(logits) ** 2).
        label_smoothing: float = 0.0  # Label smoothing of the cross-entropy targets.

    @classmethod
    def default_config(cls) -> Config:
        """An `Encoder` and a `Decoder` (both still need their required fields)."""
        cfg = super().default_config()
        cfg.encoder = Encoder.default_config()
        cfg.decoder = Decoder.default_config()
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("encoder", cfg.encoder)
        # The decoder's cross-attention reads the encoder's outputs.
        layer_cfg = getattr(cfg.decoder.transformer, "layer", None)
        if getattr(layer_cfg, "cross_attention", None) is not None:
            layer_cfg.cross_attention.source_dim = cfg.encoder.dim
        self._add_child("decoder", cfg.decoder)

    # pylint: disable-next=arguments-differ
    def forward(
        self, input_batch: Nested[Tensor], return_aux: bool = False
    ) -> tuple[Tensor, Nested[Tensor]]:
        """Computes the loss (see `BaseEncoderDecoderModel.forward`).

        Args:
            input_batch: A dict with "source", "target" and "target_labels" (see `predict`).
            return_aux: Whether to return the predictions and "per_token_loss".

        Returns:
            (loss, aux); aux is empty unless `return_aux`.

        Raises:
            KeyError: If `predict` and `_metrics` return a common key.
        """
        validate_contains_paths(input_batch, paths=["source", "target", "target_labels"])
        predictions = self.predict(input_batch)
        loss, metrics = self._metrics(input_batch, predict_outputs=predictions)
        common = set(predictions.keys()) & set(metrics.keys())
        if common:
            raise KeyError(
                f"{self.path()}: key conflict between predict and _metrics outputs: "
                f"{sorted(common)}"
            )
        if not return_aux:
            return loss, {}
        return loss, {**predictions, **metrics}

    def predict(self, input_batch: Nested[Tensor]) -> Nested[Tensor]:
        """Runs the encoder on the source and the decoder on the target.

        Args:
            input_batch: A dict with
                source: The encoder's kwargs: input_ids [batch, source_len]; optional
                    input_segment_ids (0: padding), token_type_ids, positions.
                target: The decoder's input batch: input_ids [batch, target_len]; optional
                    input_segment_ids, positions.

        Returns:
            The decoder's outputs: hidden_states [batch, target_len, dim] (and logits).

        Raises:
            ValueError: If only one of the source and target has input_segment_ids.
        """
        validate_contains_paths(input_batch, paths=["source/input_ids", "target/input_ids"])
        source = input_batch["source"]
        target = input_batch["target"]
        source_segments = source.get("input_segment_ids")
        target_segments = target.get("input_segment_ids")
        if (source_segments is None) != (target_segments is None):
            raise ValueError(
                f"{self.path()}: give input_segment_ids for both the source and the target or "
                "for neither (packed batches need both)."
            )
        encoded = self.encoder(**source)
        biases = self.compute_attention_logit_biases(source["input_ids"])
        if source_segments is not None:
            biases = biases + make_segment_mask(
                source_segments=source_segments, target_segments=target_segments
            )
        return self.decoder(
            target, cross_attention_data=encoded, cross_attention_logit_biases=biases
        )

    def compute_logits(self, predictions: Nested[Tensor]) -> Tensor:
        """Logits [batch, target_len, vocab] from `predict`'s outputs (its "hidden_states").

        Args:
            predictions: The dict `predict` returns.

        Returns:
            The logits.
        """
        with child_context("compute_logits", module=self.decoder):
            return self.decoder.compute_logits(predictions)

    def compute_attention_logit_biases(self, source_ids: Tensor) -> Tensor:
        """Cross-attention biases hiding the source padding.

        Args:
            source_ids: Int [batch, source_len].

        Returns:
            Float [batch, 1, 1, source_len]: NEG_INF where source_ids == encoder.pad_token_id,
            else 0.
        """
        is_pad = source_ids == self.encoder.config.pad_token_id
        return (is_pad * NEG_INF)[:, None, None, :]

    def _metrics(
        self, input_batch: Nested[Tensor], *, predict_outputs: Nested[Tensor]
    ) -> tuple[Tensor, Nested[Tensor]]:
        """The cross-entropy loss of the target labels and its summaries.

        Labels outside [0, vocab_size) and labels equal to decoder.pad_token_id are not scored.

        Args:
            input_batch: A dict with "target_labels" [batch, target_len].
            predict_outputs: The dict `predict` returns.

        Returns:
            (loss, {"per_token_loss": [batch, target_len]}) with zeros at unscored positions.
        """
        validate_contains_paths(input_batch, paths=["target_labels"])
        validate_contains_paths(predict_outputs, paths=["hidden_states"])
        cfg = self.config
        logits = self.compute_logits(predict_outputs)
        labels = input_batch["target_labels"]
        live = (labels >= 0) & (labels < logits.shape[-1])
        live = live & (labels != self.decoder.config.pad_token_id)
        num_targets = live.sum()
        loss, aux = cross_entropy(
            logits,
            labels,
            live_targets=live,
            z_loss_scale=cfg.z_loss_scale,
            label_smoothing=cfg.label_smoothing,
        )
        self.add_summary("loss", WeightedSummary(loss, num_targets))
        self.add_summary("perplexity", WeightedSummary(jnp.exp(loss), num_targets))
        self.add_summary("token_accuracy", WeightedSummary(aux["accuracy"], num_targets))
        return loss, dict(per_token_loss=aux["per_target_loss"] * live)

    def _encode_for_decoding(self, input_batch: Nested[Tensor]) -> tuple[dict, Nested[Tensor]]:
        validate_contains_paths(input_batch, paths=["prefix", "source/input_ids"])
        source_ids = input_batch["source"]["input_ids"]
        cross_kwargs = dict(
            cross_attention_data=self.encoder(input_ids=source_ids),
            cross_attention_logit_biases=self.compute_attention_logit_biases(source_ids),
        )
        decoder_batch = {k: v for k, v in input_batch.items() if k != "source"}
        return cross_kwargs, decoder_batch

    def beam_search_decode(
        self, input_batch: Nested[Tensor], num_decodes: int, **kwargs
    ) -> BeamSearchOutputs:
        """Beam search given the source (see `BaseEncoderDecoderModel.beam_search_decode`).

        Args:
            input_batch: A dict with "prefix" [batch, prefix_len] and "source" (its "input_ids"
                [batch, source_len] are encoded; padding is input_ids == encoder.pad_token_id).
            num_decodes: Number of beams.
            **kwargs: Passed to `decoder.beam_search_decode` (max_sequence_length, ...).

        Returns:
            BeamSearchOutputs.
        """
        cross_kwargs, decoder_batch = self._encode_for_decoding(input_batch)
        with child_context("beam_search_decode", module=self.decoder):
            return self.decoder.beam_search_decode(
                input_batch=decoder_batch, num_decodes=num_decodes, **cross_kwargs, **kwargs
            )

    def sample_decode(
        self,
        input_batch: Nested[Tensor],
        num_decodes: int,
        logits_modifier: Optional[ConfigOr[LogitsToLogitsFn]] = None,
        **kwargs,
    ) -> SampleOutputs:
        """Sample decoding given the source (see `BaseEncoderDecoderModel.sample_decode`).

        Args:
            input_batch: As in `beam_search_decode`.
            num_decodes: Samples per example.
            logits_modifier: Optional map of the next-token log-probabilities.
            **kwargs: Passed to `decoder.sample_decode` (max_sequence_length, ...).

        Returns:
            SampleOutputs.
        """
        cross_kwargs, decoder_batch = self._encode_for_decoding(input_batch)
        with child_context("sample_decode", module=self.decoder):
            return self.decoder.sample_decode(
                input_batch=decoder_batch,
                num_decodes=num_decodes,
                logits_modifier=logits_modifier,
                **cross_kwargs,
                **kwargs,
            )
