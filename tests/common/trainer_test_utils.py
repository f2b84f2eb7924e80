"""Small models, inputs and trainer configs for the trainer tests (fast to compile on CPU)."""

from __future__ import annotations

import json
import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common import evaler, layers, learner, optimizers
from axlearn.common.base_layer import BaseLayer
from axlearn.common.checkpointer import Checkpointer, every_n_steps_policy
from axlearn.common.config import config_class, config_for_function
from axlearn.common.input_fake import FakeLmInput
from axlearn.common.module import Module, child_context, nowrap
from axlearn.common.trainer import SpmdTrainer

VOCAB = 64
SEQ = 16


class BigramLm(BaseLayer):
    """A tiny LM: embedding -> tanh(linear) -> tied logits; cross-entropy over live targets.

    If every input id of the batch is 0 (a "poison" batch), the loss and gradients are NaN.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures BigramLm."""

        # Vocabulary size.
        vocab_size: int = VOCAB
        # Hidden dim.
        dim: int = 32

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "emb", layers.Embedding.default_config().set(num_embeddings=cfg.vocab_size, dim=cfg.dim)
        )
        self._add_child(
            "proj",
            layers.Linear.default_config().set(
                input_dim=cfg.dim, output_dim=cfg.dim, param_partition_spec=("fsdp", "model")
            ),
        )

    def forward(self, input_batch):
        ids = input_batch["input_ids"]
        x = jnp.tanh(self.proj(self.emb(ids)))
        with child_context("emb_attend", module=self.emb):
            logits = self.emb.attend(x)
        labels = input_batch["target_labels"]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        nll = -jnp.take_along_axis(logp, jnp.maximum(labels, 0)[..., None], -1)[..., 0]
        live = (labels > 0).astype(jnp.float32)
        loss = jnp.sum(nll * live) / jnp.maximum(jnp.sum(live), 1.0)
        # Multiplying (not selecting) makes the gradients NaN too, like a real bad step.
        loss = loss * jnp.where(jnp.all(ids == 0), jnp.nan, 1.0)
        self.add_summary("loss", loss)
        return loss, dict(num_targets=jnp.sum(live))


class PoisonedFakeLmInput(FakeLmInput):
    """FakeLmInput whose batches at `poison_batches` (0-based) have all input ids 0."""

    @config_class
    class Config(FakeLmInput.Config):
        """Configures PoisonedFakeLmInput."""

        # 0-based indices of batches to poison.
        poison_batches: list = []

    def __iter__(self):
        it = super().__iter__()
        poison = set(self.config.poison_batches)

        class _It:
            def __iter__(self):
                return self

            def __next__(self):
                index = it.num_batches
                batch = next(it)
                if index in poison:
                    batch = dict(batch, input_ids=np.zeros_like(batch["input_ids"]))
                return batch

            def get_state(self):
                return it.get_state()

            def set_state(self, *args, **kwargs):
                return it.set_state(*args, **kwargs)

        return _It()


class SleepyEvaler(evaler.SpmdEvaler):
    """An evaler that, when its policy fires, only sleeps `sleep_seconds` (a known cost)."""

    @config_class
    class Config(evaler.SpmdEvaler.Config):
        """Configures SleepyEvaler."""

        # Seconds to sleep per eval.
        sleep_seconds: float = 0.0

    @nowrap
    def eval_step(self, step, *, prng_key, model_params, train_summaries=None, force_run=False):
        del model_params
        if not force_run and not self.eval_policy(step=step, train_summaries=train_summaries):
            return prng_key, None, None
        time.sleep(self.config.sleep_seconds)
        return prng_key, {"slept": self.config.sleep_seconds}, None


class SleepyCheckpointer(Checkpointer):
    """A checkpointer that, when its policy fires, only sleeps `sleep_seconds` (a known cost)."""

    @config_class
    class Config(Checkpointer.Config):
        """Configures SleepyCheckpointer."""

        # Seconds to sleep per save.
        sleep_seconds: float = 0.0

    @nowrap
    def save(
        self,
        *,
        step,
        state,
        evaler_summaries=None,
        force=False,
        precondition=None,
        alias_arrays=False,
    ):
        del state, precondition, alias_arrays
        if not force and not self._save_policy(step=step, evaler_summaries=evaler_summaries or {}):
            return None
        time.sleep(self.config.sleep_seconds)
        return None


def bigram_trainer_config(
    trainer_dir: str,
    *,
    max_step: int = 10,
    global_batch_size: int = 8,
    mesh_shape=(1, 1, -1, 1),
    skip_nonfinite: bool = False,
    checkpoint_every: int = 1000,
    eval_every: int = 1000,
) -> SpmdTrainer.Config:
    """A trainer config of BigramLm on FakeLmInput (mesh axes data, expert, fsdp, model)."""
    adam = config_for_function(optimizers.adamw_optimizer).set(
        learning_rate=0.01, b1=0.9, b2=0.99, eps=1e-8
    )
    optimizer = adam
    if skip_nonfinite:
        optimizer = config_for_function(optimizers.skip_and_clip_by_global_norm).set(
            inner=adam, max_norm=10.0
        )
    cfg = SpmdTrainer.default_config().set(
        name="trainer",
        dir=trainer_dir,
        max_step=max_step,
        mesh_axis_names=("data", "expert", "fsdp", "model"),
        mesh_shape=mesh_shape,
        batch_axis_names=("data", "expert", "fsdp"),
        input=FakeLmInput.default_config().set(
            is_training=True,
            global_batch_size=global_batch_size,
            source_length=SEQ,
            max_token_id=VOCAB,
        ),
        model=BigramLm.default_config().set(dtype=jnp.float32),
        learner=learner.Learner.default_config().set(optimizer=optimizer),
        save_input_iterator=True,
        peak_flops_per_device=1e11,
    )
    cfg.checkpointer.save_policy = config_for_function(every_n_steps_policy).set(n=checkpoint_every)
    cfg.checkpointer.keep_last_n = 100
    eval_cfg = evaler.SpmdEvaler.default_config().set(
        input=FakeLmInput.default_config().set(
            is_training=False,
            global_batch_size=global_batch_size,
            source_length=SEQ,
            max_token_id=VOCAB,
            total_num_batches=2,
        )
    )
    eval_cfg.eval_policy.n = eval_every
    cfg.evalers["val"] = eval_cfg
    return cfg


def read_metrics(trainer_dir: str) -> list[dict]:
    """The records of <trainer_dir>/metrics.jsonl."""
    with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
