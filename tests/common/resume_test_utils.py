"""Shared pieces of the resume, crash-safety and preemption tests.

- `resume_trainer_config`: the tiny BigramLm trainer of trainer_test_utils on FakeLmInput with the
  input iterator saved in checkpoints, no evalers, no TensorBoard writer (no TensorFlow import),
  so a trainer process starts, compiles and trains in a few seconds.
- `RecordingTrainer`: an SpmdTrainer that remembers which step it restored.
- `state_digest`: a SHA-256 over every leaf's path, dtype, shape and bytes (bit-identity).
- `committed_and_partial`: the committed and uncommitted step directories of a checkpoint dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from typing import Any, Optional

import jax
import numpy as np

from axlearn.common.checkpointer import is_committed, step_dirs
from axlearn.common.config import config_class
from axlearn.common.input_fake import FakeLmInput
from axlearn.common.summary_writer import NoOpWriter
from axlearn.common.trainer import SpmdTrainer
from axlearn.common.utils import flatten_items
from tests.common import trainer_test_utils as tu


class RecordingTrainer(SpmdTrainer):
    """An SpmdTrainer that records the step each `restore_checkpoint` call returned."""

    def restore_checkpoint(self, restore_step: Optional[int] = None) -> Optional[int]:
        step = super().restore_checkpoint(restore_step)
        if not hasattr(self, "restored_steps"):
            self.restored_steps = []
        self.restored_steps.append(step)
        return step


class SigtermFakeLmInput(FakeLmInput):
    """FakeLmInput that sends SIGTERM to its own process when fetching batch `sigterm_at_batch`.

    Batch k (0-based) is step k+1's batch, so the preemption notice arrives while step k+1 is
    being prepared, deterministically: the trainer then finishes step k+1 and saves it.
    """

    @config_class
    class Config(FakeLmInput.Config):
        """Configures SigtermFakeLmInput."""

        # The 0-based batch index at which to send SIGTERM; None: never.
        sigterm_at_batch: Optional[int] = None
        # Seconds to sleep before each batch (to keep a run going long enough to signal it).
        seconds_per_batch: float = 0.0

    def __iter__(self):
        cfg = self.config
        return _SigtermIterator(super().__iter__(), cfg.sigterm_at_batch, cfg.seconds_per_batch)


class _SigtermIterator:
    def __init__(self, it, sigterm_at_batch: Optional[int], seconds_per_batch: float):
        self._it = it
        self._sigterm_at_batch = sigterm_at_batch
        self._seconds_per_batch = seconds_per_batch

    def __iter__(self):
        return self

    def __next__(self):
        if self._seconds_per_batch:
            time.sleep(self._seconds_per_batch)
        if self._it.num_batches == self._sigterm_at_batch:
            os.kill(os.getpid(), signal.SIGTERM)
        return next(self._it)

    def get_state(self) -> bytes:
        return self._it.get_state()

    def set_state(self, *args, **kwargs):
        return self._it.set_state(*args, **kwargs)


def resume_trainer_config(
    trainer_dir: str,
    *,
    max_step: int,
    checkpoint_every: int = 2,
    keep_last_n: int = 2,
    mesh_shape: tuple = (1, 1, -1, 1),
    global_batch_size: int = 8,
    sigterm_at_batch: Optional[int] = None,
    seconds_per_batch: float = 0.0,
) -> SpmdTrainer.Config:
    """The tiny trainer of the resume tests (see the module docstring).

    Args:
        trainer_dir: The trainer directory (checkpoints under `checkpoints/`).
        max_step: The step at which training stops.
        checkpoint_every: Save every this many steps.
        keep_last_n: GC keeps this many newest committed checkpoints.
        mesh_shape: Over the axes (data, expert, fsdp, model).
        global_batch_size: Examples per step.
        sigterm_at_batch: If set, the input sends SIGTERM to the process when fetching this
            0-based batch (see SigtermFakeLmInput).
        seconds_per_batch: If set, the input sleeps this long before each batch.

    Returns:
        The trainer config (a RecordingTrainer).
    """
    cfg = tu.bigram_trainer_config(
        trainer_dir,
        max_step=max_step,
        global_batch_size=global_batch_size,
        mesh_shape=mesh_shape,
        checkpoint_every=checkpoint_every,
    )
    cfg.klass = RecordingTrainer
    if sigterm_at_batch is not None or seconds_per_batch:
        fields = {k: v for k, v in cfg.input.items() if k != "klass"}
        cfg.input = SigtermFakeLmInput.default_config().set(
            **fields, sigterm_at_batch=sigterm_at_batch, seconds_per_batch=seconds_per_batch
        )
    cfg.evalers = {}
    cfg.summary_writer = NoOpWriter.default_config()
    cfg.checkpointer.keep_last_n = keep_last_n
    # GC runs after each commit; no periodic GC thread activity during the short runs.
    cfg.checkpointer.gc_loop_interval_seconds = 3600
    return cfg


def state_digest(tree: Any) -> str:
    """SHA-256 of every leaf's path, dtype, shape and bytes, in tree order."""
    digest = hashlib.sha256()
    for path, leaf in flatten_items(jax.device_get(tree)):
        value = np.asarray(leaf)
        digest.update(f"{path}:{value.dtype}:{value.shape}:".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def losses_by_step(trainer_dir: str) -> dict[int, float]:
    """{step: loss} from metrics.jsonl; a step written twice (resumed run) keeps its last loss."""
    path = os.path.join(trainer_dir, "metrics.jsonl")
    result: dict[int, float] = {}
    if not os.path.exists(path):
        return result
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                result[int(record["step"])] = float(record["loss"])
    return result


def committed_and_partial(ckpt_dir: str) -> tuple[list[int], list[int]]:
    """(committed steps, uncommitted steps) under a checkpoint directory."""
    committed, partial = [], []
    for step, path in step_dirs(ckpt_dir) if os.path.isdir(ckpt_dir) else []:
        (committed if is_committed(path) else partial).append(step)
    return committed, partial
