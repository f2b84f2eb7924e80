"""Tests of axlearn.common.pipeline (and attention.PipelinedTransformerLayer).

The pipelined computation is compared with the same weights run unpipelined (a
RepeatedTransformerLayer, or a NumPy loop for the schedule arithmetic), on 8 CPU devices.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from axlearn.common.attention import PipelinedTransformerLayer, pipelined_stack_config
from axlearn.common.base_layer import RematSpec
from axlearn.common.layers import Dropout, Linear
from axlearn.common.module import functional
from axlearn.common.pipeline import (
    CircularSchedule,
    GPipeSchedule,
    chunk_order_to_rows,
    gpipe_bubble_fraction,
    pipeline_summary,
    rows_to_chunk_order,
    transpose_from_pipeline_stage_outputs,
    transpose_to_pipeline_stage_inputs,
)
from axlearn.common.pipeline_checkpoint import pipelined_to_repeated, repeated_to_pipelined
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config
from tests.common.pipeline_test_utils import (
    DropoutPipeline,
    LinearPipeline,
    assert_linear_pipeline_matches_plain_jax,
    run_trainer,
)

# ----------------------------------------------------------------------------------------------
# Schedules.
# ----------------------------------------------------------------------------------------------


def _brute_force_schedule(s, v, m):
    """{(t, stage): (microbatch, round)} by simulating microbatches entering stage 0."""
    events = {}
    # Microbatch mb of round r enters stage 0 at time r * m + mb and moves one stage per step.
    for r in range(v):
        for mb in range(m):
            for stage in range(s):
                key = (r * m + mb + stage, stage)
                assert key not in events, "two items on one stage at one time"
                events[key] = (mb, r)
    return events


@pytest.mark.parametrize("s,v,m", [(4, 1, 4), (4, 1, 1), (2, 2, 2), (4, 2, 6), (3, 3, 5)])
def test_schedule_stage_items_match_brute_force(s, v, m):
    if v == 1:
        schedule = GPipeSchedule.default_config().set(num_stages=s, num_microbatches=m)
    else:
        schedule = CircularSchedule.default_config().set(
            num_stages=s, num_microbatches=m, num_virtual_stages=v
        )
    schedule = schedule.instantiate()
    expected = _brute_force_schedule(s, v, m)
    busy = 0
    for t in range(schedule.num_steps()):
        mb, rnd, valid = (np.asarray(x) for x in schedule.stage_items(jnp.asarray(t)))
        for stage in range(s):
            if (t, stage) in expected:
                assert valid[stage]
                assert (mb[stage], rnd[stage]) == expected[(t, stage)]
                busy += 1
            else:
                assert not valid[stage]
    # Every item is processed exactly once and the idle fraction is the formula's.
    assert busy == len(expected) == s * v * m
    idle = 1 - busy / (s * schedule.num_steps())
    assert idle == pytest.approx(schedule.bubble_fraction())
    assert idle == pytest.approx((s - 1) / (v * m + s - 1))
    assert gpipe_bubble_fraction(s, m, v) == pytest.approx(idle)


def test_schedule_bad_inputs_name_values():
    with pytest.raises(ValueError, match=r"num_microbatches=2 < num_stages=4"):
        CircularSchedule.default_config().set(
            num_stages=4, num_microbatches=2, num_virtual_stages=2
        ).instantiate()
    with pytest.raises(ValueError, match=r"num_microbatches must be a positive int, got 0"):
        GPipeSchedule.default_config().set(num_stages=4, num_microbatches=0).instantiate()
    with pytest.raises(ValueError, match=r"num_virtual_stages must be >= 1, got 0"):
        CircularSchedule.default_config().set(
            num_stages=4, num_microbatches=4, num_virtual_stages=0
        ).instantiate()


def test_transposes_match_loops():
    n, m = 3, 4
    x = np.arange(n * m * 2, dtype=np.float32).reshape(n, m, 2) + 1
    y = np.asarray(transpose_to_pipeline_stage_inputs(jnp.asarray(x)))
    expected = np.zeros((m + n - 1, n, 2), np.float32)
    for i in range(n):
        for j in range(m):
            expected[i + j, i] = x[i, j]
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(np.asarray(transpose_from_pipeline_stage_outputs(y)), x)


def test_chunk_row_order():
    s, v = 4, 2
    chunks = np.arange(s * v)
    rows = np.asarray(chunk_order_to_rows(chunks, num_stages=s, num_virtual_stages=v))
    # Device (stage) s holds rows s*V .. s*V + V - 1 = chunks s, s + S.
    for stage in range(s):
        assert list(rows[stage * v : stage * v + v]) == [stage + r * s for r in range(v)]
    back = rows_to_chunk_order(rows, num_stages=s, num_virtual_stages=v)
    np.testing.assert_array_equal(back, chunks)


# ----------------------------------------------------------------------------------------------
# A Pipeline of Linear layers vs a NumPy loop.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("v", [1, 2])
def test_pipeline_of_linear_layers_matches_numpy(v):
    s, m, dim, batch = 4, 4, 6, 8
    schedule = (
        GPipeSchedule.default_config()
        if v == 1
        else CircularSchedule.default_config().set(num_virtual_stages=v)
    )
    layer = (
        LinearPipeline.default_config()
        .set(
            name="pipe",
            layer=Linear.default_config().set(input_dim=dim, output_dim=dim),
            num_layers=s,
            num_microbatches=m,
            schedule=schedule,
        )
        .instantiate(parent=None)
    )
    summary = pipeline_summary(layer.config)
    assert summary == dict(
        schedule="GPipeSchedule" if v == 1 else "CircularSchedule",
        num_stages=s,
        num_virtual_stages=v,
        num_microbatches=m,
        num_steps=v * m + s - 1,
        bubble_fraction=pytest.approx((s - 1) / (v * m + s - 1)),
    )
    specs = layer.create_parameter_specs_recursively()
    assert specs["layer"]["weight"].shape == (s * v, dim, dim)
    assert tuple(specs["layer"]["weight"].mesh_axes) == ("pipeline", None, None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    params = jax.tree.map(lambda p: p + 0.1 * jnp.cos(jnp.arange(p.size).reshape(p.shape)), params)
    x = jax.random.normal(jax.random.PRNGKey(2), (batch, dim))
    out, _ = functional(layer, jax.random.PRNGKey(0), params, [x], is_training=True)

    w = rows_to_chunk_order(
        np.asarray(params["layer"]["weight"]), num_stages=s, num_virtual_stages=v
    )
    b = rows_to_chunk_order(np.asarray(params["layer"]["bias"]), num_stages=s, num_virtual_stages=v)
    h = np.asarray(x, np.float64)
    sums = []
    for c in range(s * v):
        h = np.tanh(h @ w[c] + b[c])
        sums.append(h.sum(-1))
    np.testing.assert_allclose(np.asarray(out.carry), h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.ys["y_sum"]), np.stack(sums), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("v,remat", [(1, False), (1, True), (2, True)])
def test_pipeline_gradients_match_plain_jax(v, remat):
    """Gradients through the pipeline (with per-stage remat) equal a plain JAX layer loop's."""
    s, m, dim, batch = 4, 4, 6, 8
    schedule = (
        GPipeSchedule.default_config()
        if v == 1
        else CircularSchedule.default_config().set(num_virtual_stages=v)
    )
    stage = Linear.default_config().set(input_dim=dim, output_dim=dim)
    if remat:
        stage.set(remat_spec=RematSpec(prevent_cse=False))
    layer = (
        LinearPipeline.default_config()
        .set(name="pipe", layer=stage, num_layers=s, num_microbatches=m, schedule=schedule)
        .instantiate(parent=None)
    )
    x = jax.random.normal(jax.random.PRNGKey(2), (batch, dim))
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("pipeline", "model"))
    assert_linear_pipeline_matches_plain_jax(
        layer, x=x, weights=jnp.ones((s * v, batch)), mesh=mesh
    )
    assert ("forward" in layer.layer._remat_methods) == remat


# ----------------------------------------------------------------------------------------------
# A decoder pipelined vs unpipelined.
# ----------------------------------------------------------------------------------------------

VOCAB, BATCH, LENGTH, NUM_LAYERS = 32, 8, 8, 8
_AXES = ("pipeline", "data", "expert", "fsdp", "seq", "model")


def _mesh(pipeline: int, model: int, fsdp: int = 1) -> Mesh:
    shape = (pipeline, 1, 1, fsdp, 1, model)
    devices = np.asarray(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    return Mesh(devices, _AXES)


def _model_cfg(*, remat: bool, dropout_rate: float = 0.0):
    return transformer_lm_config(
        num_layers=NUM_LAYERS,
        model_dim=16,
        num_heads=4,
        num_kv_heads=2,
        hidden_dim=32,
        vocab_size=VOCAB,
        qk_norm=True,
        remat=remat,
        dropout_rate=dropout_rate,
        sharding=True,
    )


def _pipelined(cfg, *, s, v, m, schedule=None):
    cfg = cfg.clone()
    cfg.decoder.transformer = pipelined_stack_config(
        cfg.decoder.transformer,
        num_stages=s,
        num_microbatches=m,
        num_virtual_stages=v,
        schedule=schedule,
    )
    return cfg


def _batch(seed=3):
    ids = jax.random.randint(jax.random.PRNGKey(seed), (BATCH, LENGTH + 1), 2, VOCAB)
    return dict(input_ids=ids[:, :-1], target_labels=ids[:, 1:])


_PIPELINED = {}


def _pipelined_result(s, v, m, remat, schedule=None):
    """(loss, grads converted to the repeated layout, compiled HLO text) of a pipelined run."""
    key = (s, v, m, remat, schedule)
    if key not in _PIPELINED:
        params = _reference(remat)[0]
        cfg = _pipelined(_model_cfg(remat=remat), s=s, v=v, m=m, schedule=schedule)
        pipe_params = repeated_to_pipelined(params, num_stages=s, num_virtual_stages=v)
        layer = pipe_params["decoder"]["transformer"]["pipeline"]["layer"]
        assert sorted(layer) == [f"layer{k}" for k in range(NUM_LAYERS // (s * v))]
        # pipeline=4 x model=2, or pipeline=2 x fsdp=2 x model=2.
        mesh = _mesh(s, 2, fsdp=8 // (2 * s))
        loss, grads, hlo = _loss_and_grads(cfg, pipe_params, _batch(), mesh)
        grads = pipelined_to_repeated(grads, num_stages=s, num_virtual_stages=v)
        _PIPELINED[key] = (loss, grads, hlo, jax.tree.map(np.shape, pipe_params))
    return _PIPELINED[key]


def _loss_and_grads(model_cfg, params, batch, mesh, prng_key=None):
    model = model_cfg.clone(name="model").instantiate(parent=None)
    specs = model.create_parameter_specs_recursively()
    shardings = jax.tree.map(
        lambda spec: NamedSharding(mesh, PartitionSpec(*(spec.mesh_axes or ()))),
        specs,
        is_leaf=lambda x: hasattr(x, "mesh_axes"),
    )

    def loss_fn(params, batch):
        (loss, _), _ = functional(
            model, prng_key, params, dict(input_batch=batch), is_training=True
        )
        return loss

    with jax.set_mesh(mesh):
        params = jax.device_put(params, shardings)
        fn = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(shardings, None))
        compiled = fn.lower(params, batch).compile()
        loss, grads = compiled(params, batch)
    return float(loss), jax.tree.map(np.asarray, grads), compiled.as_text()


_REFERENCE = {}


def _reference(remat):
    """Unpipelined loss, grads and parameters (model=2 on a pipeline-free slice of the mesh)."""
    if remat not in _REFERENCE:
        cfg = _model_cfg(remat=remat)
        model = cfg.clone(name="model").instantiate(parent=None)
        params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
        params = jax.tree.map(
            lambda x: x * (1 + 0.3 * jnp.sin(jnp.arange(x.size).reshape(x.shape))), params
        )
        params = jax.tree.map(np.asarray, params)
        loss, grads, _ = _loss_and_grads(cfg, params, _batch(), _mesh(1, 2))
        _REFERENCE[remat] = (params, loss, grads)
    return _REFERENCE[remat]


def _assert_grads_close(actual, expected):
    for path, (a, e) in zip(
        jax.tree_util.tree_leaves_with_path(expected),
        zip(jax.tree.leaves(actual), jax.tree.leaves(expected)),
    ):
        scale = max(np.abs(e).max(), 1e-6)
        np.testing.assert_allclose(a / scale, e / scale, atol=1e-5, err_msg=str(path[0]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "s,v,m,remat",
    [
        (4, 1, 4, False),
        (4, 1, 8, True),
        (2, 2, 2, False),
        (2, 2, 4, True),
        (4, 2, 4, False),
        (4, 2, 4, True),
    ],
)
def test_pipelined_decoder_matches_unpipelined(s, v, m, remat):
    _, ref_loss, ref_grads = _reference(remat)
    loss, grads, _, _ = _pipelined_result(s, v, m, remat)
    assert abs(loss - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss)), (loss, ref_loss)
    _assert_grads_close(grads, ref_grads)


@pytest.mark.slow
@pytest.mark.parametrize(
    "s,v,m,remat,schedule",
    [
        (4, 1, 4, False, "1f1b"),
        (4, 1, 8, True, "1f1b"),
        (2, 1, 4, False, "1f1b"),
        (2, 2, 4, False, "interleaved_1f1b"),
        (4, 2, 4, False, "interleaved_1f1b"),
        (4, 2, 8, True, "interleaved_1f1b"),
    ],
)
def test_1f1b_decoder_matches_unpipelined(s, v, m, remat, schedule):
    """1F1B and interleaved 1F1B: the unpipelined loss within 1e-5, gradients within 1e-5."""
    _, ref_loss, ref_grads = _reference(remat)
    loss, grads, hlo, _ = _pipelined_result(s, v, m, remat, schedule)
    assert abs(loss - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss)), (loss, ref_loss)
    _assert_grads_close(grads, ref_grads)
    assert _hlo_ops(hlo, "collective-permute"), "no collective-permute between stages"


def _hlo_ops(hlo: str, op: str) -> list[str]:
    return [line for line in hlo.splitlines() if re.search(rf"= \S+ {op}(-start)?\(", line)]


@pytest.mark.slow
@pytest.mark.parametrize("s,v,m", [(4, 1, 4), (4, 2, 4)])
def test_pipelined_step_hlo_permutes_activations_and_keeps_weights_local(s, v, m):
    """Collective-permutes between pipeline neighbours; no all-gather of stacked weights."""
    _, _, hlo, param_shapes = _pipelined_result(s, v, m, False)
    model = 2
    # Device id = pipeline_index * model + model_index (see _mesh).
    neighbour_permutes = 0
    for line in _hlo_ops(hlo, "collective-permute"):
        pairs = re.findall(r"\{(\d+),(\d+)\}", line.split("source_target_pairs=")[1])
        if pairs and all(
            int(a) % model == int(b) % model
            and (int(b) // model - int(a) // model) % s in (1, s - 1)
            for a, b in pairs
        ):
            neighbour_permutes += 1
    assert neighbour_permutes >= 2, "no collective-permute between pipeline stages"
    stacked = [
        shape
        for shape in jax.tree.leaves(
            param_shapes["decoder"]["transformer"], is_leaf=lambda x: isinstance(x, tuple)
        )
        if len(shape) > 1
    ]
    assert stacked and all(shape[0] == s * v for shape in stacked)
    gathers = _hlo_ops(hlo, "all-gather")
    for line in gathers:
        out_shape = tuple(int(d) for d in re.search(r"= \w+\[([\d,]*)\]", line).group(1).split(","))
        for shape in stacked:
            # The whole stacked weight (possibly still split over the model axis).
            # The whole stacked weight: its global shape, or with one dim split over the model
            # axis (each weight is sharded over the model axis on at most one dim; fsdp=1).
            candidates = {shape} | {
                shape[:i] + (shape[i] // model,) + shape[i + 1 :] for i in range(1, len(shape))
            }
            assert out_shape not in candidates, (
                f"all-gather of a stacked weight {shape}: {line[:200]}"
            )


def test_bad_inputs_name_values():
    base = _model_cfg(remat=False).decoder.transformer.set(input_dim=16)
    assert pipelined_stack_config(base, num_stages=4, num_microbatches=4).klass is (
        PipelinedTransformerLayer
    )
    with pytest.raises(ValueError, match=r"num_layers=8 is not divisible by num_stages=3 x "):
        pipelined_stack_config(base, num_stages=3, num_microbatches=4).set(name="t").instantiate(
            parent=None
        )
    with pytest.raises(
        ValueError, match=r"num_layers=8 is not divisible by num_stages=2 x num_virtual_stages=3"
    ):
        pipelined_stack_config(base, num_stages=2, num_microbatches=4, num_virtual_stages=3).set(
            name="t"
        ).instantiate(parent=None)
    with pytest.raises(ValueError, match=r"num_microbatches=2 < num_stages=4"):
        pipelined_stack_config(base, num_stages=4, num_microbatches=2, num_virtual_stages=2).set(
            name="t"
        ).instantiate(parent=None)
    with pytest.raises(
        ValueError,
        match=r"^t\.pipeline\.schedule: InterleavedOneFOneBSchedule: num_microbatches=6 is not a "
        r"multiple of num_stages=4 .*; set num_microbatches to 4 or 8, or use CircularSchedule\.$",
    ):
        pipelined_stack_config(
            base,
            num_stages=4,
            num_microbatches=6,
            num_virtual_stages=2,
            schedule="interleaved_1f1b",
        ).set(name="t").instantiate(parent=None)
    with pytest.raises(
        ValueError,
        match=r"^t: num_layers=8 is not divisible by num_stages=2 x num_virtual_stages=3 \(= 6\); "
        r"set t\.num_layers to a multiple of 6 or change num_stages / num_virtual_stages\.$",
    ):
        pipelined_stack_config(
            base,
            num_stages=2,
            num_microbatches=4,
            num_virtual_stages=3,
            schedule="interleaved_1f1b",
        ).set(name="t").instantiate(parent=None)
    with pytest.raises(ValueError, match=r"schedule='zb' is not one of \('gpipe'"):
        pipelined_stack_config(base, num_stages=2, num_microbatches=4, schedule="zb")

    layer = (
        LinearPipeline.default_config()
        .set(
            name="pipe",
            layer=Linear.default_config().set(input_dim=4, output_dim=4),
            num_layers=4,
            num_microbatches=2,
        )
        .instantiate(parent=None)
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))

    def run(x, mesh):
        with jax.set_mesh(mesh):
            return functional(layer, None, params, [x], is_training=True)

    x = jnp.ones((4, 4))
    no_pipeline = Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    with pytest.raises(
        ValueError, match=r"the mesh has no 'pipeline' axis \(axes \('data', 'model'\)"
    ):
        run(x, no_pipeline)
    wrong_size = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("pipeline", "model"))
    with pytest.raises(ValueError, match=r"mesh axis 'pipeline' has size 2 but num_stages=4"):
        run(x, wrong_size)
    good = Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("pipeline", "model"))
    with pytest.raises(ValueError, match=r"batch size 3 is not divisible by num_microbatches=2"):
        run(jnp.ones((3, 4)), good)


def test_dropout_masks_differ_per_microbatch_and_stage():
    s, m = 2, 4
    layer = (
        DropoutPipeline.default_config()
        .set(
            name="pipe",
            layer=Dropout.default_config().set(rate=0.5),
            num_layers=s,
            num_microbatches=m,
        )
        .instantiate(parent=None)
    )
    x = jnp.ones((m, 64))  # One row per microbatch (rows m, m + M, ... form microbatch m).
    out, _ = functional(layer, jax.random.PRNGKey(0), {}, [x], is_training=True)
    kept = np.asarray(out.carry) != 0
    # Two stages of rate-0.5 dropout: each element kept with probability 1/4, scaled by 4.
    np.testing.assert_allclose(np.asarray(out.carry)[kept], 4.0)
    assert 0.1 < kept.mean() < 0.4
    # Identical inputs, different masks per microbatch.
    assert len({row.tobytes() for row in kept}) == m
    # Deterministic given the key; a different key changes the masks.
    again, _ = functional(layer, jax.random.PRNGKey(0), {}, [x], is_training=True)
    np.testing.assert_array_equal(np.asarray(again.carry), np.asarray(out.carry))
    other, _ = functional(layer, jax.random.PRNGKey(1), {}, [x], is_training=True)
    assert not np.array_equal(np.asarray(other.carry), np.asarray(out.carry))


# ----------------------------------------------------------------------------------------------
# Trainer runs: pipelined vs unpipelined.
# ----------------------------------------------------------------------------------------------


def pipeline_trainer_config(
    trainer_dir,
    *,
    pipelined: bool,
    fp16: bool = False,
    max_step: int = 10,
    stack="stack",
    checkpoint_every: int = 5,
):
    """The tiny GPT trainer (8 layers, dim 64) on fake data, pipelined 4 x 2 virtual or not.

    Pipelined: mesh pipeline=4 x model=2 via the PipelineModifier + MeshShapeModifier chain (as a
    mesh rule would apply it); unpipelined: data=4 x model=2.
    """
    from axlearn.common.input_fake import FakeLmInput
    from axlearn.common.loss_scale import DynamicLossScaler
    from axlearn.common.trainer_config_modifier import (
        ChainConfigModifier,
        MeshShapeModifier,
        PipelineModifier,
    )
    from axlearn.experiments.text.gpt.tiny import tiny_trainer_config

    cfg = tiny_trainer_config(
        max_step=max_step,
        global_batch_size=8,
        seq_len=16,
        num_layers=NUM_LAYERS,
        model_dim=64,
        checkpoint_every_n_steps=checkpoint_every,
    )
    cfg.set(dir=str(trainer_dir), mesh_shape=(1, 4, 1, 1, 1, 2), mesh_rules=[])
    cfg.evalers = {}
    cfg.checkpointer.keep_last_n = 100
    cfg.input = FakeLmInput.default_config().set(
        is_training=True, global_batch_size=8, source_length=16, max_token_id=4096
    )
    if stack == "repeat":
        from axlearn.common.attention import RepeatedTransformerLayer

        old = cfg.model.decoder.transformer
        cfg.model.decoder.transformer = RepeatedTransformerLayer.default_config().set(
            num_layers=old.num_layers, layer=old.layer
        )
    if fp16:
        cfg.train_dtype = jnp.float16
        # From 2^20 this model's fp16 gradients overflow for the first 5 steps.
        cfg.learner.loss_scaler = DynamicLossScaler.default_config().set(initial_scale=2.0**20)
    if pipelined:
        modifier = ChainConfigModifier.default_config().set(
            config_modifiers=[
                PipelineModifier.default_config().set(
                    num_stages=4, num_microbatches=4, num_virtual_stages=2
                ),
                MeshShapeModifier.default_config().set(mesh_shape=(4, 1, 1, 1, 1, 2)),
            ]
        )
        cfg = modifier.instantiate()(cfg)
    return cfg


def _losses(records, steps):
    by_step = {r["step"]: r for r in records}
    return np.array([by_step[s]["loss"] for s in steps]), [
        by_step[s].get("perf/skipped_steps") for s in steps
    ]


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["to_pipelined", "to_unpipelined"])
def test_trainer_resumes_across_layouts_with_matching_losses(tmp_path, direction):
    """Train in one layout, convert the step-5 checkpoint, resume in the other layout.

    to_pipelined: 10 pipelined steps (6..15) match the unpipelined run (rtol 1e-4); the first
    resumed step within 1e-5. to_unpipelined: the reverse for steps 6..10.
    """
    import json

    from axlearn.common.pipeline_checkpoint import convert_trainer_checkpoint

    first_pipelined = direction == "to_unpipelined"
    max_step = 10 if first_pipelined else 15
    a = pipeline_trainer_config(
        tmp_path / "a", pipelined=first_pipelined, stack="repeat", max_step=max_step
    )
    b = pipeline_trainer_config(
        tmp_path / "b", pipelined=not first_pipelined, stack="repeat", max_step=max_step
    )
    _, records_a = run_trainer(a)
    assert convert_trainer_checkpoint(a, b, step=5) == 5
    _, records_b = run_trainer(b)
    resumed = list(range(6, max_step + 1))
    assert [r["step"] for r in records_b] == resumed
    loss_a, _ = _losses(records_a, resumed)
    loss_b, _ = _losses(records_b, resumed)
    assert loss_a[-1] < _losses(records_a, [1])[0][0]  # It trains.
    np.testing.assert_allclose(loss_b[0], loss_a[0], rtol=1e-5)
    np.testing.assert_allclose(loss_b, loss_a, rtol=1e-4)

    piped_dir = tmp_path / ("a" if first_pipelined else "b")
    with open(piped_dir / "run_summary.json", encoding="utf-8") as f:
        report = json.load(f)["pipeline"]
    (pipe,) = report["pipelines"]
    assert pipe["path"] == "gpt_trainer.model.decoder.transformer.pipeline"
    assert pipe["schedule"] == "CircularSchedule"
    assert pipe["bubble_fraction"] == pytest.approx(3 / (2 * 4 + 3))
    per_layer = report["stacked_params_per_stage"] // 2  # 2 chunks x 1 layer per stage.
    assert report["stacked_params_per_stage"] * 4 == per_layer * NUM_LAYERS
    assert report["shared_params_per_stage"] == 4096 * 64 + 64  # Embedding + output norm.


@pytest.mark.slow
def test_trainer_fp16_loss_scaling_skips_the_same_steps_pipelined(tmp_path):
    """fp16 with dynamic loss scaling: resumed pipelined at step 3, the same steps are skipped.

    From a loss scale of 2^20, steps 1-5 overflow and are skipped; the pipelined run resumed
    from the unpipelined step-3 checkpoint skips steps 4 and 5 too, then trains like it.
    """
    from axlearn.common.pipeline_checkpoint import convert_trainer_checkpoint

    kw = dict(stack="repeat", fp16=True, checkpoint_every=3)
    a = pipeline_trainer_config(tmp_path / "a", pipelined=False, **kw)
    b = pipeline_trainer_config(tmp_path / "b", pipelined=True, **kw)
    _, records_a = run_trainer(a)
    convert_trainer_checkpoint(a, b, step=3)
    _, records_b = run_trainer(b)
    steps = list(range(4, 11))
    loss_a, skipped_a = _losses(records_a, steps)
    loss_b, skipped_b = _losses(records_b, steps)
    assert skipped_b == skipped_a
    assert skipped_a[0] > _losses(records_a, [3])[1][0]  # Step 4 is skipped.
    assert skipped_a[-1] < 10  # Later steps are applied.
    np.testing.assert_allclose(loss_b, loss_a, rtol=1e-3)
