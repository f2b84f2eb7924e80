"""FP8 training end to end: a tiny Fuji LM trained 50 steps with `FP8ConfigModifier` (fp8
emulated on CPU) against the same model in bf16, and a checkpoint round trip of the fp8 state."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common import learner as learner_lib
from axlearn.common.checkpointer import Checkpointer, every_n_steps_policy
from axlearn.common.config import config_for_function
from axlearn.common.module import functional as F
from axlearn.common.optimizer_base import OptParam
from axlearn.common.quantized_dot_general.layers import get_all_fp8_param_names
from axlearn.common.trainer import SpmdTrainer
from axlearn.common.trainer_config_modifier import FP8ConfigModifier
from axlearn.common.update_transformation import OverrideInplaceUpdateTransformation
from axlearn.common.utils import cast_floats, flatten_items
from axlearn.experiments.text.gpt import fuji
from axlearn.experiments.text.gpt.common import adamw_decoupled_learner_config
from axlearn.experiments.text.gpt.fuji_tiny import tiny_model_kwargs

BATCH, SEQ = 8, 32
HISTORY = 16


def _trainer_cfg(fp8: bool) -> SpmdTrainer.Config:
    cfg = SpmdTrainer.default_config().set(name="trainer")
    cfg.model = fuji.model_config(**tiny_model_kwargs()).set(name="model")
    cfg.learner = adamw_decoupled_learner_config(
        max_step=50, peak_lr=1e-2, weight_decay=0.01, lr_warmup_steps=5
    ).set(name="learner")
    if fp8:
        cfg = (
            FP8ConfigModifier.default_config()
            .set(fp8_amax_history_length=HISTORY)
            .instantiate()(cfg)
        )
    return cfg


def _batches(vocab: int, steps: int):
    """Walks of a fixed successor map on 64 of the ids, with 5% noise (a bigram to learn)."""
    rng = np.random.RandomState(0)
    successor = rng.permutation(64)
    for _ in range(steps):
        ids = np.zeros((BATCH, SEQ + 1), np.int32)
        ids[:, 0] = rng.randint(0, 64, size=BATCH)
        for t in range(SEQ):
            ids[:, t + 1] = successor[ids[:, t]]
        noise = rng.rand(BATCH, SEQ + 1) < 0.05
        ids = np.where(noise, rng.randint(0, 64, size=ids.shape), ids).astype(np.int32)
        assert ids.max() < vocab
        yield dict(input_ids=ids[:, :-1], target_labels=ids[:, 1:])


def _setup(fp8: bool):
    cfg = _trainer_cfg(fp8)
    model = cfg.model.instantiate(parent=None)
    learner = cfg.learner.instantiate(parent=None)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(1))
    state = learner.init(jax.tree.map(lambda v: OptParam(v, None, 1.0), params))

    def loss_fn(*, model_params, inputs):
        # bf16 compute (as the trainer's train_dtype=bfloat16), float32 parameters.
        (loss, _), coll = F(
            model,
            is_training=True,
            prng_key=jax.random.PRNGKey(2),
            state=cast_floats(model_params, jnp.bfloat16),
            inputs=dict(input_batch=inputs),
        )
        return learner_lib.ForwardOutputs(loss=loss, aux={}, output_collection=coll)

    @jax.jit
    def step(params, state, batch):
        out, coll = F(
            learner,
            method="forward_and_backward",
            is_training=True,
            prng_key=jax.random.PRNGKey(3),
            state=state,
            inputs=dict(
                fn=loss_fn,
                opt_params=jax.tree.map(lambda v: OptParam(v, None, 1.0), params),
                inputs=batch,
            ),
        )
        return out.backward_outputs.updated_params, coll.state_updates, out.forward_outputs.loss

    return cfg, params, state, step


def _train(fp8: bool, steps: int):
    cfg, params, state, step = _setup(fp8)
    losses = []
    for batch in _batches(cfg.model.decoder.vocab_size, steps):
        params, state, loss = step(params, state, batch)
        losses.append(float(loss))
    return params, state, losses


@functools.cache
def _runs():
    return _train(False, 50), _train(True, 50)


def test_fp8_modifier_wraps_the_learner():
    cfg = _trainer_cfg(fp8=True)
    assert isinstance(cfg.learner.optimizer, OverrideInplaceUpdateTransformation.Config)
    ffn = cfg.model.decoder.transformer.layer.feed_forward
    assert ffn.linear1.quantized_dot_general.fp8_amax_history_length == HISTORY
    # The attention projections too (q/k/v and output).
    attn = cfg.model.decoder.transformer.layer.self_attention.attention
    assert attn.output_linear.quantized_dot_general.fp8_amax_history_length == HISTORY
    qkv = attn.input_linear
    while not hasattr(qkv, "layer"):  # RoFormerQKVLinear wraps the fused projection.
        qkv = qkv.input_linear
    assert qkv.layer.quantized_dot_general.fp8_amax_history_length == HISTORY


@pytest.mark.slow  # Two 50-step trainings: ~60 s on 2 busy cores.
def test_fp8_loss_within_2_percent_of_bf16():
    (_, _, bf16_losses), (params, _, fp8_losses) = _runs()
    # Training happened (the pattern is learnt) ...
    assert bf16_losses[-1] < 0.6 * bf16_losses[0]
    # ... and fp8 follows bf16: the last 10 steps' mean loss within 2%.
    bf16_tail, fp8_tail = np.mean(bf16_losses[-10:]), np.mean(fp8_losses[-10:])
    assert abs(fp8_tail - bf16_tail) <= 0.02 * bf16_tail, (bf16_tail, fp8_tail)
    # The fp8 run really was quantized: its losses differ from bf16's.
    assert not np.allclose(bf16_losses, fp8_losses, rtol=1e-4)
    # The histories hold the last HISTORY steps' amaxes (all filled after 50 steps), and each
    # scale is max(history before the last step) / fp8 max.
    fp8_state = {
        path: value
        for path, value in flatten_items(params)
        if path.rsplit("/", 1)[-1] in get_all_fp8_param_names()
    }
    histories = [v for p, v in fp8_state.items() if p.endswith("amax_history")]
    assert histories and all(h.shape == (HISTORY,) and np.all(h > 0) for h in histories)
    for path, history in fp8_state.items():
        if path.endswith("/input_amax_history"):
            scale = fp8_state[path.replace("input_amax_history", "input_scale")]
            assert float(scale) <= np.max(np.asarray(history)) / 448.0 * 1.5


def test_fp8_checkpoint_round_trip(tmp_path):
    """The fp8 scales/histories (and everything else) restore bit for bit, and training resumed
    from the checkpoint continues exactly as the uninterrupted run."""
    cfg, params, state, step = _setup(fp8=True)
    batches = list(_batches(cfg.model.decoder.vocab_size, 6))
    for batch in batches[:3]:
        params, state, _ = step(params, state, batch)
    ckpt = (
        Checkpointer.default_config()
        .set(
            name="ckpt",
            dir=str(tmp_path / "ckpt"),
            save_policy=config_for_function(every_n_steps_policy).set(n=1),
        )
        .instantiate(parent=None)
    )
    with ckpt:
        ckpt.save(step=3, state=dict(model=params, learner=state))
        ckpt.wait_until_finished()
        zeros = jax.tree.map(jnp.zeros_like, dict(model=params, learner=state))
        restored_step, restored = ckpt.restore(state=zeros)
    assert restored_step == 3
    for (path, a), (_, b) in zip(
        flatten_items(dict(model=params, learner=state)), flatten_items(restored)
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path)
    fp8_paths = [p for p, _ in flatten_items(restored["model"]) if "amax_history" in p]
    assert fp8_paths
    p1, s1, p2, s2 = params, state, restored["model"], restored["learner"]
    for batch in batches[3:]:
        p1, s1, l1 = step(p1, s1, batch)
        p2, s2, l2 = step(p2, s2, batch)
        assert float(l1) == float(l2)
