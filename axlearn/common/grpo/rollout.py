"""GRPO inside `SpmdTrainer`: the prompt input and the rollout batch processor.

A GRPO run is an `SpmdTrainer` config with

- `input=PromptInput` (a prompt source such as `copy_task.CopyDigitsPrompts`, indexed by batch;
  its iterator position is saved with `save_input_iterator=True`);
- `model=model.GrpoModel` (the policy and its frozen reference; the learner's update_rules hold
  `model.FROZEN_REFERENCE_RULES`);
- `batch_processor=GrpoRollout` (the reward as a config).

Each step the trainer hands the prompt batch and its current state to `GrpoRollout.process`,
which, on this host:

    rollout: `group_size` samples per prompt with the policy's KV-cache decoding (temperature,
        top-k, top-p; the key is `fold_in(state.prng_key, ROLLOUT_KEY_SALT)`, so a fixed trainer
        key gives bit-identical rollouts and a resumed run repeats them), then the reward of each
        sample (checked finite: a failure is one line naming `<path>.reward`) and the
        group-relative advantages;
    reference: the frozen reference's log-probs of the samples;

and returns the rollout batch (`model.ROLLOUT_KEYS`) that the train step's `GrpoModel.forward`
trains on. The trainer then waits for the step (the rollout of the next step needs its
parameters) and adds the split of the step's time to its summaries: `grpo/rollout_seconds`
(`grpo/sampling_seconds` + `grpo/reward_seconds`), `grpo/reference_seconds`,
`grpo/training_seconds`, with `grpo/rollout_tokens_per_s`. The rollout and reference phases are
also recorded as `rollout` and `reference` spans, which `axlearn goodput` reports as parts of
the productive time (the rest is training).

One process: the rollout runs on this process's prompts with the state's arrays.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common import measurement
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.grpo.loss import group_advantages
from axlearn.common.grpo.model import completion_mask, split_completions
from axlearn.common.grpo.rewards import score_samples
from axlearn.common.inference import logits_modifier
from axlearn.common.module import Module, nowrap
from axlearn.common.module import functional as F
from axlearn.common.utils import Tensor

# The goodput span types of the phases (`axlearn.common.goodput.PRODUCTIVE_PHASES`).
ROLLOUT_SPAN, REFERENCE_SPAN = "rollout", "reference"
# Folded into the trainer state's key for the rollout key (the train step splits the key
# itself, so the rollout stream is separate from the step's dropout/learner keys).
ROLLOUT_KEY_SALT = 0x6772706F
# The summary prefix of the step's time split.
SUMMARY_PREFIX = "grpo/"


def score_rollouts(
    reward: Any,
    ids: np.ndarray,
    batch: dict[str, np.ndarray],
    *,
    group_size: int,
    pad_id: int,
    eos_id: int,
    prefix_key: str,
    config_path: str,
) -> np.ndarray:
    """The reward of each rollout row (host).

    Args:
        reward: `reward(prompt=, completion=, example=) -> float`.
        ids: Int [B * G, L] rollout rows (prompt-major).
        batch: The prompt batch: `prefix_key` [B, P] and the fields the reward reads (row i's
            example holds prompt i // G's values).
        group_size: G.
        pad_id: The padding id.
        eos_id: The stop token (a completion is cut before it).
        prefix_key: The key of the prompts.
        config_path: The reward's config path, for errors.

    Returns:
        Float32 [B * G].

    Raises:
        RewardError: If the reward raises or returns a non-finite value (one line naming
            `config_path`).
    """
    prefix = np.asarray(batch[prefix_key])
    prompts, completions = split_completions(
        ids, prefix, group_size=group_size, pad_id=pad_id, eos_id=eos_id
    )
    examples = [
        {k: np.asarray(v[row // group_size]) for k, v in batch.items() if k != prefix_key}
        for row in range(ids.shape[0])
    ]
    return score_samples(
        reward,
        prompts=prompts,
        completions=completions,
        examples=examples,
        config_path=config_path,
    )


class PromptIterator:
    """Iterates a prompt source's batches; `get_state`/`set_state` save the batch index."""

    def __init__(self, source: Any, *, index: int = 0, total: Optional[int] = None):
        self._source = source
        self._index = index
        self._total = total

    def __iter__(self) -> PromptIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._total is not None and self._index >= self._total:
            raise StopIteration
        batch = self._source.batch(self._index)
        self._index += 1
        return {k: np.asarray(v) for k, v in batch.items()}

    def get_state(self) -> bytes:
        """The position: the index of the next batch, as JSON bytes."""
        return json.dumps(dict(index=self._index)).encode()

    def set_state(self, states: Union[bytes, list]) -> None:
        """Restores a position from `get_state()` (or a list of processes' states)."""
        if isinstance(states, (list, tuple)):
            states = states[0]
        self._index = int(json.loads(bytes(states).decode())["index"])


class PromptInput(Module):
    """The trainer input of a GRPO run: batch `i` is `source.batch(i)` (a pure function of i).

    Keys: the source's, e.g. "prefix" int32 [B, P] (each prompt starts with a prompt token and is
    right-padded) and the fields its reward reads (e.g. "target").
    """

    @config_class
    class Config(Module.Config):
        """Configures PromptInput."""

        # The prompt source: instantiates to an object with `batch(index) -> dict of arrays`.
        source: Required[InstantiableConfig] = REQUIRED
        # Set by the trainer (batches do not depend on it).
        is_training: bool = True
        # The number of batches; None: unlimited.
        total_num_batches: Optional[int] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._source = self.config.source.instantiate()
        if not callable(getattr(self._source, "batch", None)):
            raise ValueError(
                f"{self.path()}.source: {type(self._source).__name__} has no batch(index) method."
            )

    @property
    def source(self) -> Any:
        """The prompt source."""
        return self._source

    def __iter__(self) -> PromptIterator:
        return PromptIterator(self._source, total=self.config.total_num_batches)

    @nowrap
    def dataset(self) -> PromptIterator:
        """Returns a new iterator from the start."""
        return iter(self)

    @nowrap
    def batches(self, it: PromptIterator) -> Iterator[dict[str, np.ndarray]]:
        """Yields the batches of `it`."""
        yield from it

    @nowrap
    def element_spec(self) -> dict[str, Any]:
        """The batch shapes (`jax.ShapeDtypeStruct`s), from batch 0."""
        return {
            k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype)
            for k, v in self._source.batch(0).items()
        }

    @nowrap
    def iterator_state(self, it: PromptIterator) -> bytes:
        """Returns the position of `it` as bytes."""
        return it.get_state()

    @nowrap
    def restore_iterator(self, states: Union[bytes, list], **kwargs) -> PromptIterator:
        """Returns a new iterator positioned where the saved one was."""
        del kwargs
        it = iter(self)
        it.set_state(states)
        return it


class GrpoRollout(Module):
    """SpmdTrainer's batch processor of a GRPO run: prompts -> a rollout batch; see above."""

    @config_class
    class Config(Module.Config):
        """Configures GrpoRollout."""

        # The reward: instantiates to `reward(prompt=, completion=, example=) -> float`
        # (grpo.rewards.RewardFunction by import path, or a checker such as CopyDigitsReward).
        reward: Required[InstantiableConfig] = REQUIRED
        # Samples per prompt (G >= 2): advantages are relative to the prompt's group.
        group_size: int = 8
        # Tokens sampled per completion (T >= 1); a completion also stops at EOS.
        max_new_tokens: int = 8
        # If set, sample among the top_k most likely tokens only.
        top_k: Optional[int] = None
        # If set, sample from the nucleus of probability top_p only.
        top_p: Optional[float] = None
        # Added to each group's reward standard deviation in the advantages (> 0).
        advantage_eps: float = 1e-4
        # The key in the prompt batch of the prompts (int32 [B, P]).
        prefix_key: str = "prefix"

    def __init__(self, cfg: Config, *, parent: Optional[Module], model: Module):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        for name, ok, what in (
            ("group_size", isinstance(cfg.group_size, int) and cfg.group_size >= 2,
             "an integer >= 2 (advantages compare samples of a prompt)"),
            ("max_new_tokens", isinstance(cfg.max_new_tokens, int) and cfg.max_new_tokens >= 1,
             "an integer >= 1"),
            ("advantage_eps", cfg.advantage_eps > 0, "> 0 (e.g. 1e-4)"),
        ):  # fmt: skip
            if not ok:
                raise ValueError(f"{self.path()}.{name}={getattr(cfg, name)!r}: must be {what}.")
        if jax.process_count() > 1:
            raise ValueError(
                f"{self.path()}: GrpoRollout runs on one process ({jax.process_count()} "
                "processes here); run GRPO on a single host."
            )
        for name in ("sample_rollouts", "reference_log_probs", "pad_id", "eos_id"):
            if not hasattr(model, name):
                raise ValueError(
                    f"{self.path()}: the trainer's model {type(model).__name__} has no {name}; "
                    "GrpoRollout needs a grpo.model.GrpoModel."
                )
        self._model = model
        try:
            self._reward = cfg.reward.instantiate()
        except ValueError as e:
            raise ValueError(f"{self.path()}.reward: {e}") from None
        self._modifier = logits_modifier(
            temperature=model.config.temperature, top_k=cfg.top_k, top_p=cfg.top_p
        )
        self._jit: dict[str, Any] = {}
        self._last: dict[str, float] = {}

    @property
    def reward(self) -> Any:
        """The instantiated reward."""
        return self._reward

    # The device computations (pure functions of parameters and arrays; jitted once).

    def rollout_key(self, prng_key: Tensor) -> Tensor:
        """The rollout key of a step: fold_in(trainer state key, ROLLOUT_KEY_SALT)."""
        return jax.random.fold_in(prng_key, ROLLOUT_KEY_SALT)

    def sample(self, model_params: Any, prng_key: Tensor, prefix: Tensor) -> Tensor:
        """The rollout rows of a prompt batch (`GrpoModel.sample_rollouts`).

        Args:
            model_params: The model's parameters ({"policy", "reference"}).
            prng_key: The trainer state's key (the rollout key is derived from it).
            prefix: Int32 [B, P] prompts.

        Returns:
            Int32 [B * G, P + max_new_tokens].
        """
        cfg = self.config
        ids, _ = F(
            self._model,
            prng_key=self.rollout_key(prng_key),
            state=model_params,
            inputs=dict(
                prefix=prefix,
                group_size=cfg.group_size,
                max_new_tokens=cfg.max_new_tokens,
                modifier=self._modifier,
            ),
            is_training=False,
            method="sample_rollouts",
        )
        return ids

    def reference(self, model_params: Any, prefix: Tensor, ids: Tensor) -> dict[str, Tensor]:
        """The reference's log-probs and the completion mask of rollout rows.

        Args:
            model_params: The model's parameters.
            prefix: Int32 [B, P] prompts.
            ids: Int32 [B * G, L] rollout rows.

        Returns:
            {"reference_log_probs", "completion_mask"}: float32 [B * G, L - 1].
        """
        batch = dict(input_ids=ids[:, :-1], target_labels=ids[:, 1:])
        ref, _ = F(
            self._model,
            prng_key=None,
            state=model_params,
            inputs=dict(input_batch=batch),
            is_training=False,
            method="reference_log_probs",
        )
        mask = completion_mask(
            prefix, ids, group_size=self.config.group_size, pad_id=self._model.pad_id
        )
        return dict(reference_log_probs=ref, completion_mask=mask)

    # The host side.

    def score(self, ids: np.ndarray, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The reward of each rollout row (host; `score_rollouts` with this config).

        Args:
            ids: Int [B * G, L] rollout rows.
            batch: The prompt batch (the prompts and the reward's fields).

        Returns:
            Float32 [B * G].
        """
        cfg = self.config
        return score_rollouts(
            self._reward,
            ids,
            batch,
            group_size=cfg.group_size,
            pad_id=self._model.pad_id,
            eos_id=self._model.eos_id,
            prefix_key=cfg.prefix_key,
            config_path=f"{self.path()}.reward",
        )

    def _compiled(self, name: str, fn: Any, *args) -> Any:
        if name not in self._jit:
            with measurement.record_span(
                measurement.EventType.CUSTOM_BADPUT_EVENT, custom_badput_event_type="compile"
            ):
                self._jit[name] = jax.jit(fn).lower(*args).compile()
        return self._jit[name]

    def process(self, batch: dict[str, np.ndarray], *, trainer_state: Any) -> dict[str, np.ndarray]:
        """Turns a prompt batch into a rollout batch with the current policy; see above.

        Args:
            batch: The prompt batch (host arrays): `prefix_key` int32 [B, P] and the reward's
                fields.
            trainer_state: The trainer state (`prng_key`, `model`).

        Returns:
            The rollout batch (`model.ROLLOUT_KEYS`, host arrays).

        Raises:
            ValueError: If the batch has no `prefix_key`.
            RewardError: See `score`.
        """
        cfg = self.config
        if cfg.prefix_key not in batch:
            raise ValueError(
                f"{self.path()}.prefix_key={cfg.prefix_key!r}: the input batch has no such key; "
                f"it has {sorted(batch)}."
            )
        prefix = np.asarray(batch[cfg.prefix_key], np.int32)
        params, key = trainer_state.model, trainer_state.prng_key
        jax.block_until_ready(params)  # The previous step's update (its time is training).
        sample = self._compiled("sample", self.sample, params, key, prefix)
        timer = time.perf_counter
        with measurement.record_span(
            measurement.EventType.CUSTOM_BADPUT_EVENT, custom_badput_event_type=ROLLOUT_SPAN
        ):
            t0 = timer()
            ids_device = sample(params, key, prefix)
            ids = np.asarray(jax.device_get(ids_device))
            t1 = timer()
            rewards = self.score(ids, batch)
            advantages = np.asarray(
                group_advantages(
                    jnp.asarray(rewards), group_size=cfg.group_size, eps=cfg.advantage_eps
                )
            )
            t2 = timer()
        reference = self._compiled("reference", self.reference, params, prefix, ids_device)
        with measurement.record_span(
            measurement.EventType.CUSTOM_BADPUT_EVENT, custom_badput_event_type=REFERENCE_SPAN
        ):
            t3 = timer()
            ref = jax.device_get(reference(params, prefix, ids_device))
            t4 = timer()
        self._last = dict(
            sampling_seconds=t1 - t0,
            reward_seconds=t2 - t1,
            rollout_seconds=t2 - t0,
            reference_seconds=t4 - t3,
            rollout_tokens_per_s=ids.shape[0] * cfg.max_new_tokens / max(t1 - t0, 1e-9),
        )
        return dict(
            input_ids=ids[:, :-1],
            target_labels=ids[:, 1:],
            completion_mask=np.asarray(ref["completion_mask"]),
            reference_log_probs=np.asarray(ref["reference_log_probs"]),
            advantages=advantages.astype(np.float32),
            rewards=rewards.astype(np.float32),
        )

    def step_summaries(self, *, training_seconds: float) -> dict[str, float]:
        """The time split of the step just processed, as summaries (`grpo/...`).

        Args:
            training_seconds: The train step's seconds (dispatch to its loss being ready).

        Returns:
            {"grpo/rollout_seconds", "grpo/sampling_seconds", "grpo/reward_seconds",
            "grpo/reference_seconds", "grpo/training_seconds", "grpo/rollout_tokens_per_s"}.
        """
        out = dict(self._last, training_seconds=training_seconds)
        return {SUMMARY_PREFIX + k: float(v) for k, v in out.items()}
