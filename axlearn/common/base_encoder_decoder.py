"""The interface of encoder-decoder (sequence-to-sequence) models.

A `BaseEncoderDecoderModel` reads a batch with a "source" dict (keyword arguments of the encoder),
a "target" dict (keyword arguments of the decoder) and, for the loss, "target_labels". Its
methods:

    loss, aux = model(input_batch=batch, return_aux=True)   # forward
    outputs = model.predict(input_batch=batch)              # decoder outputs (hidden states)
    beams = model.beam_search_decode(input_batch=dict(prefix=..., source=...), num_decodes=4,
                                     max_sequence_length=L)
    samples = model.sample_decode(input_batch=dict(prefix=..., source=...), num_decodes=4,
                                  max_sequence_length=L)

`encoder_decoder.EncoderDecoderModel` implements it.
"""

from typing import Optional

from axlearn.common.base_layer import BaseLayer
from axlearn.common.base_model import BaseModel
from axlearn.common.config import REQUIRED, ConfigOr, Required, config_class
from axlearn.common.decoding import BeamSearchOutputs, SampleOutputs
from axlearn.common.logit_modifiers import LogitsToLogitsFn
from axlearn.common.utils import Nested, Tensor

__all__ = ["BaseEncoderDecoderModel"]


class BaseEncoderDecoderModel(BaseModel):
    """An encoder reading the source and a decoder generating the target (abstract)."""

    @config_class
    class Config(BaseModel.Config):
        """Configures BaseEncoderDecoderModel."""

        encoder: Required[BaseLayer.Config] = REQUIRED  # Encodes input_batch["source"].
        decoder: Required[BaseLayer.Config] = REQUIRED  # Decodes input_batch["target"].

    # pylint: disable-next=arguments-differ
    def forward(
        self, input_batch: Nested[Tensor], return_aux: bool = False
    ) -> tuple[Tensor, Nested[Tensor]]:
        """Computes the training loss of a batch.

        Args:
            input_batch: A dict with
                source: Keyword arguments of the encoder (e.g. input_ids [batch, source_len]).
                target: Keyword arguments of the decoder (e.g. input_ids [batch, target_len]).
                target_labels: Int [batch, target_len]; negative values are not scored.
            return_aux: Whether to return the auxiliary outputs (else an empty dict).

        Returns:
            (loss, aux): the scalar loss and, if `return_aux`, the predictions and per-token
            metrics.
        """
        raise NotImplementedError(type(self))

    def predict(self, input_batch: Nested[Tensor]) -> Nested[Tensor]:
        """Computes the decoder's outputs (without the loss).

        Args:
            input_batch: As in `forward`; "target_labels" is not needed.

        Returns:
            A dict of predictions, e.g. hidden_states [batch, target_len, dim].
        """
        raise NotImplementedError(type(self))

    def beam_search_decode(
        self, input_batch: Nested[Tensor], num_decodes: int, **kwargs
    ) -> BeamSearchOutputs:
        """Beam search on the decoder given the encoded source.

        Args:
            input_batch: A dict with "source" (encoder kwargs) and "prefix" (int
                [batch, prefix_len], the decoder's prompt starting with its BOS token).
            num_decodes: Number of beams (1: greedy decoding).
            **kwargs: Passed to the decoder's `beam_search_decode` (e.g. max_sequence_length).

        Returns:
            BeamSearchOutputs with sequences [batch, num_decodes, max_sequence_length] and
            scores [batch, num_decodes].
        """
        raise NotImplementedError(type(self))

    def sample_decode(
        self,
        input_batch: Nested[Tensor],
        num_decodes: int,
        logits_modifier: Optional[ConfigOr[LogitsToLogitsFn]] = None,
        **kwargs,
    ) -> SampleOutputs:
        """Samples continuations of the decoder's prefix given the encoded source.

        Args:
            input_batch: As in `beam_search_decode`.
            num_decodes: Samples per example.
            logits_modifier: Optional map of the next-token log-probabilities before sampling
                (e.g. top-k); None keeps them.
            **kwargs: Passed to the decoder's `sample_decode` (e.g. max_sequence_length).

        Returns:
            SampleOutputs with sequences and token_scores [batch, num_decodes,
            max_sequence_length].
        """
        raise NotImplementedError(type(self))
