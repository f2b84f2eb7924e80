"""Exact resume through SpmdTrainer: a resumed run is the same run, bit for bit.

20 steps uninterrupted vs 10 steps, stop, restore (parameters, optimizer state, PRNG key and each
process's input iterator position from the checkpoint), 10 more steps: every loss and every leaf
of the final trainer state are bit-identical, on 1 device and on 8 devices. A control run that
resumes without the saved iterator position diverges, which shows the test sees the data order.
Also: the saved iterator position is the number of batches consumed, per process; and a
non-finite state is never checkpointed, even when the loss is still finite.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.checkpointer import read_index_file
from axlearn.common.config import config_class
from axlearn.common.trainer import NonFiniteStateError
from axlearn.common.utils import flatten_items
from tests.common import resume_test_utils as rtu
from tests.common import trainer_test_utils as tu


def _trainer(cfg, *, num_devices: Optional[int]):
    if num_devices is None:
        return cfg.instantiate(parent=None)
    devices = np.array(jax.devices()[:num_devices]).reshape(cfg.mesh_shape)
    return cfg.instantiate(parent=None, devices=devices)


def _run(cfg, *, num_devices: Optional[int] = None):
    trainer = _trainer(cfg, num_devices=num_devices)
    out = trainer.run(jax.random.PRNGKey(3))
    return trainer, out


def _host_leaves(state) -> dict[str, np.ndarray]:
    return {p: np.asarray(v) for p, v in flatten_items(jax.device_get(state))}


def _assert_states_bit_identical(actual, expected):
    actual_items = _host_leaves(actual)
    expected_items = _host_leaves(expected)
    assert actual_items.keys() == expected_items.keys()
    for path, value in expected_items.items():
        got = actual_items[path]
        assert got.dtype == value.dtype and got.shape == value.shape, path
        # Bitwise, not numerically: NaN payloads and signed zeros included.
        assert got.tobytes() == value.tobytes(), f"{path} differs"


@pytest.mark.parametrize(
    "mesh_shape,num_devices",
    [
        ((1, 1, 1, 1), 1),  # One device.
        ((2, 1, 4, 1), None),  # 8 devices: data=2, fsdp=4 (parameters sharded over fsdp).
    ],
    ids=["1_device", "8_devices"],
)
def test_resume_is_bit_identical(tmp_path, mesh_shape, num_devices):
    def config(name, max_step):
        return rtu.resume_trainer_config(
            str(tmp_path / name),
            max_step=max_step,
            checkpoint_every=5,
            keep_last_n=10,
            mesh_shape=mesh_shape,
        )

    full_trainer, full_out = _run(config("full", 20), num_devices=num_devices)
    assert full_out["step"] == 20 and full_trainer.restored_steps == [None]

    first, first_out = _run(config("resumed", 10), num_devices=num_devices)
    assert first_out["step"] == 10
    del first  # "Exit": nothing but the checkpoint directory carries over.
    resumed_trainer, resumed_out = _run(config("resumed", 20), num_devices=num_devices)
    assert resumed_trainer.restored_steps == [10]
    assert resumed_out["step"] == 20

    full_losses = rtu.losses_by_step(str(tmp_path / "full"))
    resumed_losses = rtu.losses_by_step(str(tmp_path / "resumed"))
    assert sorted(full_losses) == sorted(resumed_losses) == list(range(1, 21))
    # Bit-identical losses: exact float equality (metrics.jsonl keeps every float32 bit).
    assert [resumed_losses[s] for s in range(1, 21)] == [full_losses[s] for s in range(1, 21)]
    _assert_states_bit_identical(resumed_trainer.trainer_state, full_trainer.trainer_state)
    assert rtu.state_digest(resumed_trainer.trainer_state) == rtu.state_digest(
        full_trainer.trainer_state
    )
    # The checkpoints the two runs wrote at the same steps hold the same bytes.
    for step in (15, 20):
        ckpt = f"checkpoints/step_{step:08d}"
        full_index = read_index_file(str(tmp_path / "full" / ckpt))
        resumed_index = read_index_file(str(tmp_path / "resumed" / ckpt))
        assert full_index["leaves"] == resumed_index["leaves"]


def test_saved_iterator_position_and_control_without_it(tmp_path):
    cfg = rtu.resume_trainer_config(str(tmp_path / "a"), max_step=6, checkpoint_every=3)
    _run(cfg)
    # Each checkpoint holds this process's iterator position: the batches consumed so far.
    for step in (3, 6):
        step_dir = tmp_path / "a" / "checkpoints" / f"step_{step:08d}"
        index = read_index_file(str(step_dir))
        (leaf,) = [x for x in index["leaves"] if x["path"] == "input_iter"]
        assert leaf["kind"] == "bytes" and set(leaf["per_process"]) == {"0"}
        state = json.loads((step_dir / leaf["per_process"]["0"]["file"]).read_bytes())
        assert state["num_batches"] == step

    # Control: resuming the same checkpoint without the saved position restarts the data, so the
    # losses diverge; the bit-identity test above therefore depends on the restored position.
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    _run(rtu.resume_trainer_config(str(tmp_path / "a"), max_step=9, checkpoint_every=3))
    without = rtu.resume_trainer_config(str(tmp_path / "b"), max_step=9, checkpoint_every=3)
    without.save_input_iterator = False
    _run(without)
    a, b = rtu.losses_by_step(str(tmp_path / "a")), rtu.losses_by_step(str(tmp_path / "b"))
    assert [a[s] for s in range(1, 7)] == [b[s] for s in range(1, 7)]
    assert all(a[s] != b[s] for s in range(7, 10))


class NanGradientLm(tu.BigramLm):
    """BigramLm whose gradient (not loss) is NaN on batches whose first input id is `poison_id`.

    The loss gains `0 * sum(sqrt(|w - stop_gradient(w)| + c))` with c = 0 on a poisoned batch and
    1 otherwise: 0 in the forward pass; in the backward pass d sqrt(x)/dx at x = 0 is inf and
    inf * 0 = NaN, so the update makes the parameters NaN while the step's loss stays finite.
    """

    @config_class
    class Config(tu.BigramLm.Config):
        """Configures NanGradientLm."""

        # Batches whose [0, 0] input id equals this get a NaN gradient.
        poison_id: int = -1

    def forward(self, input_batch):
        loss, aux = super().forward(input_batch)
        w = self.parameters["proj"]["weight"]
        poison = input_batch["input_ids"][0, 0] == self.config.poison_id
        offset = jnp.where(poison, 0.0, 1.0)
        bad = jnp.sum(jnp.sqrt(jnp.abs(w - jax.lax.stop_gradient(w)) + offset))
        return loss + 0.0 * bad, aux


@pytest.mark.parametrize("max_step", [6, 3])
def test_nonfinite_state_with_finite_loss_is_never_saved(tmp_path, max_step):
    """On CPU the flag of step 3's save comes from step 4 (fused with it) or, when step 3 is the
    last step (max_step=3), is computed at the end of the run."""
    # Find the first input id of batch 2 (step 3's batch) to poison exactly that step.
    cfg = rtu.resume_trainer_config(
        str(tmp_path), max_step=max_step, checkpoint_every=1, keep_last_n=10
    )
    probe = iter(cfg.input.clone().set(name="probe").instantiate(parent=None))
    batches = [next(probe) for _ in range(3)]
    cfg.model = NanGradientLm.default_config().set(
        dtype=jnp.float32, poison_id=int(batches[2]["input_ids"][0, 0])
    )
    assert all(int(b["input_ids"][0, 0]) != cfg.model.poison_id for b in batches[:2])
    trainer = cfg.instantiate(parent=None)
    with pytest.raises(NonFiniteStateError, match=r"Step 3: .*NaN/inf"):
        trainer.run(jax.random.PRNGKey(0))
    # Step 3's loss was finite (computed before the bad update) ...
    losses = rtu.losses_by_step(str(tmp_path))
    assert all(np.isfinite(losses[s]) for s in losses)
    # ... but its state was not saved; the committed steps are the finite ones.
    committed, partial = rtu.committed_and_partial(os.path.join(str(tmp_path), "checkpoints"))
    assert committed == [1, 2] and partial == []
    # The newest committed state is finite and restores.
    again = rtu.resume_trainer_config(str(tmp_path), max_step=2, checkpoint_every=1)
    restored = again.instantiate(parent=None)
    assert restored.restore_checkpoint() == 2
    leaves = jax.tree.leaves(restored.trainer_state)
    assert all(
        bool(jnp.all(jnp.isfinite(x))) for x in leaves if jnp.issubdtype(x.dtype, jnp.inexact)
    )
