"""Tests of axlearn.common.pipeline_1f1b: 1F1B tick tables and the custom-VJP runner.

The tick table is checked against the dependencies of a pipeline (every item forward through
the stages, backward in reverse, rounds chained) by brute force; the runner (through
`pipeline.Pipeline` with OneFOneBSchedule / InterleavedOneFOneBSchedule) against a plain JAX
loop over the chunks, on 8 CPU devices. The decoder-level comparisons (a tiny decoder vs the
unpipelined model) are in tests/common/test_pipeline.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from axlearn.common.layers import Dropout, Linear
from axlearn.common.module import functional
from axlearn.common.pipeline import (
    GPipeSchedule,
    InterleavedOneFOneBSchedule,
    OneFOneBSchedule,
    Pipeline,
    format_pipeline_report,
    pipeline_report,
)
from axlearn.common.pipeline_1f1b import (
    backward_item,
    format_schedule_table,
    forward_index,
    forward_item,
    tick_table,
)
from tests.common.pipeline_test_utils import (
    DropoutPipeline,
    LinearPipeline,
    assert_linear_pipeline_matches_plain_jax,
    resume_copy,
    train_losses,
)


@pytest.mark.parametrize(
    "s,v,m", [(4, 1, 4), (4, 1, 16), (2, 1, 1), (2, 2, 4), (4, 2, 8), (3, 3, 6)]
)
def test_tick_table_respects_dependencies_and_bounds(s, v, m):
    table = tick_table(s, v, m)
    fwd, bwd = {}, {}
    for t in range(table["num_ticks"]):
        for stage in range(s):
            for kind, seen in (("forward", fwd), ("backward", bwd)):
                mb, rnd = table[kind][t, stage]
                if mb >= 0:
                    assert (mb, rnd, stage) not in seen, "an item runs twice on a stage"
                    seen[(mb, rnd, stage)] = t
    items = [(mb, r) for mb in range(m) for r in range(v)]
    assert len(fwd) == len(bwd) == len(items) * s
    for mb, r in items:
        for stage in range(s - 1):
            # Forward moves one stage per tick at least; backward comes back the same way.
            assert fwd[(mb, r, stage + 1)] > fwd[(mb, r, stage)]
            assert bwd[(mb, r, stage)] > bwd[(mb, r, stage + 1)]
        # The backward of a chunk follows its forward (same tick: forward half first).
        assert bwd[(mb, r, s - 1)] >= fwd[(mb, r, s - 1)]
        if r + 1 < v:  # Rounds chain through the ring: last stage -> stage 0.
            assert fwd[(mb, r + 1, 0)] > fwd[(mb, r, s - 1)]
            assert bwd[(mb, r, s - 1)] > bwd[(mb, r + 1, 0)]
    # Memory bound: the ring holds the most items alive at once, independent of M.
    if v == 1:
        assert table["ring_slots"] == min(m, 2 * s - 1)
    else:
        assert table["ring_slots"] == (v + 1) * s - 1
    # Busy slots over all forward + backward slots: the bubble formula.
    assert table["bubble_fraction"] == pytest.approx((s - 1) / (v * m + s - 1))
    # The slot tables never overwrite a live item and give every backward its forward's slot.
    for stage in range(s):
        live = {}
        for t in range(table["num_ticks"]):
            item = tuple(table["forward"][t, stage])
            if item[0] >= 0:
                slot = int(table["forward_slot"][t, stage])
                assert 0 <= slot < table["ring_slots"] and slot not in live
                live[slot] = item
            item = tuple(table["backward"][t, stage])
            if item[0] >= 0:
                assert live.pop(int(table["backward_slot"][t, stage])) == item


def test_item_orders_are_permutations():
    s, v, m = 4, 2, 8
    kw = dict(num_stages=s, num_virtual_stages=v)
    j = np.arange(v * m)
    mb, rnd = forward_item(j, **kw)
    assert sorted(zip(mb.tolist(), rnd.tolist())) == [(a, b) for a in range(m) for b in range(v)]
    np.testing.assert_array_equal(forward_index(mb, rnd, **kw), j)
    bmb, brnd = backward_item(j, **kw)
    # Groups of S microbatches; rounds reversed in the backward order.
    assert bmb[:s].tolist() == [0, 1, 2, 3] and brnd[:s].tolist() == [1] * s
    assert mb[:s].tolist() == [0, 1, 2, 3] and rnd[:s].tolist() == [0] * s


def test_format_schedule_table_text():
    one = OneFOneBSchedule.default_config().set(num_stages=2, num_microbatches=2).instantiate()
    text = format_schedule_table(one)
    lines = text.splitlines()
    assert lines[0] == "OneFOneBSchedule"
    assert lines[1].split() == ["tick", "stage0", "stage1"]
    # Tick 1: stage 0 runs forward of mb 1, stage 1 forward and backward of mb 0.
    assert lines[3].split() == ["1", "F1", ".", "F0", "B0"]
    assert "bubble fraction 0.3333" in lines[-1]
    gpipe = GPipeSchedule.default_config().set(num_stages=2, num_microbatches=2).instantiate()
    text = format_schedule_table(gpipe)
    assert text.splitlines()[3].split() == ["1", "F1", "F0"]
    assert "3 forward steps" in text


@pytest.mark.parametrize("s,v,m", [(4, 1, 16), (4, 2, 16)])
def test_start_up_report_logs_the_1f1b_bubble(s, v, m):
    """The trainer's start-up lines (pipeline_report / format_pipeline_report) for 1F1B."""
    layer = (
        LinearPipeline.default_config()
        .set(
            name="pipe",
            layer=Linear.default_config().set(input_dim=4, output_dim=4),
            num_layers=s,
            num_microbatches=m,
            schedule=_schedule(v),
        )
        .instantiate(parent=None)
    )
    report = pipeline_report(layer, layer.create_parameter_specs_recursively(), {"pipeline": s})
    (summary,) = report["pipelines"]
    assert summary["bubble_fraction"] == pytest.approx((s - 1) / (v * m + s - 1))
    assert summary["bubble_fraction"] == pytest.approx(tick_table(s, v, m)["bubble_fraction"])
    name = "OneFOneBSchedule" if v == 1 else "InterleavedOneFOneBSchedule"
    line = format_pipeline_report(report)[0]
    assert line.startswith(f"Pipeline pipe: {name}, {s} stages x {v} virtual, {m} microbatches")
    assert line.endswith(f"bubble fraction {(s - 1) / (v * m + s - 1):.4f} (= (S-1)/(V*M+S-1))")


def _schedule(v):
    if v == 1:
        return OneFOneBSchedule.default_config()
    return InterleavedOneFOneBSchedule.default_config().set(num_virtual_stages=v)


@pytest.mark.parametrize("s,v,m", [(4, 1, 6), (2, 1, 1), (4, 2, 4)])
def test_1f1b_loss_and_gradients_match_plain_jax(s, v, m):
    """Outputs, per-chunk outputs and gradients (params and input) vs a plain JAX loop."""
    dim, batch = 6, 2 * m
    layer = (
        LinearPipeline.default_config()
        .set(
            name="pipe",
            layer=Linear.default_config().set(input_dim=dim, output_dim=dim),
            num_layers=s,
            num_microbatches=m,
            schedule=_schedule(v),
        )
        .instantiate(parent=None)
    )
    x = jax.random.normal(jax.random.PRNGKey(2), (batch, dim))
    weights = jnp.arange(s * v * batch, dtype=jnp.float32).reshape(s * v, batch) / batch
    mesh = Mesh(np.asarray(jax.devices()[: 2 * s]).reshape(s, 2), ("pipeline", "model"))
    assert_linear_pipeline_matches_plain_jax(layer, x=x, weights=weights, mesh=mesh)


class _ScaledPipeline(Pipeline):
    """Multiplies by a tensor the stage closes over (hoisted and differentiated)."""

    def forward(self, x, scale):
        return self._run(lambda carry, _: (jnp.tanh(self.layer(carry) * scale), {}), x).carry


def test_closed_over_tensors_get_gradients():
    s, m, dim = 2, 2, 4
    cfgs = [
        _ScaledPipeline.default_config().set(
            name="pipe",
            layer=Linear.default_config().set(input_dim=dim, output_dim=dim),
            num_layers=s,
            num_microbatches=m,
            schedule=schedule,
        )
        for schedule in (GPipeSchedule.default_config(), OneFOneBSchedule.default_config())
    ]
    layers = [cfg.instantiate(parent=None) for cfg in cfgs]
    params = layers[0].initialize_parameters_recursively(jax.random.PRNGKey(1))
    x = jax.random.normal(jax.random.PRNGKey(2), (4, dim))
    scale = jnp.linspace(0.5, 1.5, dim)
    results = []
    for layer in layers:

        def loss(params, x, scale, layer=layer):
            out, _ = functional(layer, None, params, dict(x=x, scale=scale), is_training=True)
            return jnp.sum(out**2)

        results.append(jax.grad(loss, argnums=(0, 1, 2))(params, x, scale))
    for a, b in zip(jax.tree.leaves(results[1]), jax.tree.leaves(results[0])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(results[1][2]).sum()) > 0


class _SidePipeline(Pipeline):
    """Each chunk adds a per-example float side input, masked by an int side input."""

    def forward(self, x, gain, ids):
        def fn(carry, side):
            y = jnp.tanh(self.layer(carry) + side["gain"] * (side["ids"][:, None] % 2))
            return y, {}

        return self._run(fn, x, side_inputs=dict(gain=gain, ids=ids)).carry


def test_side_inputs_int_and_float_gradients_match_gpipe():
    s, m, dim, batch = 2, 4, 4, 8
    x = jax.random.normal(jax.random.PRNGKey(2), (batch, dim))
    gain = jax.random.normal(jax.random.PRNGKey(3), (batch, dim))
    ids = jnp.arange(batch, dtype=jnp.int32)
    results = []
    for schedule in (GPipeSchedule.default_config(), OneFOneBSchedule.default_config()):
        layer = (
            _SidePipeline.default_config()
            .set(
                name="pipe",
                layer=Linear.default_config().set(input_dim=dim, output_dim=dim),
                num_layers=s,
                num_microbatches=m,
                schedule=schedule,
            )
            .instantiate(parent=None)
        )
        params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))

        def loss(params, x, gain, layer=layer):
            inputs = dict(x=x, gain=gain, ids=ids)
            out, _ = functional(layer, None, params, inputs, is_training=True)
            return jnp.sum(out**2)

        results.append(jax.grad(loss, argnums=(0, 1, 2))(params, x, gain))
    for a, b in zip(jax.tree.leaves(results[1]), jax.tree.leaves(results[0])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Odd rows get the gain; even rows' gain has no effect (zero gradient).
    assert float(jnp.abs(results[1][2][0::2]).max()) == 0.0
    assert float(jnp.abs(results[1][2][1::2]).min()) > 0.0


def test_dropout_masks_equal_gpipe_and_gradients_use_them():
    """The same PRNG key per (chunk, microbatch) as GPipe; the backward reuses the masks."""
    s, m = 2, 4
    outs = []
    for schedule in (GPipeSchedule.default_config(), OneFOneBSchedule.default_config()):
        layer = (
            DropoutPipeline.default_config()
            .set(
                name="pipe",
                layer=Dropout.default_config().set(rate=0.5),
                num_layers=s,
                num_microbatches=m,
                schedule=schedule,
            )
            .instantiate(parent=None)
        )

        def f(x, layer=layer):
            return functional(layer, jax.random.PRNGKey(0), {}, [x], is_training=True)[0].carry

        x = jnp.ones((m, 32))
        out, grad = f(x), jax.grad(lambda x, f=f: jnp.sum(f(x) * 3.0))(x)
        outs.append((np.asarray(out), np.asarray(grad)))
    np.testing.assert_array_equal(outs[1][0], outs[0][0])
    # d(sum(3 * mask * x * 4)) / dx = 12 where kept, else 0: the forward's mask.
    np.testing.assert_array_equal(outs[1][1], 3.0 * outs[1][0])


def test_bad_microbatch_count_names_config_path():
    layer_cfg = LinearPipeline.default_config().set(
        name="pipe",
        layer=Linear.default_config().set(input_dim=4, output_dim=4),
        num_layers=4,
        num_microbatches=6,
        schedule=_schedule(2),
    )
    with pytest.raises(
        ValueError,
        match=r"^pipe\.schedule: InterleavedOneFOneBSchedule: num_microbatches=6 is not a "
        r"multiple of num_stages=4 .*set num_microbatches to 4 or 8",
    ):
        layer_cfg.instantiate(parent=None)
    with pytest.raises(ValueError, match=r"num_virtual_stages must be >= 1, got 0; set"):
        InterleavedOneFOneBSchedule.default_config().set(
            num_stages=2, num_microbatches=2, num_virtual_stages=0
        ).instantiate()


# ----------------------------------------------------------------------------------------------
# Trainer runs: the pipelined fuji test config with every schedule.
# ----------------------------------------------------------------------------------------------


def _fuji_pipelined(trainer_dir, *, schedule: str, max_step: int = 20):
    """fuji-test-v3 (4 layers) on fake data, pipelined over 2 stages (pipeline=2 x data=4).

    "gpipe"/"1f1b" hold 2 layers per stage; "circular"/"interleaved_1f1b" 2 chunks of 1 layer.
    The learning rate is a constant 0.01: the config's own schedule (peak 6e-4 after 2000
    warm-up steps, 6e-6 at step 20) leaves the loss where it started, so the runs would not
    show that the pipeline trains. Float32 compute (the config's train_dtype is bfloat16): the
    schedules order the backward's sums differently, and in bfloat16 that rounding alone moves
    the losses by 3e-5..1e-4 relative from step 2 on (measured with learning rates 1e-3 and
    1e-2 alike). Checkpoints (with the input position) at steps 0, 15 and 20.
    """
    from axlearn.common.input_fake import FakeLmInput
    from axlearn.common.trainer_config_modifier import (
        ChainConfigModifier,
        MeshShapeModifier,
        PipelineModifier,
    )
    from axlearn.experiments.text.gpt import c4_trainer

    cfg = c4_trainer.named_trainer_configs()["fuji-test-v3"]()
    # save_input_iterator: a resumed run continues the fake input where the checkpoint was.
    cfg.set(dir=str(trainer_dir), mesh_rules=[], max_step=max_step, save_input_iterator=True)
    cfg.evalers = {}
    cfg.checkpointer.keep_last_n = 100
    cfg.checkpointer.save_policy.set(n=15, min_step=0, max_step=max_step)
    adamw = cfg.learner.optimizer.args[1]
    adamw.set(learning_rate=0.01, update_schedule=1)
    cfg.train_dtype = jnp.float32
    cfg.input = FakeLmInput.default_config().set(
        is_training=True, global_batch_size=32, source_length=64, max_token_id=32
    )
    virtual = 2 if schedule in ("circular", "interleaved_1f1b") else 1
    modifier = ChainConfigModifier.default_config().set(
        config_modifiers=[
            PipelineModifier.default_config().set(
                num_stages=2, num_microbatches=4, num_virtual_stages=virtual, schedule=schedule
            ),
            MeshShapeModifier.default_config().set(mesh_shape=(2, 4, 1, 1, 1, 1)),
        ]
    )
    return modifier.instantiate()(cfg)


def _assert_losses_match(actual, expected, steps):
    assert sorted(actual) == list(steps)
    a = np.array([actual[s] for s in steps])
    e = np.array([expected[s] for s in steps])
    np.testing.assert_allclose(a, e, rtol=1e-5, atol=0)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_fuji_schedules_train_20_steps_like_gpipe_and_checkpoints_interchange(tmp_path):
    """The pipelined fuji test config trains 20 steps with every schedule, as GPipe does.

    - GPipe trains (loss at step 20 well below step 1).
    - 1F1B (GPipe's layout, so the same initialization): steps 1..20 within rtol 1e-5 of
      GPipe's; GPipe resumed from 1F1B's step-15 checkpoint matches GPipe's steps 16..20.
    - Interleaved 1F1B from GPipe's step-0 checkpoint converted to its layout (2 chunks of 1
      layer per stage): steps 1..20 within rtol 1e-5 of GPipe's; circular resumed from the
      interleaved run's step-15 checkpoint (the same layout, unconverted) matches steps 16..20.
    One GPipe run serves every comparison (the trainer runs are CI's longest tests).
    """
    from axlearn.common.pipeline_checkpoint import convert_trainer_checkpoint

    gpipe = train_losses(_fuji_pipelined(tmp_path / "gpipe", schedule="gpipe"))
    assert sorted(gpipe) == list(range(1, 21))
    assert gpipe[20] < gpipe[1] - 0.2, gpipe  # It trains: 3.88 -> 3.44 measured.
    one = train_losses(_fuji_pipelined(tmp_path / "1f1b", schedule="1f1b"))
    _assert_losses_match(one, gpipe, range(1, 21))
    resume_copy(tmp_path / "1f1b", tmp_path / "gpipe_from_1f1b", keep_step=15)
    resumed = train_losses(_fuji_pipelined(tmp_path / "gpipe_from_1f1b", schedule="gpipe"))
    _assert_losses_match(resumed, gpipe, range(16, 21))

    src = _fuji_pipelined(tmp_path / "gpipe", schedule="gpipe")
    dst = _fuji_pipelined(tmp_path / "inter", schedule="interleaved_1f1b")
    assert convert_trainer_checkpoint(src, dst, step=0) == 0
    inter = train_losses(dst)
    _assert_losses_match(inter, gpipe, range(1, 21))
    resume_copy(tmp_path / "inter", tmp_path / "circular_from_inter", keep_step=15)
    circular = train_losses(_fuji_pipelined(tmp_path / "circular_from_inter", schedule="circular"))
    _assert_losses_match(circular, inter, range(16, 21))
