"""Text dual encoders: a query (left) and a document (right) text encoder trained with
retrieval losses.

The model (`TextEmbeddingDualEncoder`) is a two-stream `multi_stream_model.MultiStreamModel`
whose batch holds one sub-dict per encoder:
    {"query_encoder": {POSITIVE_INPUT_IDS: [batch, 1, seq_len]},
     "doc_encoder": {POSITIVE_INPUT_IDS: [batch, num_pos, seq_len],
                     POSITIVE_PADDINGS: [batch, num_pos],
                     NEGATIVE_INPUT_IDS: [batch, num_neg, seq_len], NEGATIVE_PADDINGS: ...}}
Each stream encoder (`TextEmbeddingStreamEncoder`) adds POSITIVE_EMBEDDINGS (and
NEGATIVE_EMBEDDINGS, ...) of shape [batch, num_inputs, dim] to its sub-dict. The fusion networks
then compute losses from the embeddings:
- `TextEmbeddingAsymmetricContrastiveLossLayer`: softmax cross entropy of each query against all
  the batch's documents (positives of other queries and all negatives are negatives), only in
  the query-to-document direction.
- `RankingPairwiseLossLayer`: a pairwise logistic loss making higher-ranked candidates score
  higher.
- `FLOPsLossLayer`: the FLOPs sparsity regularizer of both encoders' embeddings, with a weight
  schedule over training steps.
With `shared_encoder_name`, one encoder is shared (Siamese): the other stream is a
`layers.RedirectToSharedModule` to `TEXT_DUAL_ENCODER_SHARED_MODULE_NAME`.
"""

from collections.abc import Sequence
from typing import Optional, Union

import jax.numpy as jnp

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.layers import Linear
from axlearn.common.loss import (
    asymmetric_contrastive_loss_from_logits,
    contrastive_logits,
    flops_loss,
    ranking_pairwise_loss,
)
from axlearn.common.module import Module, child_context
from axlearn.common.multi_stream_model import FusionNetwork, MultiStreamModel, StreamEncoder
from axlearn.common.param_init import constant_initializer
from axlearn.common.schedule import ScheduleFn, as_schedule_fn
from axlearn.common.text_encoder import TEXT_EMBEDDINGS, TextEmbeddingEncoder
from axlearn.common.utils import NestedTensor, Tensor, get_recursively

# Keys of an encoder's sub-dict of the batch.
POSITIVE_EMBEDDINGS = "positive_embeddings"
NEGATIVE_EMBEDDINGS = "negative_embeddings"
POSITIVE_PADDINGS = "positive_paddings"
NEGATIVE_PADDINGS = "negative_paddings"
POSITIVE_INPUT_IDS = "positive_input_ids"
NEGATIVE_INPUT_IDS = "negative_input_ids"
RIGHT_PADDINGS = "right_paddings"
PAIRWISE_LOSS_INPUT_IDS = "pairwise_loss_input_ids"
PAIRWISE_LOSS_PADDINGS = "pairwise_loss_paddings"
PAIRWISE_LOSS_EMBEDDINGS = "pairwise_loss_embeddings"
RANKS = "ranks"

# Keys of `flatten_and_concat_embeddings`'s outputs.
FLATTENED_LEFT_EMBEDDINGS = "flattened_left_embeddings"
FLATTENED_RIGHT_EMBEDDINGS = "flattened_right_embeddings"

# Output keys of the loss layers.
SIMILARITY_MATRIX = "similarity_matrix"
NUM_VALID_RANKING_PAIRS = "num_valid_ranking_pairs"

# {output embedding key: input ids key} that a TextEmbeddingStreamEncoder encodes by default.
ENCODING_FIELD_MAP = {
    POSITIVE_EMBEDDINGS: POSITIVE_INPUT_IDS,
    NEGATIVE_EMBEDDINGS: NEGATIVE_INPUT_IDS,
    PAIRWISE_LOSS_EMBEDDINGS: PAIRWISE_LOSS_INPUT_IDS,
}

# The name under which TextEmbeddingDualEncoder shares its `shared_encoder_name` encoder.
TEXT_DUAL_ENCODER_SHARED_MODULE_NAME = "shared_text_encoder"


class TextEmbeddingStreamEncoder(StreamEncoder):
    """Encodes each input-id field of its batch with a `TextEmbeddingEncoder`, then optionally
    projects (`output_proj`) and normalizes (`output_norm`) the embeddings."""

    @config_class
    class Config(StreamEncoder.Config):
        """Configures TextEmbeddingStreamEncoder."""

        # The dim of the output embeddings.
        output_dim: Required[int] = REQUIRED
        # {output embedding key: input ids key}; each present, non-empty input ids field
        # [batch, num_inputs, seq_len] is encoded into [batch, num_inputs, output_dim].
        encoding_field_map: dict[str, str] = ENCODING_FIELD_MAP
        # The text encoder (its output_dim is set to hidden_dim); one embedding per sequence.
        text_encoder: TextEmbeddingEncoder.Config = TextEmbeddingEncoder.default_config()
        # The text encoder's output dim (None: output_dim); output_proj is required if it
        # differs from output_dim.
        hidden_dim: Optional[int] = None
        # Optional projection of the text embeddings from hidden_dim to output_dim.
        output_proj: Optional[Linear.Config] = None
        # Optional normalization of the (projected) embeddings, e.g. `layers.L2Norm`.
        output_norm: Optional[BaseLayer.Config] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        hidden_dim = cfg.hidden_dim if cfg.hidden_dim is not None else cfg.output_dim
        self._add_child("text_encoder", cfg.text_encoder.set(output_dim=hidden_dim))
        if hidden_dim != cfg.output_dim and cfg.output_proj is None:
            # An AssertionError, as AXLearn's.
            raise AssertionError(
                f"{self.path()}: output_proj can't be None when hidden_dim != output_dim "
                f"({hidden_dim} vs. {cfg.output_dim})."
            )
        if cfg.output_proj is not None:
            self._add_child(
                "output_proj", cfg.output_proj.set(input_dim=hidden_dim, output_dim=cfg.output_dim)
            )
        if cfg.output_norm is not None:
            self._add_child("output_norm", cfg.output_norm)

    def _encode(self, input_ids: Tensor) -> Tensor:
        """[n, seq_len] ids -> [n, output_dim] embeddings."""
        embeddings = self.text_encoder(input_ids)[TEXT_EMBEDDINGS]
        if embeddings.shape[1] != 1:
            raise ValueError(
                f"{self.path()}: text_encoder must give one embedding per sequence, got "
                f"{embeddings.shape[1]}"
            )
        if "output_proj" in self.children:
            embeddings = self.output_proj(embeddings)
        if "output_norm" in self.children:
            embeddings = self.output_norm(embeddings)
        return embeddings[:, 0]

    def forward(self, input_batch: NestedTensor) -> NestedTensor:
        """Encodes the input id fields of `cfg.encoding_field_map`.

        Args:
            input_batch: A dict holding some of the map's input ids fields, each
                [batch, num_inputs, seq_len] (a field with num_inputs 0 is skipped).

        Returns:
            A copy of `input_batch` with each encoded field's embeddings,
            [batch, num_inputs, output_dim], under its output key.
        """
        cfg = self.config
        outputs = dict(input_batch)
        for output_field, input_field in cfg.encoding_field_map.items():
            if input_field not in input_batch or input_batch[input_field].shape[1] == 0:
                continue
            input_ids = input_batch[input_field]
            batch, num_inputs, seq_len = input_ids.shape
            with child_context(f"encode_{input_field}", module=self):
                embeddings = self._encode(input_ids.reshape(-1, seq_len))
            outputs[output_field] = embeddings.reshape(batch, num_inputs, -1)
        return outputs


def flatten_and_concat_embeddings(
    *,
    left_positive_embeddings: Tensor,
    right_positive_embeddings: Tensor,
    right_positive_paddings: Tensor,
    right_negative_embeddings: Optional[Tensor] = None,
    right_negative_paddings: Optional[Tensor] = None,
) -> dict[str, Tensor]:
    """Flattens the left (query) embeddings and the right positive then negative embeddings.

    Args:
        left_positive_embeddings: [num_left, 1, dim].
        right_positive_embeddings: [num_left, num_pos, dim].
        right_positive_paddings: 0/1 [num_left, num_pos] (1: padding).
        right_negative_embeddings: Optional [num_left, num_neg, dim].
        right_negative_paddings: 0/1 [num_left, num_neg]; given with right_negative_embeddings.

    Returns:
        {FLATTENED_LEFT_EMBEDDINGS: [num_left, dim],
         FLATTENED_RIGHT_EMBEDDINGS: [num_left * (num_pos + num_neg), dim] (all positives
            first, row-major, then all negatives; num_neg is 0 without negatives),
         RIGHT_PADDINGS: [num_left * (num_pos + num_neg)] in the same order}.

    Raises:
        AssertionError: If there is not one left embedding per example, or the dims differ.
    """
    dim = left_positive_embeddings.shape[-1]
    if left_positive_embeddings.shape[1] != 1:
        raise AssertionError("Expecting one positive embedding per example from left encoder.")
    if right_positive_embeddings.shape[-1] != dim:
        raise AssertionError(
            "right_positive_embeddings has a different dim than that of left_embeddings!"
        )
    right = [right_positive_embeddings.reshape(-1, dim)]
    paddings = [jnp.reshape(right_positive_paddings, -1)]
    if right_negative_embeddings is not None:
        if right_negative_embeddings.shape[-1] != dim:
            raise AssertionError(
                "right_negative_embeddings has a different dim than that of left_embeddings!"
            )
        right.append(right_negative_embeddings.reshape(-1, dim))
        paddings.append(jnp.reshape(right_negative_paddings, -1))
    return {
        FLATTENED_LEFT_EMBEDDINGS: left_positive_embeddings.reshape(-1, dim),
        FLATTENED_RIGHT_EMBEDDINGS: jnp.concatenate(right, axis=0),
        RIGHT_PADDINGS: jnp.concatenate(paddings, axis=0),
    }


def flatten_and_concat_embeddings_from_input_batch(
    *,
    input_batch: NestedTensor,
    left_encoder_name: Union[str, Sequence[str]],
    right_encoder_name: Union[str, Sequence[str]],
    assert_one_positive_from_right_encoder: bool = True,
) -> dict[str, Tensor]:
    """`flatten_and_concat_embeddings` of two encoders' sub-dicts of `input_batch`.

    Args:
        input_batch: The batch; the left sub-dict holds POSITIVE_EMBEDDINGS, the right one
            POSITIVE_EMBEDDINGS, POSITIVE_PADDINGS and optionally NEGATIVE_EMBEDDINGS and
            NEGATIVE_PADDINGS.
        left_encoder_name: The left sub-dict's key, or a path of keys.
        right_encoder_name: The right sub-dict's key, or a path of keys.
        assert_one_positive_from_right_encoder: Whether the right encoder must give exactly
            one positive per example.

    Returns:
        See `flatten_and_concat_embeddings`.

    Raises:
        AssertionError: On the shape checks.
    """
    left = get_recursively(input_batch, left_encoder_name)
    right = get_recursively(input_batch, right_encoder_name)
    positives, positive_paddings = right[POSITIVE_EMBEDDINGS], right[POSITIVE_PADDINGS]
    if assert_one_positive_from_right_encoder and (
        positives.shape[1] != 1 or positive_paddings.shape[1] != 1
    ):
        raise AssertionError("Expecting one positive embedding per example from right encoder.")
    return flatten_and_concat_embeddings(
        left_positive_embeddings=left[POSITIVE_EMBEDDINGS],
        right_positive_embeddings=positives,
        right_positive_paddings=positive_paddings,
        right_negative_embeddings=right.get(NEGATIVE_EMBEDDINGS),
        right_negative_paddings=right.get(NEGATIVE_PADDINGS),
    )


class TextEmbeddingAsymmetricContrastiveLossLayer(FusionNetwork):
    """Softmax cross entropy of each query (left embedding) over all the batch's right
    embeddings, its own positive being the target; padded right embeddings are excluded.

    The left encoder gives one embedding per example; the right one one positive and
    optionally negatives per example.
    """

    @config_class
    class Config(FusionNetwork.Config):
        """Configures TextEmbeddingAsymmetricContrastiveLossLayer."""

        # The left (query) encoder's key in the batch, or a path of keys.
        left_encoder_name: Required[Union[str, Sequence[str]]] = REQUIRED
        # The right (document) encoder's key in the batch, or a path of keys.
        right_encoder_name: Required[Union[str, Sequence[str]]] = REQUIRED
        # Logits are multiplied by it (the inverse temperature).
        contrastive_loss_scale_factor: float = 1.0

    def forward(self, input_batch: NestedTensor) -> tuple[Tensor, NestedTensor]:
        """Computes the loss.

        Args:
            input_batch: The batch with the encoders' embeddings (see
                `flatten_and_concat_embeddings_from_input_batch`).

        Returns:
            (the scalar loss, {SIMILARITY_MATRIX: [num_left, num_right] dot products}).
        """
        cfg = self.config
        inputs = flatten_and_concat_embeddings_from_input_batch(
            input_batch=input_batch,
            left_encoder_name=cfg.left_encoder_name,
            right_encoder_name=cfg.right_encoder_name,
        )
        similarity = contrastive_logits(
            inputs[FLATTENED_LEFT_EMBEDDINGS], inputs[FLATTENED_RIGHT_EMBEDDINGS]
        )
        loss = asymmetric_contrastive_loss_from_logits(
            similarity,
            key_paddings=inputs[RIGHT_PADDINGS],
            temperature=1 / cfg.contrastive_loss_scale_factor,
        )
        return loss, {SIMILARITY_MATRIX: similarity}


class RankingPairwiseLossLayer(FusionNetwork):
    """Pairwise logistic loss over each query's ranked candidates (`loss.ranking_pairwise_loss`):
    for every pair with different ranks, the better-ranked (lower rank) candidate should score
    higher. Scores are scaled dot products of the query and candidate embeddings; padded
    candidates (rank 0) are left out."""

    @config_class
    class Config(FusionNetwork.Config):
        """Configures RankingPairwiseLossLayer."""

        # The left (query) encoder's key in the batch.
        left_encoder_name: Required[str] = REQUIRED
        # The right encoder's key, holding PAIRWISE_LOSS_EMBEDDINGS, _PADDINGS and RANKS.
        right_encoder_name: Required[str] = REQUIRED
        # Logits are multiplied by it.
        pairwise_loss_scale_factor: float = 1.0

    def forward(self, input_batch: NestedTensor) -> tuple[Tensor, NestedTensor]:
        """Computes the loss.

        Args:
            input_batch: Left POSITIVE_EMBEDDINGS [batch, 1, dim]; right
                PAIRWISE_LOSS_EMBEDDINGS [batch, num_candidates, dim], PAIRWISE_LOSS_PADDINGS
                (0/1) and RANKS (ints) [batch, num_candidates].

        Returns:
            (the mean pairwise loss, {NUM_VALID_RANKING_PAIRS: the number of pairs}).

        Raises:
            AssertionError: If the left encoder does not give one embedding per example.
        """
        cfg = self.config
        left = input_batch[cfg.left_encoder_name][POSITIVE_EMBEDDINGS]
        if left.shape[1] != 1:
            raise AssertionError("Expecting one positive embedding per example from left encoder.")
        right = input_batch[cfg.right_encoder_name]
        # [batch, num_candidates].
        logits = jnp.einsum("bd,bjd->bj", left[:, 0], right[PAIRWISE_LOSS_EMBEDDINGS])
        logits = logits * cfg.pairwise_loss_scale_factor
        ranks = right[RANKS] * (1 - right[PAIRWISE_LOSS_PADDINGS])
        loss, num_pairs = ranking_pairwise_loss(
            logits=logits, ranks=ranks, loss_scale=jnp.ones(left.shape[0])
        )
        return loss, {NUM_VALID_RANKING_PAIRS: num_pairs}


class FLOPsLossLayer(FusionNetwork):
    """The FLOPs regularizer (`loss.flops_loss`) of both encoders' embeddings (Paria et al.,
    https://arxiv.org/abs/2004.05665), weighted by a schedule of a step counter that this layer
    keeps as its "step" state (incremented on each call)."""

    @config_class
    class Config(FusionNetwork.Config):
        """Configures FLOPsLossLayer."""

        # The left encoder's key in the batch, or a path of keys.
        left_encoder_name: Required[Union[str, Sequence[str]]] = REQUIRED
        # The right encoder's key in the batch, or a path of keys.
        right_encoder_name: Required[Union[str, Sequence[str]]] = REQUIRED
        # Schedule of the step giving the weight of both FLOPs losses.
        flops_weight_schedule: Required[InstantiableConfig[ScheduleFn]] = REQUIRED
        # Constant weight of the left encoder's loss (times the schedule).
        left_encoder_flops_loss_weight: float = 1.0
        # Constant weight of the right encoder's loss (times the schedule).
        right_encoder_flops_loss_weight: float = 1.0
        # Elements with |value| <= this count as sparse in the sparsity summaries.
        sparsity_threshold: float = 0.0

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._flops_weight_schedule = as_schedule_fn(self.config.flops_weight_schedule)

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        return {
            "step": ParameterSpec(
                shape=[],
                dtype=jnp.int32,
                mesh_axes=None,
                initializer=constant_initializer(0),
                weight_decay_scale=0,
            )
        }

    def forward(self, input_batch: NestedTensor) -> tuple[Tensor, NestedTensor]:
        """Computes the weighted FLOPs losses.

        Args:
            input_batch: The batch with the encoders' embeddings (see
                `flatten_and_concat_embeddings_from_input_batch`; the right encoder may give
                several positives per example).

        Returns:
            (the loss, {}); each encoder's loss and average sparse count are summaries.
        """
        cfg = self.config
        inputs = flatten_and_concat_embeddings_from_input_batch(
            input_batch=input_batch,
            left_encoder_name=cfg.left_encoder_name,
            right_encoder_name=cfg.right_encoder_name,
            assert_one_positive_from_right_encoder=False,
        )
        left_loss, left_sparsity = flops_loss(
            embeddings=inputs[FLATTENED_LEFT_EMBEDDINGS],
            sparsity_threshold=cfg.sparsity_threshold,
        )
        right_loss, right_sparsity = flops_loss(
            embeddings=inputs[FLATTENED_RIGHT_EMBEDDINGS],
            paddings=inputs[RIGHT_PADDINGS],
            sparsity_threshold=cfg.sparsity_threshold,
        )
        self.add_summary(f"{cfg.left_encoder_name}_flops_loss", left_loss)
        self.add_summary(f"{cfg.right_encoder_name}_flops_loss", right_loss)
        self.add_summary(f"{cfg.left_encoder_name}_avg_sparsity_count", left_sparsity)
        self.add_summary(f"{cfg.right_encoder_name}_avg_sparsity_count", right_sparsity)
        step = self.parameters["step"]
        weight = self._flops_weight_schedule(step)
        loss = (
            cfg.left_encoder_flops_loss_weight * left_loss * weight
            + cfg.right_encoder_flops_loss_weight * right_loss * weight
        )
        self.add_state_update("step", step + 1)
        return loss, {}


class TextEmbeddingDualEncoder(MultiStreamModel):
    """A two-stream model of `TextEmbeddingStreamEncoder`s, each reading its own sub-dict of
    the batch (`input_batch[<encoder name>]`) and replacing it with its outputs."""

    @config_class
    class Config(MultiStreamModel.Config):
        """Configures TextEmbeddingDualEncoder."""

        # The stream encoder shared as TEXT_DUAL_ENCODER_SHARED_MODULE_NAME (Siamese; None:
        # no sharing).
        shared_encoder_name: Optional[str] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.shared_encoder_name is not None:
            if cfg.shared_encoder_name not in self._stream_encoder:
                raise ValueError(
                    f"{self.path()}: shared_encoder_name {cfg.shared_encoder_name!r} is not a "
                    f"stream encoder ({sorted(self._stream_encoder)})"
                )
            self._share_with_descendants(
                self._stream_encoder[cfg.shared_encoder_name],
                shared_module_name=TEXT_DUAL_ENCODER_SHARED_MODULE_NAME,
            )

    def _forward_all_stream_encoder(self, input_batch: NestedTensor) -> NestedTensor:
        """Replaces each encoder's sub-dict of the batch with the encoder's outputs."""
        for name, encoder in self._stream_encoder.items():
            input_batch[name] = encoder(input_batch[name])
        return input_batch

    def forward_single_stream_encoder(
        self, input_batch: NestedTensor, encoder_name: str
    ) -> NestedTensor:
        """Runs one stream encoder on its sub-dict of the batch.

        Args:
            input_batch: The batch.
            encoder_name: The stream encoder's name.

        Returns:
            The encoder's outputs.

        Raises:
            ValueError: If there is no such encoder.
        """
        if encoder_name not in self._stream_encoder:
            raise ValueError(f"{self.path()}: {encoder_name} has not been found in stream_encoder.")
        return self._stream_encoder[encoder_name](input_batch[encoder_name])
