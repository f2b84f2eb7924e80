"""The tiny GPT config (axlearn/experiments/text/gpt/tiny.py) on 8 CPU devices equals 1 device.

For each mesh selected by the config's mesh rules, (fsdp=8), (data=2, fsdp=4) and
(data=2, model=4): the step-0 loss and gradients equal the 1-device ones (1e-5), and the losses of
5 training steps agree within rtol 1e-4. Inputs are FakeLmInput (`--data_dir=FAKE`); the model is
the tiny config with 1 layer (dim 128: 4 query heads, so model=4 splits heads) to keep
compile times down.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from axlearn.common.input_fake import replace_inputs_with_fake
from axlearn.common.module import functional as F
from axlearn.common.trainer import select_mesh_config
from axlearn.common.utils_spmd import batch_partition_spec, host_to_global_array
from axlearn.experiments.text.gpt.tiny import tiny_trainer_config
from tests.common import trainer_test_utils as tu

pytestmark = pytest.mark.slow

STEPS = 5


def _config(trainer_dir: str, mesh_selector=None):
    cfg = tiny_trainer_config(
        max_step=STEPS,
        global_batch_size=8,
        seq_len=32,
        num_layers=1,
        model_dim=128,
        checkpoint_every_n_steps=10**6,
    )
    cfg = replace_inputs_with_fake(cfg)
    cfg.evalers = {}
    cfg.checkpointer.save_policy.max_step = 10**6
    cfg.set(dir=trainer_dir, peak_flops_per_device=1e11)
    if mesh_selector:
        cfg = select_mesh_config(cfg, mesh_selector=mesh_selector)
    return cfg


def _step0_loss_and_grads(trainer):
    """Loss and gradients of the first batch at the initial parameters, on the trainer's mesh."""
    trainer.init(jax.random.PRNGKey(3))
    host_batch = next(iter(trainer.input))
    mesh = trainer.mesh()
    spec = batch_partition_spec(
        host_batch["input_ids"].shape[0],
        mesh=mesh,
        batch_axis_names=trainer.config.batch_axis_names,
    )
    batch = host_to_global_array(host_batch, mesh=mesh, partition=spec)

    def loss_fn(params):
        (loss, _), _ = F(
            trainer.model,
            prng_key=jax.random.PRNGKey(0),
            state=params,
            inputs=dict(input_batch=batch),
            is_training=True,
        )
        return loss

    with jax.set_mesh(mesh):
        loss, grads = jax.jit(jax.value_and_grad(loss_fn))(trainer.trainer_state.model)
    return float(loss), jax.tree.map(np.asarray, jax.device_get(grads))


def _run_losses(trainer):
    """Trains from the initial state (the same key as `_step0_loss_and_grads`); the losses."""
    trainer.run(jax.random.PRNGKey(3))
    return [r["loss"] for r in tu.read_metrics(trainer.config.dir)]


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_device")
    devices = np.array(jax.devices()[:1]).reshape((1,) * 6)
    trainer = _config(str(root)).instantiate(parent=None, devices=devices)
    loss, grads = _step0_loss_and_grads(trainer)
    return loss, grads, _run_losses(trainer)


@pytest.mark.parametrize(
    "selector,expected_mesh",
    [
        ("cpu-fsdp", dict(fsdp=8)),
        ("cpu-data2-fsdp", dict(data=2, fsdp=4)),
        ("cpu-data2-model", dict(data=2, model=4)),
    ],
)
def test_sharded_equals_one_device(tmp_path, one_device, selector, expected_mesh):
    loss1, grads1, losses1 = one_device
    trainer = _config(str(tmp_path), selector).instantiate(parent=None)
    mesh = {k: v for k, v in trainer.mesh().shape.items() if v > 1}
    assert mesh == expected_mesh
    loss, grads = _step0_loss_and_grads(trainer)
    np.testing.assert_allclose(loss, loss1, rtol=1e-5)
    flat1 = dict(jax.tree_util.tree_flatten_with_path(grads1)[0])
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        np.testing.assert_allclose(
            g, flat1[path], rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path)
        )
    losses = _run_losses(trainer)
    assert len(losses) == STEPS
    np.testing.assert_allclose(losses, losses1, rtol=1e-4)
