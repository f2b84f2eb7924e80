"""Shared fixtures of the pipeline tests (test_pipeline.py, test_pipeline_1f1b.py).

Small `Pipeline` subclasses, the plain-JAX reference of a pipelined tanh(Linear) stack, and the
trainer-run helpers.
"""

from __future__ import annotations

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from axlearn.common.module import functional
from axlearn.common.pipeline import Pipeline, rows_to_chunk_order
from axlearn.common.utils import Tensor


class LinearPipeline(Pipeline):
    """Chunks of `y = tanh(layer(x))`; each chunk also outputs `y_sum` = sum(y, -1) as a y."""

    def forward(self, x: Tensor) -> Pipeline.Output:
        def fn(carry, _):
            y = jnp.tanh(self.layer(carry))
            return y, dict(y_sum=jnp.sum(y, axis=-1))

        return self._run(fn, x)


class DropoutPipeline(Pipeline):
    """Chunks of `layer(x)` (a Dropout in the tests): per (chunk, microbatch) PRNG keys."""

    def forward(self, x: Tensor) -> Pipeline.Output:
        return self._run(lambda carry, _: (self.layer(carry), {}), x)


def assert_linear_pipeline_matches_plain_jax(
    layer: LinearPipeline,
    *,
    x: Tensor,
    weights: Tensor,
    mesh: Mesh,
    seed: int = 1,
):
    """Loss and gradients (parameters and input) of `layer` vs a plain JAX loop over the chunks.

    The loss is sum(carry**2) + sum(y_sum * weights) with `weights` [S * V, B] per chunk. The
    parameters are the initialization plus a cos ramp (so that biases are non-zero).

    Args:
        layer: A LinearPipeline of Linear chunks (instantiated).
        x: The input [B, dim].
        weights: Per-chunk weights of y_sum, [S * V, B].
        mesh: The mesh to run the pipelined loss under (jitted).
        seed: The parameter initialization seed.
    """
    s = layer.config.num_layers
    v = layer.schedule.num_virtual_stages
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(seed))
    params = jax.tree.map(lambda p: p + 0.1 * jnp.cos(jnp.arange(p.size).reshape(p.shape)), params)

    def pipelined_loss(params, x):
        out, _ = functional(layer, None, params, [x], is_training=True)
        return jnp.sum(out.carry**2) + jnp.sum(out.ys["y_sum"] * weights)

    def plain_loss(chunk_params, x):
        total = 0.0
        for c in range(s * v):
            x = jnp.tanh(x @ chunk_params["weight"][c] + chunk_params["bias"][c])
            total += jnp.sum(jnp.sum(x, -1) * weights[c])
        return jnp.sum(x**2) + total

    with jax.set_mesh(mesh):
        loss, grads = jax.jit(jax.value_and_grad(pipelined_loss, argnums=(0, 1)))(params, x)
    to_chunks = lambda t: jax.tree.map(  # noqa: E731
        lambda a: rows_to_chunk_order(np.asarray(a), num_stages=s, num_virtual_stages=v), t
    )
    ref_loss, ref_grads = jax.value_and_grad(plain_loss, argnums=(0, 1))(
        to_chunks(params["layer"]), x
    )
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    # Gradients within 1e-5 of each tensor's largest magnitude (float32 summation order).
    for actual, expected in (
        (to_chunks(grads[0]["layer"])["weight"], ref_grads[0]["weight"]),
        (to_chunks(grads[0]["layer"])["bias"], ref_grads[0]["bias"]),
        (grads[1], ref_grads[1]),
    ):
        expected = np.asarray(expected)
        assert np.abs(expected).max() > 0
        np.testing.assert_allclose(actual, expected, atol=1e-5 * np.abs(expected).max())


def run_trainer(cfg) -> tuple[object, list[dict]]:
    """Instantiates and runs a trainer config (PRNG key 0).

    Args:
        cfg: A SpmdTrainer config.

    Returns:
        (trainer, the metrics.jsonl records of its dir).
    """
    from tests.common.trainer_test_utils import read_metrics

    trainer = cfg.instantiate(parent=None)
    trainer.run(jax.random.PRNGKey(0))
    return trainer, read_metrics(cfg.dir)


def train_losses(cfg) -> dict[int, float]:
    """Runs a trainer config; {step: loss} of the steps it ran.

    Args:
        cfg: A SpmdTrainer config.

    Returns:
        The losses by step.
    """
    _, records = run_trainer(cfg)
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def resume_copy(src_dir: str, dst_dir: str, *, keep_step: int):
    """Makes a new trainer dir holding src_dir's checkpoints up to keep_step (no metrics, lock).

    Args:
        src_dir: The source trainer dir.
        dst_dir: The new trainer dir (must not exist).
        keep_step: Copy checkpoints of steps <= keep_step.
    """
    src_ckpt = os.path.join(src_dir, "checkpoints")
    os.makedirs(os.path.join(dst_dir, "checkpoints"))
    for name in os.listdir(src_ckpt):
        if not name.startswith("step_"):
            continue
        if int(name[5:13]) <= keep_step:
            shutil.copytree(
                os.path.join(src_ckpt, name), os.path.join(dst_dir, "checkpoints", name)
            )
