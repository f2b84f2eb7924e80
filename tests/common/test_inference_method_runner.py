"""Tests of InferenceRunner's AXLearn API: state building, run, create_method_runner.

The model is `tests/common/inference_helpers.LinearModel` (x @ weight + bias); every output is
checked against that product computed with NumPy, on the test process's 8 CPU devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common.checkpointer import CheckpointValidationType
from axlearn.common.inference import InferenceRunner, MethodRunner
from axlearn.common.inference_method_runner import _InferenceRunnerState, host_rows
from axlearn.common.state_builder import (
    EmaParamsConverter,
    RestoreAndConvertBuilder,
    TensorStoreStateStorageBuilder,
)
from axlearn.common.utils import DataPartitionType
from tests.common.inference_helpers import (
    IN_DIM,
    OUT_DIM,
    STEP,
    LinearModel,
    host_params,
    numpy_forward,
    save_trainer_checkpoint,
)

MESH = dict(mesh_shape=(4, 2), mesh_axis_names=("data", "model"))


def _runner_cfg(ckpt_dir=None, **kwargs) -> InferenceRunner.Config:
    cfg = InferenceRunner.default_config().set(
        name="runner", model=LinearModel.default_config(), **MESH, **kwargs
    )
    if ckpt_dir is not None:
        cfg.init_state_builder.set(dir=ckpt_dir)
    return cfg


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    params = host_params(1)
    key = jax.random.PRNGKey(5)
    ckpt_dir = save_trainer_checkpoint(
        str(tmp_path_factory.mktemp("ckpt")), params=params, prng_key=key
    )
    return params, key, ckpt_dir


def _batches(n: int = 3, batch: int = 8) -> list[dict]:
    rng = np.random.default_rng(3)
    return [dict(x=rng.normal(size=(batch, IN_DIM)).astype(np.float32)) for _ in range(n)]


def test_builder_restores_key_and_params_at_construction(ckpt):
    params, key, ckpt_dir = ckpt
    runner = _runner_cfg(ckpt_dir).instantiate(parent=None)
    state = runner.inference_runner_state
    assert isinstance(state, _InferenceRunnerState)
    np.testing.assert_array_equal(np.asarray(state.prng_key), np.asarray(key))
    np.testing.assert_array_equal(
        np.asarray(state.model["linear"]["weight"]), params["linear"]["weight"]
    )
    np.testing.assert_array_equal(
        np.asarray(state.model["linear"]["bias"]), params["linear"]["bias"]
    )
    # The weight is split over "model" as its param_partition_spec says.
    assert state.model["linear"]["weight"].sharding.spec == PartitionSpec(None, "model")
    assert runner.step == STEP
    assert runner.mesh().shape == {"data": 4, "model": 2}


def test_run_outputs_equal_numpy_forward(ckpt):
    params, _, ckpt_dir = ckpt
    runner = _runner_cfg(ckpt_dir).instantiate(parent=None)
    batches = _batches()
    results = list(runner.run(batches, method="predict"))
    assert len(results) == 3
    for batch, result in zip(batches, results):
        np.testing.assert_allclose(
            np.asarray(result["outputs"]), numpy_forward(params, batch["x"]), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_array_equal(np.asarray(result["inputs"]["x"]), batch["x"])
        # FULL input partition: the batch over all 8 devices; BATCH output: over "data".
        assert result["inputs"]["x"].sharding.spec == PartitionSpec(("data", "model"))
        assert result["outputs"].sharding.is_equivalent_to(
            NamedSharding(runner.mesh(), PartitionSpec(("data",), ())), 2
        )
        assert result["module_outputs"] == {}
    # One trace for the three batches.
    assert runner.model.traced_dtypes == [jnp.float32]


def test_inference_dtype_casts_params_and_inputs(ckpt):
    params, _, ckpt_dir = ckpt
    runner = _runner_cfg(ckpt_dir, inference_dtype=jnp.bfloat16).instantiate(parent=None)
    weight = runner.inference_runner_state.model["linear"]["weight"]
    assert weight.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(weight, np.float32),
        params["linear"]["weight"].astype(jnp.bfloat16).astype(np.float32),
    )
    (batch,) = _batches(1)
    (result,) = runner.run([batch], method="predict")
    assert runner.model.traced_dtypes == [jnp.bfloat16]
    assert result["outputs"].dtype == jnp.bfloat16
    # bfloat16 keeps ~3 significant digits.
    np.testing.assert_allclose(
        np.asarray(result["outputs"], np.float32),
        numpy_forward(params, batch["x"]),
        rtol=3e-2,
        atol=5e-2,
    )


def test_model_dtype_bfloat16_restores_float32_checkpoint(ckpt):
    params, _, ckpt_dir = ckpt
    cfg = _runner_cfg(ckpt_dir)
    cfg.model.dtype = jnp.bfloat16
    runner = cfg.instantiate(parent=None)
    weight = runner.inference_runner_state.model["linear"]["weight"]
    assert weight.dtype == jnp.bfloat16  # CONTAINS_STATE_UP_TO_DTYPE by default.


def test_exact_validation_refuses_a_checkpoint_with_more_state(ckpt):
    _, _, ckpt_dir = ckpt
    cfg = _runner_cfg(ckpt_dir)
    cfg.init_state_builder.validation = CheckpointValidationType.EXACT
    with pytest.raises(Exception, match="learner"):
        cfg.instantiate(parent=None)


def test_ema_converter_restores_the_ema_weights(tmp_path):
    params, ema = host_params(1), host_params(2)
    key = jax.random.PRNGKey(9)
    ckpt_dir = save_trainer_checkpoint(str(tmp_path), params=params, prng_key=key, ema_params=ema)
    cfg = _runner_cfg()
    cfg.init_state_builder = RestoreAndConvertBuilder.default_config().set(
        builder=TensorStoreStateStorageBuilder.default_config().set(
            dir=ckpt_dir, validation=CheckpointValidationType.CONTAINS_STATE_UP_TO_DTYPE
        ),
        converter=EmaParamsConverter.default_config(),
    )
    runner = cfg.instantiate(parent=None)
    state = runner.inference_runner_state
    np.testing.assert_array_equal(
        np.asarray(state.model["linear"]["weight"]), ema["linear"]["weight"]
    )
    np.testing.assert_array_equal(np.asarray(state.prng_key), np.asarray(key))
    (batch,) = _batches(1)
    (result,) = runner.run([batch], method="predict")
    np.testing.assert_allclose(
        np.asarray(result["outputs"]), numpy_forward(ema, batch["x"]), rtol=1e-5, atol=1e-5
    )


def test_kept_module_outputs_and_summaries(ckpt):
    params, _, ckpt_dir = ckpt
    runner = _runner_cfg(ckpt_dir).instantiate(parent=None)
    (batch,) = _batches(1)
    method_runner = runner.create_method_runner(
        method="predict", drop_module_outputs=lambda path: path not in ("stats", "stats/x_sum")
    )
    assert isinstance(method_runner, MethodRunner)
    output = method_runner(batch)
    assert isinstance(output, MethodRunner.Output)
    assert list(output.module_outputs) == ["stats"] and list(output.module_outputs["stats"]) == [
        "x_sum"
    ]
    np.testing.assert_allclose(
        float(output.module_outputs["stats"]["x_sum"]),
        batch["x"].astype(np.float64).sum(),
        rtol=1e-5,
    )
    np.testing.assert_allclose(
        float(output.summaries["y_max"]), numpy_forward(params, batch["x"]).max(), rtol=1e-5
    )


def test_prng_key_is_split_per_call(ckpt):
    _, key, ckpt_dir = ckpt
    runner = _runner_cfg(ckpt_dir).instantiate(parent=None)
    batch = dict(x=np.zeros((8, IN_DIM), np.float32))
    method_runner = runner.create_method_runner(method="noisy")
    first = np.asarray(method_runner(batch).output_batch)
    second = np.asarray(method_runner(batch).output_batch)
    # Each call: (next key, this call's key) = split(key); the noise is uniform(this call's key).
    next_key, call_key = jax.random.split(key)
    np.testing.assert_allclose(
        first, np.asarray(jax.random.uniform(call_key, (8, IN_DIM))), rtol=1e-6
    )
    _, call_key2 = jax.random.split(next_key)
    np.testing.assert_allclose(
        second, np.asarray(jax.random.uniform(call_key2, (8, IN_DIM))), rtol=1e-6
    )


def test_passed_state_bypasses_the_builder(ckpt):
    params, _, _ = ckpt
    key = jax.random.PRNGKey(1)
    state = _InferenceRunnerState(prng_key=key, model=jax.tree.map(jnp.asarray, params))
    # The builder's dir does not exist: it is not read when a state is passed.
    runner = _runner_cfg("/nonexistent/step_00000001").instantiate(
        parent=None, inference_runner_state=state
    )
    assert runner.inference_runner_state.model is state.model
    (batch,) = _batches(1)
    (result,) = runner.run([batch], method="predict")
    np.testing.assert_allclose(
        np.asarray(result["outputs"]), numpy_forward(params, batch["x"]), rtol=1e-5, atol=1e-5
    )


def test_abstract_state():
    runner = _runner_cfg("/nonexistent/step_00000001").instantiate(
        parent=None, inference_runner_state=True
    )
    state = runner.inference_runner_state
    assert state.model["linear"]["weight"] == jax.ShapeDtypeStruct((IN_DIM, OUT_DIM), jnp.float32)
    assert isinstance(state.prng_key, jax.ShapeDtypeStruct)


def test_replicated_and_batch_input_partitions(ckpt):
    params, _, ckpt_dir = ckpt
    (batch,) = _batches(1)
    for partition in (DataPartitionType.REPLICATED, DataPartitionType.BATCH):
        runner = _runner_cfg(ckpt_dir, input_batch_partition_spec=partition).instantiate(
            parent=None
        )
        (result,) = runner.run([batch], method="predict")
        np.testing.assert_allclose(
            np.asarray(result["outputs"]), numpy_forward(params, batch["x"]), rtol=1e-5, atol=1e-5
        )


def test_errors(ckpt):
    _, _, ckpt_dir = ckpt
    runner = _runner_cfg(ckpt_dir).instantiate(parent=None)
    with pytest.raises(AttributeError, match="does not have method nonexistent"):
        runner.create_method_runner(method="nonexistent")
    # No checkpointer: restore() says how the state is built instead.
    with pytest.raises(ValueError, match="checkpointer"):
        runner.restore()
    # No builder dir and no state: nothing to run with until restore()/set_params.
    empty = _runner_cfg().instantiate(parent=None)
    with pytest.raises(RuntimeError, match="restore"):
        empty.create_method_runner(method="predict")
    with pytest.raises(ValueError, match="float"):
        _runner_cfg(inference_dtype=jnp.int32).instantiate(parent=None)


def test_host_rows_of_a_sharded_array():
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    sharded = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data", "model")))
    np.testing.assert_array_equal(host_rows(sharded), x)
    np.testing.assert_array_equal(host_rows(x), x)


def test_set_params_casts_to_inference_dtype(ckpt):
    params, _, _ = ckpt
    runner = _runner_cfg(inference_dtype=jnp.bfloat16).instantiate(parent=None)
    runner.set_params(params, step=3)
    weight = runner.inference_runner_state.model["linear"]["weight"]
    assert weight.dtype == jnp.bfloat16 and runner.step == 3
    # The default key when none was restored.
    np.testing.assert_array_equal(
        np.asarray(runner.inference_runner_state.prng_key), np.asarray(jax.random.PRNGKey(0))
    )
