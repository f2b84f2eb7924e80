"""Direct preference optimization (DPO, Rafailov et al. 2023) and IPO (Azar et al. 2023).

For a prompt x with a chosen response y_w and a rejected one y_l, with sequence log-probs
log pi(y | x) (summed over the response tokens and the final EOS) of the policy pi and of a
frozen reference pi_ref:

    h = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)]
    sigmoid (DPO): loss = -(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h)
    ipo:           loss = (h - 1 / (2 * beta))^2

(eps: `label_smoothing`, the conservative DPO of noisy labels; 0 by default.) The implicit
rewards are r_w = beta * (log pi(y_w|x) - log pi_ref(y_w|x)) and r_l likewise; the metrics are
their means, the mean margin r_w - r_l and the accuracy mean(r_w > r_l).

`DpoModel` holds the policy and the reference as two children with the same config: the
reference starts as a copy of the policy (`initialize_parameters_recursively`) and is kept in the
trainer state, frozen by the learner rule `FROZEN_REFERENCE_RULES` (no gradient, no optimizer
state) and run without gradients (stop_gradient) in eval mode. `PreferenceInput` makes the
batches from a JSON list of `{"prompt", "chosen", "rejected"}` records with the SFT template
and tokenizer (`axlearn.common.sft`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common.base_model import BaseModel
from axlearn.common.config import REQUIRED, Configurable, Required, config_class
from axlearn.common.learner import UpdateType
from axlearn.common.metrics import WeightedScalar
from axlearn.common.module import Module, child_context, nowrap
from axlearn.common.sft import (
    CharVocabulary,
    ChatTemplate,
    RowInputMixin,
    load_records,
    pad_rows,
    sft_example,
    split_records,
)
from axlearn.common.utils import NestedTensor, Tensor

# The learner's update_rules that freeze DpoModel's reference (no gradient, no optimizer state).
FROZEN_REFERENCE_RULES = [("reference/.*", UpdateType.NO_UPDATE)]
# The loss types of `dpo_loss`.
LOSS_TYPES = ("sigmoid", "ipo")
# The batch keys of PreferenceInput / DpoModel.
PREFERENCE_KEYS = (
    "chosen_input_ids",
    "chosen_target_labels",
    "rejected_input_ids",
    "rejected_target_labels",
)


class DpoOutputs(NamedTuple):
    """What `dpo_loss` returns (all float32)."""

    # The mean loss over the batch (scalar).
    loss: Tensor
    # Per pair: the loss [B].
    per_pair_loss: Tensor
    # Per pair: beta * (log pi(y_w|x) - log pi_ref(y_w|x)) [B].
    chosen_rewards: Tensor
    # Per pair: beta * (log pi(y_l|x) - log pi_ref(y_l|x)) [B].
    rejected_rewards: Tensor


def sequence_log_probs(logits: Tensor, target_labels: Tensor, *, pad_id: int = 0) -> Tensor:
    """Sums the log-probabilities of the live targets of each sequence.

    Args:
        logits: Float [B, T, V].
        target_labels: Int [B, T]; a negative label or `pad_id` is not a target.
        pad_id: The padding id.

    Returns:
        Float32 [B]: sum over live t of log softmax(logits[b, t])[target_labels[b, t]].
    """
    live = (target_labels >= 0) & (target_labels != pad_id)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, jnp.where(live, target_labels, 0)[..., None], axis=-1)[
        ..., 0
    ]
    return jnp.sum(jnp.where(live, picked, 0.0), axis=-1)


def dpo_loss(
    *,
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    reference_chosen: Tensor,
    reference_rejected: Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    valid: Optional[Tensor] = None,
) -> DpoOutputs:
    """The DPO (sigmoid) or IPO loss of a batch of preference pairs; see the module docstring.

    Args:
        policy_chosen: [B] log pi(y_w | x) of the policy.
        policy_rejected: [B] log pi(y_l | x) of the policy.
        reference_chosen: [B] log pi_ref(y_w | x).
        reference_rejected: [B] log pi_ref(y_l | x).
        beta: The KL weight (> 0).
        loss_type: "sigmoid" (DPO) or "ipo".
        label_smoothing: eps of the sigmoid loss, in [0, 0.5).
        valid: Optional bool [B]: the real pairs (padding pairs get loss 0 and are left out of
            the mean); None: all.

    Returns:
        DpoOutputs.

    Raises:
        ValueError: On an unknown loss_type, beta <= 0 or label_smoothing out of range.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"dpo_loss: loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if not beta > 0:
        raise ValueError(f"dpo_loss: beta must be > 0, got {beta}")
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"dpo_loss: label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_ratio = policy_chosen - reference_chosen
    rejected_ratio = policy_rejected - reference_rejected
    h = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        per_pair = -(1 - label_smoothing) * jax.nn.log_sigmoid(beta * h)
        per_pair = per_pair - label_smoothing * jax.nn.log_sigmoid(-beta * h)
    else:
        per_pair = jnp.square(h - 1.0 / (2.0 * beta))
    if valid is None:
        loss = jnp.mean(per_pair)
    else:
        per_pair = jnp.where(valid, per_pair, 0.0)
        loss = per_pair.sum() / jnp.maximum(valid.sum(), 1)
    return DpoOutputs(
        loss=loss,
        per_pair_loss=per_pair,
        chosen_rewards=beta * jax.lax.stop_gradient(chosen_ratio),
        rejected_rewards=beta * jax.lax.stop_gradient(rejected_ratio),
    )


def with_reference_copy(params: NestedTensor) -> NestedTensor:
    """`params` with "reference" a copy of "policy" (its own buffers): the frozen reference's
    initial state in a policy-and-reference model (DPO's, GRPO's).

    Args:
        params: {"policy": ..., "reference": ...} (the reference's values are replaced).

    Returns:
        The same dict.
    """
    params["reference"] = jax.tree.map(
        lambda p: None if p is None else jnp.copy(p), params["policy"]
    )
    return params


class DpoModel(BaseModel):
    """A policy trained with DPO/IPO against a frozen reference copy; see the module docstring.

    forward(input_batch) takes the PreferenceInput keys (int32 [B, T] each) and returns
    (loss, aux) with aux {"chosen_rewards", "rejected_rewards"} [B]; summaries: loss,
    rewards/{chosen,rejected,margin,accuracy} and logps/{chosen,rejected} (WeightedScalars:
    means over the pairs that have targets, weighted by their number).
    """

    @config_class
    class Config(BaseModel.Config):
        """Configures DpoModel."""

        # The policy (a causal_lm.Model); the reference is a second child of this config.
        policy: Required[Module.Config] = REQUIRED
        # The KL weight beta (> 0).
        beta: float = 0.1
        # "sigmoid" (DPO) or "ipo".
        loss_type: str = "sigmoid"
        # The label smoothing eps of the sigmoid loss (conservative DPO), in [0, 0.5).
        label_smoothing: float = 0.0

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.loss_type not in LOSS_TYPES:
            raise ValueError(
                f"{self.path()}.loss_type={cfg.loss_type!r}: must be one of {LOSS_TYPES}"
            )
        if not cfg.beta > 0:
            raise ValueError(f"{self.path()}.beta={cfg.beta!r}: must be > 0")
        if not 0 <= cfg.label_smoothing < 0.5:
            raise ValueError(
                f"{self.path()}.label_smoothing={cfg.label_smoothing!r}: must be in [0, 0.5)"
            )
        self._add_child("policy", cfg.policy)
        self._add_child("reference", cfg.policy.clone())
        self._pad_id = int(getattr(getattr(cfg.policy, "decoder", None), "pad_token_id", 0) or 0)

    def initialize_parameters_recursively(
        self, prng_key: Tensor, *, prebuilt: Optional[NestedTensor] = None
    ) -> NestedTensor:
        """Initializes the policy; the reference is a copy of it (its own buffers).

        Args:
            prng_key: The initialization key.
            prebuilt: As BaseLayer's.

        Returns:
            {"policy": ..., "reference": ...}.
        """
        params = super().initialize_parameters_recursively(prng_key, prebuilt=prebuilt)
        return with_reference_copy(params)

    def _log_probs(self, name: str, ids: Tensor, labels: Tensor) -> Tensor:
        child = getattr(self, name)
        if name == "reference":
            with child_context(
                "reference_eval", module=child, state=self.state["reference"], is_training=False
            ):
                logits = child.predict(input_batch=dict(input_ids=ids))["logits"]
            logits = jax.lax.stop_gradient(logits)
        else:
            logits = child.predict(input_batch=dict(input_ids=ids))["logits"]
        return sequence_log_probs(logits, labels, pad_id=self._pad_id)

    def forward(self, input_batch: NestedTensor, **kwargs) -> tuple[Tensor, NestedTensor]:
        """Computes the DPO/IPO loss of a preference batch.

        Args:
            input_batch: The PREFERENCE_KEYS, int32 [B, T] each.
            **kwargs: Unused.

        Returns:
            (loss, {"chosen_rewards", "rejected_rewards"}).

        Raises:
            KeyError: If a key is missing.
        """
        del kwargs
        missing = [k for k in PREFERENCE_KEYS if k not in input_batch]
        if missing:
            raise KeyError(
                f"{self.path()}: input_batch has no {missing}; got {sorted(input_batch)}"
            )
        cfg = self.config
        # Chosen and rejected rows go through each model in one batch.
        ids = jnp.concatenate([input_batch["chosen_input_ids"], input_batch["rejected_input_ids"]])
        labels = jnp.concatenate(
            [input_batch["chosen_target_labels"], input_batch["rejected_target_labels"]]
        )
        batch = input_batch["chosen_input_ids"].shape[0]
        # Pairs without targets (the rows that fill an eval pass's last batch) do not count.
        chosen_labels = input_batch["chosen_target_labels"]
        valid = jnp.any((chosen_labels >= 0) & (chosen_labels != self._pad_id), axis=-1)
        policy = self._log_probs("policy", ids, labels)
        reference = self._log_probs("reference", ids, labels)
        out = dpo_loss(
            policy_chosen=policy[:batch],
            policy_rejected=policy[batch:],
            reference_chosen=reference[:batch],
            reference_rejected=reference[batch:],
            beta=cfg.beta,
            loss_type=cfg.loss_type,
            label_smoothing=cfg.label_smoothing,
            valid=valid,
        )
        margin = out.chosen_rewards - out.rejected_rewards
        weight = valid.sum().astype(jnp.float32)

        def mean(x):
            return jnp.where(valid, x, 0.0).sum() / jnp.maximum(weight, 1.0)

        for name, value in (
            ("loss", out.loss),
            ("rewards/chosen", mean(out.chosen_rewards)),
            ("rewards/rejected", mean(out.rejected_rewards)),
            ("rewards/margin", mean(margin)),
            ("rewards/accuracy", mean((margin > 0).astype(jnp.float32))),
            ("logps/chosen", mean(jax.lax.stop_gradient(policy[:batch]))),
            ("logps/rejected", mean(jax.lax.stop_gradient(policy[batch:]))),
        ):
            self.add_summary(name, WeightedScalar(value, weight))
        return out.loss, dict(
            chosen_rewards=out.chosen_rewards, rejected_rewards=out.rejected_rewards
        )


def preference_example(
    prompt_ids: list[int], chosen_ids: list[int], rejected_ids: list[int], *, eos_id: int
) -> dict[str, np.ndarray]:
    """The chosen and rejected causal-LM examples of a pair (targets: response tokens + EOS).

    Args:
        prompt_ids: The prompt part's ids.
        chosen_ids: The chosen response part's ids.
        rejected_ids: The rejected response part's ids.
        eos_id: The EOS id.

    Returns:
        {"chosen": sft_example(...), "rejected": sft_example(...)}.
    """
    return dict(
        chosen=sft_example(prompt_ids, chosen_ids, eos_id=eos_id),
        rejected=sft_example(prompt_ids, rejected_ids, eos_id=eos_id),
    )


class PreferenceInput(RowInputMixin, Module):
    """Batches of preference pairs from a JSON file of {"prompt", "chosen", "rejected"} records.

    Keys: PREFERENCE_KEYS, int32 [batch, max_len] (one pair per row, right-padded; labels -1 on
    prompt tokens and padding).
    """

    @config_class
    class Config(Module.Config):
        """Configures PreferenceInput."""

        # Whether the input is for training (repeats, shuffled per epoch) or eval (one pass).
        is_training: Required[bool] = REQUIRED
        # The JSON file: a list of {"prompt": str, "chosen": str, "rejected": str}.
        path: Required[str] = REQUIRED
        # Pairs per global batch (divisible by the process count).
        global_batch_size: Required[int] = REQUIRED
        # "train", "validation" (record i with i % holdout_every == 0) or "all".
        split: str = "train"
        # The held-out period of `split` (>= 2).
        holdout_every: int = 5
        # Tokens per row.
        max_len: int = 32
        # The shuffle seed (training: the pairs are shuffled each epoch).
        seed: int = 0
        # The number of batches; None: unlimited (training) or one pass (eval).
        total_num_batches: Optional[int] = None
        # The tokenizer: encode(text) -> ids, eos_id, pad_id.
        vocab: Configurable.Config = CharVocabulary.default_config()
        # The chat template (the response part renders `chosen` and `rejected`).
        template: ChatTemplate.Config = ChatTemplate.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        count, index = jax.process_count(), jax.process_index()
        if cfg.global_batch_size <= 0 or cfg.global_batch_size % count:
            raise ValueError(
                f"{self.path()}.global_batch_size={cfg.global_batch_size} must be positive and "
                f"divisible by the process count ({count})"
            )
        if cfg.holdout_every < 2:
            raise ValueError(f"{self.path()}.holdout_every={cfg.holdout_every} must be >= 2")
        per = cfg.global_batch_size // count
        self._rows = range(index * per, (index + 1) * per)
        self._vocab = cfg.vocab.instantiate()
        try:
            self._template = cfg.template.instantiate()
        except ValueError as e:
            raise ValueError(f"{self.path()}.template: {e}") from None
        records = load_records(cfg.path, fields=("prompt", "chosen", "rejected"), what=self.path())
        records = split_records(records, split=cfg.split, holdout_every=cfg.holdout_every)
        self._pairs = [self._tokenize(i, r) for i, r in enumerate(records)]

    def _tokenize(self, index: int, record: dict[str, str]) -> dict[str, Any]:
        cfg = self.config
        prompt, chosen = self._template.render(record["prompt"], record["chosen"])
        _, rejected = self._template.render(record["prompt"], record["rejected"])
        encode = self._vocab.encode
        pair = preference_example(
            encode(prompt), encode(chosen), encode(rejected), eos_id=self._vocab.eos_id
        )
        for side, ex in pair.items():
            if len(ex["input_ids"]) > cfg.max_len:
                raise ValueError(
                    f"{self.path()}: {cfg.split} record {index} ({side}) has "
                    f"{len(ex['input_ids'])} tokens > max_len={cfg.max_len}: {record!r}"
                )
        return pair

    @property
    def pairs(self) -> list[dict[str, Any]]:
        """The split's tokenized pairs, in record order."""
        return self._pairs

    def _epoch_rows(self, epoch: int) -> dict[str, np.ndarray]:
        cfg = self.config
        order = np.arange(len(self._pairs))
        if cfg.is_training:
            order = np.random.default_rng([cfg.seed, epoch]).permutation(order)
        out = {}
        for side in ("chosen", "rejected"):
            rows = pad_rows(
                [self._pairs[i][side] for i in order],
                max_len=cfg.max_len,
                pad_id=self._vocab.pad_id,
            )
            out[f"{side}_input_ids"] = rows["input_ids"]
            out[f"{side}_target_labels"] = rows["target_labels"]
        return out

    @nowrap
    def element_spec(self) -> dict[str, Any]:
        """This process's batch shapes (`jax.ShapeDtypeStruct`s)."""
        shape = (len(self._rows), self.config.max_len)
        return {k: jax.ShapeDtypeStruct(shape, np.int32) for k in PREFERENCE_KEYS}
