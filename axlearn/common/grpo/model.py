"""GrpoModel: GRPO's policy and frozen reference as one model of `SpmdTrainer`.

Like `dpo.DpoModel`, the model holds two children of one causal-LM config, `policy` and
`reference`; the reference starts as a copy of the policy, stays in the trainer state and is
frozen by the learner rule `FROZEN_REFERENCE_RULES` (no gradient, no optimizer state).

The trainer's batch processor (`rollout.GrpoRollout`) turns each prompt batch into a rollout
batch with the model's two other methods, then the train step calls `forward` on it:

- `sample_rollouts(prefix, ...)`: `group_size` samples per prompt with the policy's KV-cache
  decoding (`Decoder.sample_decode`; temperature, top-k, top-p through the logits modifier);
- `reference_log_probs(input_batch)`: the frozen reference's log-probs of the sampled tokens;
- `forward(input_batch)`: GRPO's clipped surrogate with a k3 KL to the reference
  (`loss.grpo_loss`), on the ROLLOUT_KEYS.

The module-level helpers (`sample_decode_inputs`, `rollout_ids`, `completion_mask`,
`split_completions`) are shared with the standalone `trainer.GrpoTrainer`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common.base_model import BaseModel
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.decoding import StopOnSubsequence, infer_initial_time_step
from axlearn.common.dpo import with_reference_copy
from axlearn.common.grpo.loss import grpo_loss, token_log_probs
from axlearn.common.learner import UpdateType
from axlearn.common.metrics import WeightedScalar
from axlearn.common.module import Module, child_context
from axlearn.common.utils import NestedTensor, Tensor

# The learner's update_rules that freeze GrpoModel's reference (no gradient, no optimizer state).
FROZEN_REFERENCE_RULES = [("reference/.*", UpdateType.NO_UPDATE)]
# The keys of a rollout batch (what `forward` reads), [N, L - 1] unless noted:
# input_ids (ids[:, :-1]), target_labels (ids[:, 1:], the scored tokens), completion_mask (1 on
# sampled tokens), reference_log_probs, advantages [N] and rewards [N].
ROLLOUT_KEYS = (
    "input_ids",
    "target_labels",
    "completion_mask",
    "reference_log_probs",
    "advantages",
    "rewards",
)


def sample_decode_inputs(
    prefix: Tensor,
    *,
    group_size: int,
    max_new_tokens: int,
    modifier: Optional[Callable],
    eos_id: int,
) -> dict[str, Any]:
    """The keyword arguments of `Decoder.sample_decode` for a GRPO rollout.

    Args:
        prefix: Int32 [B, P] prompts (each starting with a prompt token, right-padded).
        group_size: Samples per prompt.
        max_new_tokens: Tokens sampled per completion.
        modifier: The logits modifier (temperature, top-k, top-p), or None.
        eos_id: The stop token.

    Returns:
        The inputs of `sample_decode`.
    """
    return dict(
        input_batch=dict(prefix=prefix),
        # Output position j holds input position j + 1: P + T - 1 cache positions give the
        # tokens at positions 1 .. P + T - 1.
        max_sequence_length=prefix.shape[1] + max_new_tokens - 1,
        num_decodes=group_size,
        logits_modifier=modifier,
        stop_decoding_condition=StopOnSubsequence([[eos_id]]),
    )


def rollout_ids(prefix: Tensor, sequences: Tensor) -> Tensor:
    """Prompt-major sample rows from `sample_decode`'s sequences.

    Args:
        prefix: Int [B, P] prompts.
        sequences: Int [B, G, P + T - 1] (`sample_decode` outputs: positions 1 ..).

    Returns:
        Int32 [B * G, P + T]: row i * G + j is sample j of prompt i (the prompt, then the
        sampled tokens, pad after an EOS).
    """
    batch, group = sequences.shape[:2]
    first = jnp.broadcast_to(prefix[:, None, :1], (batch, group, 1)).astype(jnp.int32)
    ids = jnp.concatenate([first, sequences.astype(jnp.int32)], axis=-1)
    return ids.reshape(batch * group, -1)


def completion_mask(prefix: Tensor, ids: Tensor, *, group_size: int, pad_id: int) -> Tensor:
    """1 where ids[:, t + 1] is a sampled token (after the prompt, up to its EOS).

    Args:
        prefix: Int [B, P] prompts.
        ids: Int [B * G, L] from `rollout_ids`.
        group_size: G.
        pad_id: The padding id.

    Returns:
        Float32 [B * G, L - 1] over the scored positions 1 .. L - 1.
    """
    time_step = infer_initial_time_step(prefix, pad_id=pad_id)
    time_step = jnp.repeat(time_step, group_size)
    positions = jnp.arange(1, ids.shape[1])[None, :]
    return ((positions > time_step[:, None]) & (ids[:, 1:] != pad_id)).astype(jnp.float32)


def split_completions(
    ids: np.ndarray, prefix: np.ndarray, *, group_size: int, pad_id: int, eos_id: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per sample (host): the prompt without padding and the completion before its first EOS.

    Args:
        ids: Int [B * G, L] rollout rows.
        prefix: Int [B, P] prompts.
        group_size: G.
        pad_id: The padding id.
        eos_id: The stop token.

    Returns:
        (prompts, completions): lists of B * G int arrays.
    """
    prompts, completions = [], []
    for row in range(ids.shape[0]):
        prompt = prefix[row // group_size]
        last = int(np.max(np.nonzero(prompt != pad_id)[0], initial=0))
        new = ids[row, last + 1 :]
        stop = np.nonzero((new == eos_id) | (new == pad_id))[0]
        prompts.append(prompt[: last + 1])
        completions.append(new[: stop[0]] if stop.size else new)
    return prompts, completions


class GrpoModel(BaseModel):
    """A policy trained with GRPO against a frozen reference copy; see the module docstring.

    forward(input_batch) takes a rollout batch (ROLLOUT_KEYS) and returns (loss, aux) with aux
    {"policy_loss", "kl", "clip_fraction"}; summaries (WeightedScalars): loss, policy_loss, kl,
    clip_fraction, reward_mean, advantage_abs_mean, completion_length.
    """

    @config_class
    class Config(BaseModel.Config):
        """Configures GrpoModel."""

        # The policy (a causal_lm.Model); the reference is a second child of this config.
        policy: Required[Module.Config] = REQUIRED
        # Sampling temperature (> 0); log-probs are of softmax(logits / temperature).
        temperature: float = 1.0
        # The ratio clip epsilon of the surrogate (> 0).
        clip_epsilon: float = 0.2
        # beta: the weight of the k3 KL to the reference (>= 0).
        kl_coef: float = 0.04

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        for name, ok, what in (
            ("temperature", cfg.temperature > 0, "> 0 (GRPO samples)"),
            ("clip_epsilon", cfg.clip_epsilon > 0, "> 0 (e.g. 0.2)"),
            ("kl_coef", cfg.kl_coef >= 0, ">= 0 (0: no KL term)"),
        ):
            if not ok:
                raise ValueError(f"{self.path()}.{name}={getattr(cfg, name)!r}: must be {what}.")
        self._add_child("policy", cfg.policy)
        self._add_child("reference", cfg.policy.clone())
        decoder = getattr(cfg.policy, "decoder", None)
        self._pad_id = int(getattr(decoder, "pad_token_id", 0) or 0)
        self._eos_id = int(getattr(decoder, "eos_token_id", 1))

    @property
    def pad_id(self) -> int:
        """The policy decoder's padding id."""
        return self._pad_id

    @property
    def eos_id(self) -> int:
        """The policy decoder's EOS id (the stop token of rollouts)."""
        return self._eos_id

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

    def sample_rollouts(
        self,
        prefix: Tensor,
        *,
        group_size: int,
        max_new_tokens: int,
        modifier: Optional[Callable] = None,
    ) -> Tensor:
        """Samples `group_size` completions of each prompt with the policy's KV cache.

        Args:
            prefix: Int32 [B, P] prompts.
            group_size: Samples per prompt.
            max_new_tokens: Tokens sampled per completion (a completion also stops at EOS).
            modifier: The logits modifier (temperature, top-k, top-p).

        Returns:
            Int32 [B * G, P + max_new_tokens] (`rollout_ids`).
        """
        outputs = self.policy.decoder.sample_decode(
            **sample_decode_inputs(
                prefix,
                group_size=group_size,
                max_new_tokens=max_new_tokens,
                modifier=modifier,
                eos_id=self._eos_id,
            )
        )
        return rollout_ids(prefix, jax.lax.stop_gradient(outputs.sequences))

    def reference_log_probs(self, input_batch: NestedTensor) -> Tensor:
        """The frozen reference's log-probs of the sampled tokens (eval mode, no gradient).

        Args:
            input_batch: "input_ids" and "target_labels", int [N, L - 1].

        Returns:
            Float32 [N, L - 1] at the model's temperature.
        """
        with child_context(
            "reference_eval",
            module=self.reference,
            state=self.state["reference"],
            is_training=False,
        ):
            logits = self.reference.predict(input_batch=dict(input_ids=input_batch["input_ids"]))
        return jax.lax.stop_gradient(
            token_log_probs(
                logits["logits"], input_batch["target_labels"], temperature=self.config.temperature
            )
        )

    def forward(self, input_batch: NestedTensor, **kwargs) -> tuple[Tensor, NestedTensor]:
        """Computes the GRPO loss of a rollout batch.

        Args:
            input_batch: The ROLLOUT_KEYS.
            **kwargs: Unused.

        Returns:
            (loss, {"policy_loss", "kl", "clip_fraction"}).

        Raises:
            KeyError: If a key is missing.
        """
        del kwargs
        missing = [k for k in ROLLOUT_KEYS if k not in input_batch]
        if missing:
            raise KeyError(
                f"{self.path()}: input_batch has no {missing} (a rollout batch comes from "
                f"grpo.rollout.GrpoRollout); got {sorted(input_batch)}"
            )
        cfg = self.config
        logits = self.policy.predict(input_batch=dict(input_ids=input_batch["input_ids"]))
        log_probs = token_log_probs(
            logits["logits"], input_batch["target_labels"], temperature=cfg.temperature
        )
        mask = input_batch["completion_mask"]
        out = grpo_loss(
            log_probs=log_probs,
            old_log_probs=jax.lax.stop_gradient(log_probs),
            ref_log_probs=input_batch["reference_log_probs"],
            advantages=input_batch["advantages"],
            mask=mask,
            clip_epsilon=cfg.clip_epsilon,
            kl_coef=cfg.kl_coef,
        )
        num = jnp.asarray(mask.shape[0], jnp.float32)
        for name, value in (
            ("loss", out.loss),
            ("policy_loss", out.policy_loss),
            ("kl", out.kl),
            ("clip_fraction", out.clip_fraction),
            ("reward_mean", input_batch["rewards"].astype(jnp.float32).mean()),
            ("advantage_abs_mean", jnp.abs(input_batch["advantages"]).mean()),
            ("completion_length", mask.astype(jnp.float32).sum(axis=1).mean()),
        ):
            self.add_summary(name, WeightedScalar(value, num))
        return out.loss, dict(
            policy_loss=out.policy_loss, kl=out.kl, clip_fraction=out.clip_fraction
        )
