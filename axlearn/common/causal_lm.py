"""Autoregressive (decoder-only) language model, e.g. the GPT family.

Batch contract (docs/inputs.md): `input_ids` [B, T] int32; `target_labels` [B, T] int32 where a
negative label or the decoder's `pad_token_id` means "no target"; optional `target_num_bytes`
[B]; for packed examples `input_segment_ids` and `input_positions` [B, T]; optional
`token_type_ids`.

`forward(input_batch=...)` returns `(loss, aux_outputs)` where the loss is the cross-entropy
averaged over target tokens plus the z-loss, and adds these summaries (WeightedScalars weighted
by the number of target tokens unless noted):
    loss, cross_entropy_loss, z_loss, perplexity (exp of cross_entropy_loss), accuracy,
    num_targets (target tokens in the batch; weight 1), num_tokens (non-padding input tokens;
    weight 1), train_live_targets (targets per example; weight batch size),
    bits_per_byte (only with target_num_bytes; weight: total bytes), aux_loss (only with
    `aux_loss_regex`: summed matching module outputs, added to the loss).
"""

import math
import re
from typing import Any, Optional, Union

import jax.numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.attention import (
    PipelinedTransformerLayer,
    RepeatedTransformerLayer,
    StackedTransformerLayer,
    TransformerLayer,
)
from axlearn.common.base_layer import RematSpec
from axlearn.common.base_model import BaseModel
from axlearn.common.chunked_lm_loss import (  # noqa: F401 (first_max_index: public here too)
    chunked_lm_head_loss,
    first_max_index,
)
from axlearn.common.config import (
    REQUIRED,
    ConfigOr,
    InstantiableConfig,
    Required,
    config_class,
)
from axlearn.common.decoder import Decoder
from axlearn.common.decoding import (
    BeamSearchOutputs,
    BrevityPenaltyFn,
    SampleOutputs,
    StopDecodingCondition,
    brevity_penalty_fn,
)
from axlearn.common.embedding import LearnedPositionalEmbedding, TransformerTextEmbeddings
from axlearn.common.layers import LayerNorm
from axlearn.common.logit_modifiers import LogitsToLogitsFn
from axlearn.common.loss import cross_entropy
from axlearn.common.loss_metrics import BaseLossMetrics
from axlearn.common.metrics import WeightedScalar, WeightedSummary
from axlearn.common.module import Module, child_context
from axlearn.common.param_init import PARAM_REGEXP_WEIGHT, DefaultInitializer, WeightInitializer
from axlearn.common.utils import (
    NestedTensor,
    Tensor,
    flatten_items,
    validate_contains_paths,
    with_sharding_constraint,
)

_BATCH_SEQ_KEYS = (
    "input_ids",
    "target_labels",
    "input_segment_ids",
    "input_positions",
    "prefix",
)


def lm_loss_and_summaries(
    logits: Tensor,
    *,
    target_labels: Tensor,
    target_num_bytes: Optional[Tensor],
    input_ids: Optional[Tensor],
    pad_token_id: int,
    z_loss_scale: float,
) -> tuple[Tensor, Tensor, dict[str, WeightedScalar]]:
    """Next-token cross-entropy (+ z-loss) of `logits` and the LM summaries (module docstring).

    Args:
        logits: [batch, seq_len, vocab].
        target_labels: [batch, seq_len]; negative or `pad_token_id` means no target.
        target_num_bytes: Optional [batch] bytes per example (for bits_per_byte).
        input_ids: Optional [batch, seq_len] (for the num_tokens summary; None: no summary).
        pad_token_id: The padding id.
        z_loss_scale: Scale of the z-loss.

    Returns:
        (loss, per_token_loss [batch, seq_len], {summary name: WeightedScalar}).
    """
    live = (target_labels >= 0) & (target_labels != pad_token_id)
    loss, parts = cross_entropy(logits, target_labels, mask=live, z_loss_scale=z_loss_scale)
    denom = jnp.maximum(1.0, parts["num_targets"])
    correct = (first_max_index(logits) == target_labels) & live
    per_token_loss = parts["pre_mask_loss"] * live
    summaries = _lm_summaries(
        loss,
        parts=dict(parts, accuracy=correct.sum() / denom),
        per_token_loss=per_token_loss,
        input_ids=input_ids,
        target_num_bytes=target_num_bytes,
        pad_token_id=pad_token_id,
    )
    return loss, per_token_loss, summaries


def _lm_summaries(
    loss: Tensor,
    *,
    parts: dict[str, Tensor],
    per_token_loss: Tensor,
    input_ids: Optional[Tensor],
    target_num_bytes: Optional[Tensor],
    pad_token_id: int,
) -> dict[str, WeightedScalar]:
    """The LM summaries (module docstring) from the loss's parts (cross_entropy, z_loss,
    accuracy, num_targets) and the per-token loss [batch, seq_len] (0 where no target)."""
    num_targets = parts["num_targets"]
    batch_size = per_token_loss.shape[0]
    summaries = {
        "loss": WeightedScalar(loss, num_targets),
        "cross_entropy_loss": WeightedScalar(parts["cross_entropy"], num_targets),
        "z_loss": WeightedScalar(parts["z_loss"], num_targets),
        "perplexity": WeightedScalar(jnp.exp(parts["cross_entropy"]), num_targets),
        "accuracy": WeightedScalar(parts["accuracy"], num_targets),
        "num_targets": WeightedScalar(num_targets, 1.0),
        "train_live_targets": WeightedScalar(num_targets / batch_size, float(batch_size)),
    }
    if input_ids is not None:
        num_tokens = (input_ids != pad_token_id).sum().astype(jnp.float32)
        summaries["num_tokens"] = WeightedScalar(num_tokens, 1.0)
    if target_num_bytes is not None:
        total_bytes = target_num_bytes.sum()
        bits_per_byte = per_token_loss.sum() / jnp.maximum(1, total_bytes) / jnp.log(2.0)
        summaries["bits_per_byte"] = WeightedScalar(bits_per_byte, total_bytes)
    return summaries


class CrossEntropyLossMetrics(BaseLossMetrics):
    """The language-model loss: next-token cross-entropy plus z-loss, with the LM summaries."""

    @config_class
    class Config(BaseLossMetrics.Config):
        """Configures CrossEntropyLossMetrics."""

        # Padding id of target labels (no target); None: the model's decoder.pad_token_id.
        pad_token_id: Optional[int] = None
        # Scale of the z-loss; None: the model's z_loss_scale.
        z_loss_scale: Optional[float] = None

    def forward(self, input_batch, *, predict_outputs, module_outputs):
        """See `BaseLossMetrics.forward`; outputs also hold "per_token_loss" [batch, seq_len]."""
        del module_outputs
        cfg = self.config
        loss, per_token_loss, summaries = lm_loss_and_summaries(
            predict_outputs["logits"],
            target_labels=input_batch["target_labels"],
            target_num_bytes=input_batch.get("target_num_bytes"),
            input_ids=input_batch.get("input_ids"),
            pad_token_id=0 if cfg.pad_token_id is None else cfg.pad_token_id,
            z_loss_scale=cfg.z_loss_scale or 0.0,
        )
        return loss, dict(summaries=summaries, per_token_loss=per_token_loss)


class AuxLossMetrics(BaseLossMetrics):
    """Auxiliary losses: the sum of the module outputs whose paths match a regex.

    E.g. mixture-of-experts layers output "aux_loss"; with `aux_loss_regex` ".*/aux_loss" their
    sum is the loss (summary "aux_loss", weighted by the number of target tokens). Without a
    regex the loss is 0 and there are no summaries.
    """

    @config_class
    class Config(BaseLossMetrics.Config):
        """Configures AuxLossMetrics."""

        # Full-match regex of module output paths (e.g. "decoder/transformer/layer0/.../aux_loss")
        # to sum; None: the model's aux_loss_regex.
        aux_loss_regex: Optional[str] = None
        # Padding id of target labels (not counted in the summary weight); None: the model's.
        pad_token_id: Optional[int] = None

    def forward(self, input_batch, *, predict_outputs, module_outputs):
        """See `BaseLossMetrics.forward`."""
        del predict_outputs
        regex = self.config.aux_loss_regex
        if regex is None:
            return jnp.zeros([], jnp.float32), dict(summaries={})
        values = [v.sum() for k, v in module_outputs.items() if re.fullmatch(regex, k)]
        aux_loss = sum(values, jnp.zeros([], jnp.float32))
        labels = input_batch["target_labels"]
        pad_token_id = 0 if self.config.pad_token_id is None else self.config.pad_token_id
        weight = ((labels >= 0) & (labels != pad_token_id)).sum().astype(jnp.float32)
        return aux_loss, dict(summaries={"aux_loss": WeightedScalar(aux_loss, weight)})


class CompositeLossWeights(Module):
    """Computes the weight of each child loss of a `CompositeLossMetrics` (AXLearn's interface).

    Subclasses implement `forward`, e.g. fixed weights or weights from the child losses.
    """

    def forward(self, child_metrics: dict[str, tuple[Any, dict[str, Any]]]) -> dict[str, Any]:
        """Returns {child name: weight of its loss}.

        Args:
            child_metrics: {child name: (its loss, its outputs)}, as the children returned them.

        Returns:
            {child name: a scalar weight}; children left out (or None) weigh 1.
        """
        raise NotImplementedError(type(self))


class CompositeLossMetrics(BaseLossMetrics):
    """A weighted combination of child loss metrics; the children's summaries are merged.

    Two kinds of children are supported:
    - ours return (loss Tensor, {"summaries": {name: WeightedScalar}, ...}): the loss is
      sum(w[name] * loss of child name), a Tensor, with a "loss" summary (weighted as the first
      child's "loss" summary, else by 1);
    - AXLearn's return (WeightedSummary loss, metrics dict) and add their own summaries: the loss
      is the WeightedSummary sum of WeightedSummary(w[name] * mean, weight), i.e. the
      weight-averaged weighted losses, and the outputs also hold "loss_{name}", each child's
      unweighted loss. Tensor losses among such children are added to that mean (as AXLearn adds
      its aux losses).
    The weights w come from `loss_weights`: a dict (missing children weigh 1) or a
    `CompositeLossWeights` layer called with {name: (loss, outputs)}. Two children reporting the
    same summary name (other than "loss") is an error.
    """

    @config_class
    class Config(BaseLossMetrics.Config):
        """Configures CompositeLossMetrics."""

        # The child metrics by name, e.g. {"lm": CrossEntropyLossMetrics, "aux": AuxLossMetrics}.
        metrics: Required[dict[str, InstantiableConfig]] = REQUIRED
        # Optional {child name: weight of its loss} (missing children weigh 1), or a
        # CompositeLossWeights config computing the weights from the child losses.
        loss_weights: Optional[Union[dict[str, float], InstantiableConfig]] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if isinstance(cfg.loss_weights, dict):
            unknown = set(cfg.loss_weights) - set(cfg.metrics)
            if unknown:
                raise ValueError(
                    f"{self.path()}.loss_weights names {sorted(unknown)}, which are not in "
                    f"metrics {sorted(cfg.metrics)}: use the metrics' names"
                )
        elif cfg.loss_weights is not None:
            if "loss_weights" in cfg.metrics:
                raise ValueError(
                    f"{self.path()}.metrics has a child named 'loss_weights', the name of the "
                    "loss_weights layer: rename that metric."
                )
            self._add_child("loss_weights", cfg.loss_weights)
        for name, child in cfg.metrics.items():
            self._add_child(name, child)

    def forward(self, input_batch, *, predict_outputs, module_outputs):
        """See `BaseLossMetrics.forward` and the class docstring."""
        cfg = self.config
        results = {
            name: self.children[name](
                input_batch, predict_outputs=predict_outputs, module_outputs=module_outputs
            )
            for name in cfg.metrics
        }
        if isinstance(cfg.loss_weights, dict) or cfg.loss_weights is None:
            weights = cfg.loss_weights or {}
        else:
            weights = self.loss_weights(results)
        merged: dict = {}
        outputs: dict = {}
        loss_weight = None
        for _, child_outputs in results.values():
            for key, value in child_outputs.get("summaries", {}).items():
                if key == "loss":
                    loss_weight = value.weight if loss_weight is None else loss_weight
                    continue
                if key in merged:
                    raise KeyError(f"{self.path()}: summary {key!r} reported by two metrics")
                merged[key] = value
            outputs.update({k: v for k, v in child_outputs.items() if k != "summaries"})

        def weight_of(name):
            weight = weights.get(name)
            return 1.0 if weight is None else weight

        if not any(isinstance(loss, WeightedSummary) for loss, _ in results.values()):
            total = jnp.zeros([], jnp.float32)
            for name, (loss, _) in results.items():
                total = total + weight_of(name) * loss
            summaries = {"loss": WeightedScalar(total, 1.0 if loss_weight is None else loss_weight)}
            summaries.update(merged)
            return total, dict(outputs, summaries=summaries)
        # AXLearn's children: a WeightedSummary loss.
        mean_of = WeightedSummary(jnp.zeros([], jnp.float32), jnp.zeros([], jnp.float32))
        added = jnp.zeros([], jnp.float32)
        for name, (loss, _) in results.items():
            outputs[f"loss_{name}"] = loss
            if isinstance(loss, WeightedSummary):
                mean_of = mean_of + WeightedSummary(loss.mean * weight_of(name), loss.weight)
            else:
                added = added + weight_of(name) * loss
        total = WeightedSummary(mean_of.mean + added, mean_of.weight)
        summaries = {"loss": WeightedScalar(total.mean, total.weight)}
        summaries.update(merged)
        return total, dict(outputs, summaries=summaries)


def metrics_config(*, aux_loss_regex: Optional[str] = None) -> CompositeLossMetrics.Config:
    """The default LM loss metrics: cross-entropy ("lm") plus auxiliary losses ("aux").

    Args:
        aux_loss_regex: If set, the "aux" metric's regex of module outputs to sum (None: the
            model's `aux_loss_regex`).

    Returns:
        A CompositeLossMetrics config.
    """
    return CompositeLossMetrics.default_config().set(
        metrics={
            "lm": CrossEntropyLossMetrics.default_config(),
            "aux": AuxLossMetrics.default_config().set(aux_loss_regex=aux_loss_regex),
        }
    )


def _propagate_metrics_defaults(metrics_cfg: InstantiableConfig, model_cfg) -> InstantiableConfig:
    """A copy of `metrics_cfg` whose unset pad/z-loss/aux fields (recursively) take the model's."""
    metrics_cfg = metrics_cfg.clone()
    defaults = dict(
        pad_token_id=model_cfg.decoder.pad_token_id,
        z_loss_scale=model_cfg.z_loss_scale,
        aux_loss_regex=model_cfg.aux_loss_regex,
    )

    def fill(node):
        for key, value in defaults.items():
            if key in node and getattr(node, key) is None:
                setattr(node, key, value)
        if "metrics" in node and isinstance(node.metrics, dict):
            for child in node.metrics.values():
                fill(child)

    fill(metrics_cfg)
    return metrics_cfg


class Model(BaseModel):
    """A decoder-only transformer language model trained with next-token cross-entropy."""

    @config_class
    class Config(BaseModel.Config):
        """Configures Model."""

        # The decoder.
        decoder: InstantiableConfig = Decoder.default_config()
        # Scale of the auxiliary z-loss (logsumexp(logits)^2 averaged over targets); None or 0
        # disables.
        z_loss_scale: Optional[float] = None
        # Mesh axis name(s) sharding the batch axis of inputs.
        batch_axis_names: tuple = ("data",)
        # Mesh axis name(s) sharding the sequence axis of inputs; None leaves it unconstrained.
        seq_axis_names: Optional[tuple] = None
        # If set, the module outputs (of the model's invocation) whose paths, e.g.
        # "decoder/transformer/layer0/feed_forward/aux_loss", fully match this regex are summed
        # into an auxiliary loss added to the loss (summary "aux_loss"), e.g. the load-balancing
        # loss of mixture-of-experts layers.
        aux_loss_regex: Optional[str] = None
        # Optional loss metrics (e.g. CompositeLossMetrics of CrossEntropyLossMetrics and
        # AuxLossMetrics); None: the built-in cross-entropy (+ aux_loss_regex) loss. The metrics
        # compute the same loss and summaries; unset pad_token_id / z_loss_scale /
        # aux_loss_regex fields of the children take the model's.
        metrics: Optional[InstantiableConfig] = None
        # If set, the training loss computes the LM head and the cross-entropy (with z-loss and
        # accuracy) in chunks of this many positions along the sequence, with a custom gradient,
        # so that neither pass holds [batch, seq_len, vocab] logits; None: all at once. Needs
        # the built-in loss (`metrics` None).
        logits_chunk_size: Optional[int] = None
        # AXLearn's name for chunking the LM head and loss along the sequence: used as
        # logits_chunk_size when that is None and `metrics` is None; with `metrics` set, the loss
        # is computed unchunked (same values, the memory of the full logits).
        scan_chunk: Optional[int] = None

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.param_init = DefaultInitializer.default_config().set(
            init_by_param_name={
                PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                    fan=None, scale=0.02, distribution="normal"
                )
            }
        )
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("decoder", cfg.decoder)
        if cfg.metrics is not None:
            if cfg.logits_chunk_size is not None:
                raise ValueError(
                    f"{self.path()}.logits_chunk_size={cfg.logits_chunk_size} needs the built-in "
                    f"loss, but {self.path()}.metrics is set (its metrics read the full logits): "
                    "unset one of them."
                )
            self._add_child("metrics", _propagate_metrics_defaults(cfg.metrics, cfg))
        self._z_loss_scale = cfg.z_loss_scale or 0.0
        # The chunk size of the LM head and loss (and the field that set it), or None.
        self._logits_chunk_size, self._logits_chunk_field = (
            cfg.logits_chunk_size,
            "logits_chunk_size",
        )
        if cfg.logits_chunk_size is None and cfg.scan_chunk is not None and cfg.metrics is None:
            self._logits_chunk_size, self._logits_chunk_field = cfg.scan_chunk, "scan_chunk"
        self._batch_axis_names = cfg.batch_axis_names
        self._seq_axis_names = cfg.seq_axis_names
        self._pad_token_id = cfg.decoder.pad_token_id

    def _constrain(self, input_batch: NestedTensor) -> NestedTensor:
        batch = dict(input_batch)
        if self._batch_axis_names is None:
            return batch  # No input sharding constraints.
        for key, value in batch.items():
            if key in _BATCH_SEQ_KEYS or key == "token_type_ids":
                spec = PartitionSpec(self._batch_axis_names, self._seq_axis_names)
            elif key == "target_num_bytes":
                spec = PartitionSpec(self._batch_axis_names)
            else:
                continue
            batch[key] = with_sharding_constraint(value, spec)
        return batch

    def predict(self, input_batch: NestedTensor) -> dict[str, Tensor]:
        """Returns the decoder outputs {"logits", "hidden_states"} for `input_batch`."""
        return self.decoder(input_batch=self._decoder_batch(input_batch))

    def _decoder_batch(self, input_batch: NestedTensor) -> NestedTensor:
        """The decoder's input batch (sharding-constrained) of a model input batch."""
        batch = self._constrain(input_batch)
        if "input_ids" not in batch:
            raise KeyError(f"input_batch needs 'input_ids'; got keys {sorted(batch)}")
        decoder_batch = {
            k: v
            for k, v in batch.items()
            if k in ("input_ids", "input_segment_ids", "token_type_ids")
        }
        decoder_batch["positions"] = batch.get("input_positions")
        return decoder_batch

    def forward(
        self, input_batch: NestedTensor, return_aux: bool = False
    ) -> tuple[Optional[Tensor], NestedTensor]:
        """Computes the loss (and metrics as summaries).

        Args:
            input_batch: See the module docstring. Without `target_labels`, no loss is computed.
            return_aux: Whether to return logits, hidden states and per-token losses. With
                `logits_chunk_size` set, the loss is chunked only without return_aux (the
                caller asks for the full logits otherwise).

        Returns:
            (loss or None, aux_outputs): aux_outputs is {} unless return_aux, then it has
            "logits", "hidden_states" and (with targets) "per_label_loss" [B, T].
        """
        target_labels = input_batch.get("target_labels")
        if target_labels is not None and self._logits_chunk_size is not None:
            if not return_aux:
                return self._chunked_loss(input_batch), {}
        # Full logits: no chunk size, no targets, or the caller wants the logits.
        predictions = self.predict(input_batch)
        aux = dict(predictions)
        loss = None
        if target_labels is not None:
            loss, metrics = self._metrics(input_batch, predict_outputs=predictions)
            if metrics.get("per_token_loss") is not None:
                aux["per_label_loss"] = metrics["per_token_loss"]
            aux["metrics"] = metrics
        return loss, (aux if return_aux else {})

    def _metrics(
        self, input_batch: NestedTensor, *, predict_outputs: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss and metrics of `predict` outputs; adds the summaries (module docstring).

        Uses the `metrics` child if configured, else the built-in cross-entropy (+ z-loss and
        `aux_loss_regex`) loss.

        Args:
            input_batch: With "target_labels" [batch, seq_len]; optionally "input_ids" (for the
                num_tokens summary) and "target_num_bytes" [batch] (for bits_per_byte).
            predict_outputs: `predict`'s outputs ("logits" [batch, seq_len, vocab]).

        Returns:
            (loss, metrics): metrics maps each summary name (but num_tokens) to its value (a
            scalar; "cross_entropy" repeats cross_entropy_loss under AXLearn's name), plus
            "per_token_loss" [batch, seq_len] (0 where no target; None if the metrics child
            does not report it) and "live_targets" (bool [batch, seq_len]).

        Raises:
            KeyError: If input_batch has no "target_labels".
        """
        validate_contains_paths(input_batch, paths=["target_labels"])
        target_labels = input_batch["target_labels"]
        if "metrics" in self.children:
            outputs = self.get_invocation_context().output_collection.module_outputs
            loss, child_outputs = self.metrics(
                input_batch,
                predict_outputs=predict_outputs,
                module_outputs=dict(flatten_items(outputs)),
            )
            if isinstance(loss, WeightedSummary):  # AXLearn's metrics: the loss is its mean.
                loss = loss.mean
            summaries = child_outputs.get("summaries", {})
            for name, value in summaries.items():
                self.add_summary(name, value)
            per_token_loss = child_outputs.get("per_token_loss")
        else:
            loss, per_token_loss, summaries = lm_loss_and_summaries(
                predict_outputs["logits"],
                target_labels=target_labels,
                target_num_bytes=input_batch.get("target_num_bytes"),
                input_ids=input_batch.get("input_ids"),
                pad_token_id=self._pad_token_id,
                z_loss_scale=self._z_loss_scale,
            )
            loss = self._add_aux_loss_and_summaries(loss, summaries)
        # Summary values, but num_tokens (a property of the inputs, not of the predictions).
        metrics = {
            name: getattr(value, "mean", value)
            for name, value in summaries.items()
            if name != "num_tokens"
        }
        if "metrics" in self.children:  # Other outputs of the metrics (e.g. "loss_lm").
            for name, value in child_outputs.items():
                if name not in ("summaries", "per_token_loss"):
                    metrics.setdefault(name, value)
        if "cross_entropy_loss" in metrics:
            metrics["cross_entropy"] = metrics["cross_entropy_loss"]  # AXLearn's metric name.
        metrics["per_token_loss"] = per_token_loss
        metrics["live_targets"] = (target_labels >= 0) & (target_labels != self._pad_token_id)
        return loss, metrics

    def _chunked_loss(self, input_batch: NestedTensor) -> Tensor:
        """The loss of `forward` with the head and loss in chunks (`logits_chunk_size`)."""
        head = self.decoder.head_inputs(input_batch=self._decoder_batch(input_batch))
        target_labels = input_batch["target_labels"]
        live = (target_labels >= 0) & (target_labels != self._pad_token_id)
        loss, parts = chunked_lm_head_loss(
            head["hidden_states"],
            head["lm_head_weight"],
            target_labels,
            live_targets=live,
            chunk_size=self._logits_chunk_size,
            z_loss_scale=self._z_loss_scale,
            soft_cap=self.decoder.lm_head_soft_cap(),
            logits_partition_spec=self.config.decoder.logits_partition_spec,
            config_path=f"{self.path()}.{self._logits_chunk_field}",
        )
        summaries = _lm_summaries(
            loss,
            parts=parts,
            per_token_loss=parts["per_target_loss"] * live,
            input_ids=input_batch["input_ids"],
            target_num_bytes=input_batch.get("target_num_bytes"),
            pad_token_id=self._pad_token_id,
        )
        return self._add_aux_loss_and_summaries(loss, summaries)

    def _add_aux_loss_and_summaries(
        self, loss: Tensor, summaries: dict[str, WeightedScalar]
    ) -> Tensor:
        """Adds the aux loss (`aux_loss_regex`) to `loss`, and `summaries`; returns the loss."""
        if self.config.aux_loss_regex is not None:
            aux_loss = self._aux_loss(self.config.aux_loss_regex)
            loss = loss + aux_loss
            summaries["aux_loss"] = WeightedScalar(aux_loss, summaries["num_targets"].mean)
            summaries["loss"] = WeightedScalar(loss, summaries["num_targets"].mean)
        for name, value in summaries.items():
            self.add_summary(name, value)
        return loss

    def _aux_loss(self, regex: str) -> Tensor:
        """Sum of the module outputs whose paths fully match `regex` (0 if none)."""
        outputs = self.get_invocation_context().output_collection.module_outputs
        values = [v.sum() for k, v in flatten_items(outputs) if re.fullmatch(regex, k)]
        return sum(values, jnp.zeros([], jnp.float32))

    def score(self, input_batch: NestedTensor) -> dict[str, Tensor]:
        """Per-token losses of `input_batch` (no summaries).

        Args:
            input_batch: {"input_ids", "target_labels"} [batch, seq_len] (plus the optional
                keys of `forward`).

        Returns:
            {"per_token_loss": float [batch, seq_len] (0 where no target; as in `forward`'s
                per_label_loss, including the z-loss term),
             "live_targets": bool [batch, seq_len]}.

        Raises:
            KeyError: If "target_labels" is missing.
        """
        validate_contains_paths(input_batch, paths=["input_ids", "target_labels"])
        logits = self.predict(input_batch)["logits"]
        target_labels = input_batch["target_labels"]
        live = (target_labels >= 0) & (target_labels != self._pad_token_id)
        _, parts = cross_entropy(logits, target_labels, mask=live, z_loss_scale=self._z_loss_scale)
        return dict(per_token_loss=parts["pre_mask_loss"] * live, live_targets=live)

    def extract_logits(self, input_batch: NestedTensor) -> Tensor:
        """Returns the logits [batch, seq_len, vocab] of `input_batch` (see `predict`)."""
        return self.predict(input_batch)["logits"]

    def beam_search_decode(
        self,
        input_batch: NestedTensor,
        num_decodes: int = 1,
        brevity_penalty: Optional[BrevityPenaltyFn] = brevity_penalty_fn(alpha=0.0),
    ) -> BeamSearchOutputs:
        """Beam search after `input_batch["prefix"]` [batch, max_sequence_length].

        Args:
            input_batch: {"prefix": int [batch, max_sequence_length]}: prompts starting with a
                prompt token, right-padded with pad_token_id to the decode length.
            num_decodes: Number of beams.
            brevity_penalty: Length normalization.

        Returns:
            BeamSearchOutputs (see `axlearn.common.decoding`).
        """
        batch = self._constrain(input_batch)
        validate_contains_paths(batch, paths=["prefix"])
        with child_context("beam_search_decode", module=self.decoder):
            return self.decoder.beam_search_decode(
                input_batch=batch,
                max_sequence_length=batch["prefix"].shape[-1],
                num_decodes=num_decodes,
                brevity_penalty=brevity_penalty,
            )

    def sample_decode(
        self,
        input_batch: NestedTensor,
        *,
        num_decodes: int = 1,
        logits_modifier: Optional[ConfigOr[LogitsToLogitsFn]] = None,
        stop_decoding_condition: Optional[StopDecodingCondition] = None,
    ) -> SampleOutputs:
        """Samples after `input_batch["prefix"]` [batch, max_sequence_length].

        Args:
            input_batch: {"prefix": ...} as in `beam_search_decode`.
            num_decodes: Samples per prompt.
            logits_modifier: Applied before sampling (see `axlearn.common.logit_modifiers`).
            stop_decoding_condition: Default: stop after the decoder's eos_token_id.

        Returns:
            SampleOutputs (see `axlearn.common.decoding`).
        """
        batch = self._constrain(input_batch)
        validate_contains_paths(batch, paths=["prefix"])
        with child_context("sample_decode", module=self.decoder):
            return self.decoder.sample_decode(
                input_batch=batch,
                max_sequence_length=batch["prefix"].shape[-1],
                num_decodes=num_decodes,
                logits_modifier=logits_modifier,
                stop_decoding_condition=stop_decoding_condition,
            )


TransformerStackConfig = Union[
    StackedTransformerLayer.Config,
    RepeatedTransformerLayer.Config,
    PipelinedTransformerLayer.Config,
]


def residual_initializer_cfg(num_layers: int, scale: float = 0.02) -> DefaultInitializer.Config:
    """GPT-2's initializer of the projections feeding a residual: N(0, scale / sqrt(2 L)).

    Args:
        num_layers: The number of transformer layers L (each has 2 residual branches).
        scale: The standard deviation before scaling.

    Returns:
        A DefaultInitializer config for parameters named "*weight".
    """
    return DefaultInitializer.default_config().set(
        init_by_param_name={
            PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                fan=None, distribution="normal", scale=scale / math.sqrt(2 * num_layers)
            )
        }
    )


def gpt_decoder_config(
    stack_cfg: TransformerStackConfig,
    num_layers: int,
    hidden_dim: int,
    num_heads: int,
    vocab_size: int,
    max_position_embeddings: int,
    activation_function: str = "nn.relu",
    layer_norm_epsilon: float = 1e-08,
    dropout_rate: float = 0.0,
    layer_remat: Optional[RematSpec] = None,
) -> Decoder.Config:
    """A GPT-2 style decoder: learned positions, pre-norm layers, causal attention, 4x FFN.

    Args:
        stack_cfg: A StackedTransformerLayer, RepeatedTransformerLayer or
            PipelinedTransformerLayer config (not modified).
        num_layers: Number of transformer layers.
        hidden_dim: Model dim (embeddings and layer inputs/outputs).
        num_heads: Attention heads per layer.
        vocab_size: Vocabulary size.
        max_position_embeddings: Rows of the learned positional embedding table.
        activation_function: The feed-forward activation.
        layer_norm_epsilon: Epsilon of every LayerNorm.
        dropout_rate: Dropout rate throughout the model.
        layer_remat: If not None, the transformer layer's remat_spec.

    Returns:
        A Decoder config (attention masks causally itself: `attention_mask` is None).

    Raises:
        ValueError: If `stack_cfg` is not one of the three stack configs.
    """
    stack_classes = (StackedTransformerLayer, RepeatedTransformerLayer, PipelinedTransformerLayer)
    if getattr(stack_cfg, "klass", None) not in stack_classes:
        raise ValueError(
            f"gpt_decoder_config: stack_cfg must configure one of "
            f"{[c.__name__ for c in stack_classes]}; got {type(stack_cfg).__name__}"
        )
    layer_cfg = TransformerLayer.default_config()
    layer_cfg.feed_forward.activation = activation_function
    layer_cfg.feed_forward.norm = LayerNorm.default_config().set(eps=layer_norm_epsilon)
    layer_cfg.feed_forward.hidden_dim = 4 * hidden_dim
    layer_cfg.self_attention.norm = LayerNorm.default_config().set(eps=layer_norm_epsilon)
    layer_cfg.self_attention.attention.causal = True
    layer_cfg.self_attention.attention.num_heads = num_heads
    layer_cfg.self_attention.attention.output_linear.param_init = residual_initializer_cfg(
        num_layers=num_layers
    )
    layer_cfg.feed_forward.linear2.param_init = residual_initializer_cfg(num_layers=num_layers)
    layer_cfg.remat_spec = layer_remat
    return Decoder.default_config().set(
        transformer=stack_cfg.clone(num_layers=num_layers, layer=layer_cfg),
        dim=hidden_dim,
        vocab_size=vocab_size,
        emb=TransformerTextEmbeddings.default_config().set(
            pos_emb=LearnedPositionalEmbedding.default_config().set(
                shape=(max_position_embeddings,)
            )
        ),
        output_norm=LayerNorm.default_config().set(eps=layer_norm_epsilon),
        dropout_rate=dropout_rate,
        attention_mask=None,
    )
