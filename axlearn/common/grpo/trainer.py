"""GrpoTrainer: Group Relative Policy Optimization of a causal LM on a verifiable reward.

Each step (all three computations are jit-compiled, ahead of time, before the first step):

    prompts [B, P] -> rollout: `group_size` samples per prompt with the policy's KV-cache
        decoding (`Decoder.sample_decode`; temperature, top-k, top-p) -> ids [B * G, P + T]
    -> rewards (host: `reward`, one per sample, checked finite) -> group-relative advantages
    -> reference log-probs: the frozen reference model scores the samples
    -> training: GRPO's clipped surrogate with a k3 KL to the reference; one learner update.

The trainer state is {"prng_key", "model" (the policy), "learner" (its optimizer state),
"reference"}: the reference is the policy's initial parameters, held without optimizer state
or gradients and never updated (bit-identical for the whole run). Samples are scored under
softmax(logits / temperature), the distribution they were drawn from (before top-k/p). The
policy that sampled is the one being trained (one update per rollout), so the ratio's value is
1 and its gradient is the policy gradient; the clip matters only for several updates per
rollout (`grpo_loss` takes the old log-probs).

The prompt source (`input`) is indexed by step (`batch(step - 1)`), so a resumed run reads the
same prompts; a checkpoint holds the trainer state and its step. With `LoraConfigModifier` on
this config (its `model` and `learner` fields), only the adapters train; the reference then is
the base model (the adapters start at zero).

Time. Each step's rollout (sampling and rewards), reference and training seconds are in the
step's metrics (`metrics.jsonl`) and are recorded as `rollout` and `reference` spans for
`axlearn goodput`, which splits the productive time into rollout, reference and training.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from axlearn.common import measurement
from axlearn.common.checkpointer import Checkpointer
from axlearn.common.config import (
    REQUIRED,
    InstantiableConfig,
    Required,
    config_class,
)
from axlearn.common.grpo.loss import group_advantages, grpo_loss, token_log_probs
from axlearn.common.grpo.model import (
    completion_mask,
    rollout_ids,
    sample_decode_inputs,
    split_completions,
)
from axlearn.common.grpo.rollout import REFERENCE_SPAN, ROLLOUT_SPAN, score_rollouts
from axlearn.common.inference import logits_modifier
from axlearn.common.module import Module, child_context, new_output_collection
from axlearn.common.module import functional as F
from axlearn.common.summary_writer import JsonlWriter
from axlearn.common.trainer_step import opt_params
from axlearn.common.update_transformation import ForwardOutputs
from axlearn.common.utils import NestedTensor, Tensor


class GrpoTrainer(Module):
    """Trains a causal LM with GRPO; see the module docstring."""

    @config_class
    class Config(Module.Config):
        """Configures GrpoTrainer."""

        # The trainer directory (checkpoints/, metrics.jsonl).
        dir: Required[str] = REQUIRED
        # The step at which training stops.
        max_step: int = 100
        # The prompt source: `batch(index) -> {"prefix": int32 [B, P], <fields for the reward>}`,
        # each prompt starting with a prompt token and right-padded with the pad id.
        input: Required[InstantiableConfig] = REQUIRED
        # The policy (a causal_lm.Model); its initial parameters are also the reference's.
        model: Required[InstantiableConfig] = REQUIRED
        # The learner (optimizer, update rules) of the policy.
        learner: Required[InstantiableConfig] = REQUIRED
        # The reward: instantiates to `reward(prompt=, completion=, example=) -> float`
        # (grpo.rewards.RewardFunction by import path, or a checker such as CopyDigitsReward).
        reward: Required[InstantiableConfig] = REQUIRED
        # The checkpointer; dir defaults to <dir>/checkpoints.
        checkpointer: Checkpointer.Config = Checkpointer.default_config()
        # Samples per prompt (G >= 2): advantages are relative to the prompt's group.
        group_size: int = 8
        # Tokens sampled per completion (T >= 1); a completion also stops at EOS.
        max_new_tokens: int = 8
        # Sampling temperature (> 0); log-probs are of softmax(logits / temperature).
        temperature: float = 1.0
        # If set, sample among the top_k most likely tokens only.
        top_k: Optional[int] = None
        # If set, sample from the nucleus of probability top_p only.
        top_p: Optional[float] = None
        # The ratio clip epsilon of the surrogate (> 0).
        clip_epsilon: float = 0.2
        # beta: the weight of the k3 KL to the reference (>= 0).
        kl_coef: float = 0.04
        # Added to each group's reward standard deviation in the advantages (> 0).
        advantage_eps: float = 1e-4

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._check_config(cfg)
        self._add_child("model", cfg.model)
        self._add_child("learner", cfg.learner)
        ckpt_cfg = cfg.checkpointer.clone()
        if getattr(ckpt_cfg, "dir", REQUIRED) is REQUIRED:
            ckpt_cfg.dir = os.path.join(cfg.dir, "checkpoints")
        self._add_child("checkpointer", ckpt_cfg)
        self._metrics_writer = self._add_child(
            "metrics_writer", JsonlWriter.default_config().set(dir=cfg.dir)
        )
        self._prompts = cfg.input.instantiate()
        self._reward = cfg.reward.instantiate()
        self._param_specs = self.model.create_parameter_specs_recursively()
        decoder_cfg = cfg.model.decoder
        self._pad_id = int(decoder_cfg.pad_token_id)
        self._eos_id = int(decoder_cfg.eos_token_id)
        self._modifier = logits_modifier(
            temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p
        )
        self._state: Optional[dict[str, Any]] = None
        self._step: Optional[int] = None
        self._compiled: dict[str, Any] = {}
        self._jit_init = jax.jit(self._init_state)

    def _check_config(self, cfg: Config) -> None:
        checks = [
            (
                "group_size",
                cfg.group_size,
                isinstance(cfg.group_size, int) and cfg.group_size >= 2,
                "an integer >= 2 (advantages compare samples of a prompt)",
            ),
            (
                "max_new_tokens",
                cfg.max_new_tokens,
                isinstance(cfg.max_new_tokens, int) and cfg.max_new_tokens >= 1,
                "an integer >= 1",
            ),
            ("temperature", cfg.temperature, cfg.temperature > 0, "> 0 (GRPO samples)"),
            ("clip_epsilon", cfg.clip_epsilon, cfg.clip_epsilon > 0, "> 0 (e.g. 0.2)"),
            ("kl_coef", cfg.kl_coef, cfg.kl_coef >= 0, ">= 0 (0: no KL term)"),
            ("advantage_eps", cfg.advantage_eps, cfg.advantage_eps > 0, "> 0 (e.g. 1e-4)"),
        ]
        for name, value, ok, what in checks:
            if not ok:
                raise ValueError(f"{self.path()}.{name}={value!r}: must be {what}.")

    # ------------------------------------------------------------------------------------------
    # Properties.
    # ------------------------------------------------------------------------------------------

    @property
    def step(self) -> Optional[int]:
        """The step of the current state (None before init/restore)."""
        return self._step

    @property
    def trainer_state(self) -> Optional[dict[str, Any]]:
        """{"prng_key", "model", "learner", "reference"}."""
        return self._state

    @property
    def prompts(self) -> Any:
        """The prompt source."""
        return self._prompts

    # ------------------------------------------------------------------------------------------
    # The step's computations (pure functions; jitted in `_compile`).
    # ------------------------------------------------------------------------------------------

    def _keys(self, prng_key: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(next step's key, rollout key, training key) of a step's key."""
        next_key, rollout_key, train_key = jax.random.split(prng_key, 3)
        return next_key, rollout_key, train_key

    def rollout(self, params: NestedTensor, prng_key: Tensor, prefix: Tensor) -> Tensor:
        """Samples `group_size` completions of each prompt with the KV cache.

        Args:
            params: The policy parameters.
            prng_key: The step's key (the rollout key is derived from it).
            prefix: Int32 [B, P] prompts.

        Returns:
            Int32 [B * group_size, P + max_new_tokens]: prompt-major samples (row i * G + j is
            sample j of prompt i): the prompt, then the sampled tokens (pad after an EOS).
        """
        cfg = self.config
        _, rollout_key, _ = self._keys(prng_key)
        outputs, _ = F(
            self.model.decoder,
            prng_key=rollout_key,
            state=params["decoder"],
            inputs=sample_decode_inputs(
                prefix,
                group_size=cfg.group_size,
                max_new_tokens=cfg.max_new_tokens,
                modifier=self._modifier,
                eos_id=self._eos_id,
            ),
            is_training=False,
            method="sample_decode",
        )
        return rollout_ids(prefix, outputs.sequences)

    def completion_mask(self, prefix: Tensor, ids: Tensor) -> Tensor:
        """1 where ids[:, t + 1] is a sampled token (after the prompt, up to its EOS).

        Args:
            prefix: Int [B, P] prompts.
            ids: Int [B * G, L] from `rollout`.

        Returns:
            Float32 [B * G, L - 1] over the scored positions 1 .. L - 1.
        """
        return completion_mask(prefix, ids, group_size=self.config.group_size, pad_id=self._pad_id)

    def log_probs(self, params: NestedTensor, ids: Tensor, *, is_training: bool = False) -> Tensor:
        """Log-probabilities of ids[:, 1:] under a model with `params` (at the temperature).

        Args:
            params: Parameters of the policy's model (the policy's or the reference's).
            ids: Int [N, L].
            is_training: The model's mode.

        Returns:
            Float32 [N, L - 1].
        """
        outputs, _ = F(
            self.model,
            prng_key=None,
            state=params,
            inputs=dict(input_batch=dict(input_ids=ids[:, :-1])),
            is_training=is_training,
            method="predict",
        )
        return token_log_probs(outputs["logits"], ids[:, 1:], temperature=self.config.temperature)

    def _train_fn(
        self, state: dict[str, Any], ids: Tensor, mask: Tensor, rewards: Tensor, ref: Tensor
    ) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """One learner update on a rollout batch; returns (new state, scalar metrics)."""
        cfg = self.config
        next_key, _, train_key = self._keys(state["prng_key"])
        forward_key, learner_key = jax.random.split(train_key)
        advantages = group_advantages(rewards, group_size=cfg.group_size, eps=cfg.advantage_eps)

        def forward(*, model_params, inputs):
            collection = new_output_collection()
            with child_context(
                "model",
                module=self.model,
                state=model_params,
                prng_key=inputs["forward_key"],
                output_collection=collection,
            ):
                logits = self.model.predict(input_batch=dict(input_ids=ids[:, :-1]))["logits"]
            log_probs = token_log_probs(logits, ids[:, 1:], temperature=cfg.temperature)
            out = grpo_loss(
                log_probs=log_probs,
                old_log_probs=jax.lax.stop_gradient(log_probs),
                ref_log_probs=ref,
                advantages=advantages,
                mask=mask,
                clip_epsilon=cfg.clip_epsilon,
                kl_coef=cfg.kl_coef,
            )
            return ForwardOutputs(loss=out.loss, aux=out._asdict(), output_collection=collection)

        fwd_bwd, learner_collection = F(
            self.learner,
            method="forward_and_backward",
            prng_key=learner_key,
            state=state["learner"],
            inputs=dict(
                fn=forward,
                opt_params=opt_params(state["model"], self._param_specs),
                inputs=dict(forward_key=forward_key),
            ),
            is_training=True,
        )
        new_state = dict(
            prng_key=next_key,
            model=fwd_bwd.backward_outputs.updated_params,
            learner=learner_collection.state_updates,
            reference=state["reference"],
        )
        metrics = dict(fwd_bwd.forward_outputs.aux)
        metrics["advantage_abs_mean"] = jnp.abs(advantages).mean()
        return new_state, metrics

    # ------------------------------------------------------------------------------------------
    # State: init, restore, compile.
    # ------------------------------------------------------------------------------------------

    def _init_state(self, prng_key: Tensor) -> dict[str, Any]:
        key, init_key = jax.random.split(prng_key)
        params = self.model.initialize_parameters_recursively(init_key, prebuilt=None)
        return dict(
            prng_key=key,
            model=params,
            learner=self.learner.init(opt_params(params, self._param_specs)),
            # A copy (its own buffers): the policy's are donated to each update.
            reference=jax.tree.map(jnp.copy, params),
        )

    def init(self, prng_key: Tensor) -> None:
        """Initializes the state (policy, learner state, reference) at step 0.

        Args:
            prng_key: The initialization key.
        """
        self._state = self._jit_init(prng_key)
        self._step = 0

    def restore_or_init(self, prng_key: Tensor) -> Optional[int]:
        """Restores the newest committed checkpoint, or initializes the state.

        Args:
            prng_key: The initialization key (when there is nothing to restore).

        Returns:
            The restored step, or None (initialized).
        """
        device = jax.devices()[0]
        sharding = jax.sharding.SingleDeviceSharding(device)
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
            jax.eval_shape(self._init_state, prng_key),
        )
        step, state = self.checkpointer.restore(state=abstract)
        if step is None:
            self.init(prng_key)
            return None
        self._state, self._step = state, step
        logging.info("%s: restored step %d.", self.path(), step)
        return step

    def _compile(self, prefix: np.ndarray) -> None:
        """AOT-compiles the rollout, reference and training computations for these shapes."""
        cfg = self.config
        state = self._state
        n = prefix.shape[0] * cfg.group_size
        length = prefix.shape[1] + cfg.max_new_tokens
        spec = jax.ShapeDtypeStruct
        ids = spec((n, length), jnp.int32)
        scored = spec((n, length - 1), jnp.float32)
        self._compiled = dict(
            rollout=jax.jit(self.rollout)
            .lower(state["model"], state["prng_key"], prefix)
            .compile(),
            mask=jax.jit(self.completion_mask).lower(prefix, ids).compile(),
            reference=jax.jit(self.log_probs).lower(state["reference"], ids).compile(),
            train=jax.jit(self._train_fn, donate_argnums=(0,))
            .lower(state, ids, scored, spec((n,), jnp.float32), scored)
            .compile(),
        )

    # ------------------------------------------------------------------------------------------
    # The loop.
    # ------------------------------------------------------------------------------------------

    def train_step(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        """Runs one GRPO step on a prompt batch (updating the state); returns its metrics.

        Args:
            batch: From the prompt source: "prefix" int32 [B, P] and the reward's fields.

        Returns:
            The step's metrics (losses, rewards, phase seconds).

        Raises:
            RewardError: If the reward raises or returns a non-finite value for a sample.
        """
        cfg = self.config
        prefix = np.asarray(batch["prefix"], np.int32)
        if not self._compiled:
            self._compile(prefix)
        group = cfg.group_size
        timer = time.perf_counter
        with measurement.record_span(
            measurement.EventType.CUSTOM_BADPUT_EVENT, custom_badput_event_type=ROLLOUT_SPAN
        ):
            t0 = timer()
            ids_device = self._compiled["rollout"](
                self._state["model"], self._state["prng_key"], prefix
            )
            ids = np.asarray(jax.device_get(ids_device))
            t1 = timer()
            rewards = score_rollouts(
                self._reward,
                ids,
                batch,
                group_size=group,
                pad_id=self._pad_id,
                eos_id=self._eos_id,
                prefix_key="prefix",
                config_path=f"{self.path()}.reward",
            )
            t2 = timer()
        with measurement.record_span(
            measurement.EventType.CUSTOM_BADPUT_EVENT, custom_badput_event_type=REFERENCE_SPAN
        ):
            ref = jax.block_until_ready(
                self._compiled["reference"](self._state["reference"], ids_device)
            )
            t3 = timer()
        mask = self._compiled["mask"](prefix, ids_device)
        self._state, metrics = self._compiled["train"](
            self._state, ids_device, mask, jnp.asarray(rewards), ref
        )
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        t4 = timer()
        _, completions = split_completions(
            ids, prefix, group_size=group, pad_id=self._pad_id, eos_id=self._eos_id
        )
        lengths = np.asarray([len(c) for c in completions])
        metrics.update(
            reward_mean=float(rewards.mean()),
            reward_std=float(rewards.std()),
            completion_length=float(lengths.mean()),
            sampling_s=t1 - t0,
            reward_s=t2 - t1,
            rollout_s=t2 - t0,
            reference_s=t3 - t2,
            train_s=t4 - t3,
            rollout_tokens_per_s=ids.shape[0] * cfg.max_new_tokens / max(t1 - t0, 1e-9),
        )
        return metrics

    def run(self, prng_key: Optional[Tensor] = None) -> list[dict[str, Any]]:
        """Restores or initializes, then trains to `max_step`; returns the steps' records.

        Each record (also a line of <dir>/metrics.jsonl) holds the step, its metrics and
        step_s: the step's seconds from its start to the end of its checkpoint save;
        rollout_s + reference_s + train_s <= step_s (other_s is the rest).

        Args:
            prng_key: The initialization key (default: PRNGKey(0)).

        Returns:
            The records of the steps this call trained.
        """
        cfg = self.config
        key = jax.random.PRNGKey(0) if prng_key is None else prng_key
        records = []
        with self.checkpointer:
            with measurement.record_span(measurement.EventType.TRAINING_PREPARATION):
                restored = self.restore_or_init(key)
                if restored is None:
                    self.checkpointer.save(step=0, state=self._state)
                if self._step < cfg.max_step and not self._compiled:
                    self._compile(np.asarray(self._prompts.batch(self._step)["prefix"], np.int32))
            while self._step < cfg.max_step:
                t_input = time.perf_counter()
                batch = self._prompts.batch(self._step)
                start = time.perf_counter()
                self._step += 1
                measurement.record_event(
                    measurement.Event.START_STEP, self._step, input_s=round(start - t_input, 6)
                )
                metrics = self.train_step(batch)
                with measurement.record_span(
                    measurement.EventType.CUSTOM_BADPUT_EVENT, custom_badput_event_type="checkpoint"
                ):
                    t_save = time.perf_counter()
                    self.checkpointer.save(step=self._step, state=self._state)
                    checkpoint_s = time.perf_counter() - t_save
                step_s = time.perf_counter() - start
                phases = metrics["rollout_s"] + metrics["reference_s"] + metrics["train_s"]
                record = dict(
                    step=self._step,
                    **metrics,
                    checkpoint_s=checkpoint_s,
                    step_s=step_s,
                    other_s=max(0.0, step_s - phases),
                )
                self._metrics_writer(self._step, record)
                records.append(record)
                logging.info(
                    "%s step %d: loss %.4f reward %.3f (rollout %.3f s, reference %.3f s, "
                    "training %.3f s)",
                    self.path(),
                    self._step,
                    record["loss"],
                    record["reward_mean"],
                    record["rollout_s"],
                    record["reference_s"],
                    record["train_s"],
                )
        return records
