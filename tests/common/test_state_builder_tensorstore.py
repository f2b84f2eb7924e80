"""Tests for axlearn/common/state_builder.py: TensorStore restores into an inference state.

The checkpoints are saved by `tests/common/inference_helpers.save_trainer_checkpoint` (a
TrainerState of a linear model); restored values are compared with the saved NumPy arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from axlearn.common.checkpointer import CheckpointValidationType
from axlearn.common.inference_method_runner import _InferenceRunnerState
from axlearn.common.state_builder import (
    Builder,
    Converter,
    EmaParamsConverter,
    RestoreAndConvertBuilder,
    TensorStoreStateStorageBuilder,
)
from axlearn.common.utils import TensorSpec
from tests.common.inference_helpers import (
    IN_DIM,
    OUT_DIM,
    STEP,
    host_params,
    save_trainer_checkpoint,
)


def _specs(dtype=jnp.float32) -> _InferenceRunnerState:
    def spec(shape, mesh_axes=(None,)):
        return TensorSpec(shape=shape, dtype=dtype, mesh_axes=PartitionSpec(*mesh_axes))

    return _InferenceRunnerState(
        prng_key=TensorSpec(shape=(2,), dtype=jnp.uint32, mesh_axes=PartitionSpec(None)),
        model={
            "linear": {
                "weight": spec((IN_DIM, OUT_DIM), (None, "model")),
                "bias": spec((OUT_DIM,)),
            }
        },
    )


def _restore(builder_cfg, dtype=jnp.float32) -> Builder.State:
    builder = builder_cfg.set(name="builder").instantiate(parent=None)
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with jax.set_mesh(mesh):
        return builder(Builder.State(step=0, trainer_state=_specs(dtype), built_keys=set()))


@pytest.mark.parametrize("by_base_dir", [False, True])
def test_tensorstore_builder_restores_a_subset(tmp_path, by_base_dir):
    params, key = host_params(1), jax.random.PRNGKey(3)
    ckpt_dir = save_trainer_checkpoint(str(tmp_path), params=params, prng_key=key)
    cfg = TensorStoreStateStorageBuilder.default_config().set(
        validation=CheckpointValidationType.CONTAINS_STATE
    )
    if by_base_dir:
        cfg.set(base_dir=str(tmp_path), step=STEP)
    else:
        cfg.set(dir=ckpt_dir)
    built = _restore(cfg)
    assert built.step == STEP
    np.testing.assert_array_equal(np.asarray(built.trainer_state.prng_key), np.asarray(key))
    weight = built.trainer_state.model["linear"]["weight"]
    np.testing.assert_array_equal(np.asarray(weight), params["linear"]["weight"])
    assert weight.sharding.spec == PartitionSpec(None, "model")
    assert built.built_keys == {"prng_key", "model/linear/weight", "model/linear/bias"}


def test_tensorstore_builder_up_to_dtype(tmp_path):
    params = host_params(1)
    ckpt_dir = save_trainer_checkpoint(str(tmp_path), params=params, prng_key=jax.random.PRNGKey(0))
    cfg = TensorStoreStateStorageBuilder.default_config().set(dir=ckpt_dir)
    with pytest.raises(Exception, match="bfloat16|dtype"):
        _restore(cfg.clone(validation=CheckpointValidationType.CONTAINS_STATE), jnp.bfloat16)
    built = _restore(
        cfg.clone(validation=CheckpointValidationType.CONTAINS_STATE_UP_TO_DTYPE), jnp.bfloat16
    )
    bias = built.trainer_state.model["linear"]["bias"]
    assert bias.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(bias, np.float32),
        params["linear"]["bias"].astype(jnp.bfloat16).astype(np.float32),
    )


def test_tensorstore_builder_needs_dir_or_base_dir_and_step():
    for kwargs in ({}, dict(dir="/a/step_00000001", base_dir="/a", step=1), dict(base_dir="/a")):
        cfg = TensorStoreStateStorageBuilder.default_config().set(name="b", **kwargs)
        with pytest.raises(ValueError):
            cfg.instantiate(parent=None)


def test_ema_converter(tmp_path):
    params, ema = host_params(1), host_params(2)
    key = jax.random.PRNGKey(4)
    ckpt_dir = save_trainer_checkpoint(str(tmp_path), params=params, prng_key=key, ema_params=ema)
    cfg = RestoreAndConvertBuilder.default_config().set(
        builder=TensorStoreStateStorageBuilder.default_config().set(
            dir=ckpt_dir, validation=CheckpointValidationType.CONTAINS_STATE
        ),
        converter=EmaParamsConverter.default_config(),
    )
    built = _restore(cfg)
    for name in ("weight", "bias"):
        np.testing.assert_array_equal(
            np.asarray(built.trainer_state.model["linear"][name]), ema["linear"][name]
        )
    np.testing.assert_array_equal(np.asarray(built.trainer_state.prng_key), np.asarray(key))
    # As AXLearn's: the converted state keeps the target's step (not the checkpoint's).
    assert built.step == 0


class _DropBiasConverter(Converter):
    """A converter whose result lacks the bias (to test RestoreAndConvertBuilder's check)."""

    def target_state_type(self):
        return Builder.StateType.TENSOR_SPECS

    def target_to_source(self, target):
        return target, target

    def source_to_target(self, source, aux):
        state = source.trainer_state
        model = {"linear": {"weight": state.model["linear"]["weight"]}}
        return Builder.State(
            step=source.step, trainer_state=state._replace(model=model), built_keys=set()
        )


def test_restore_and_convert_checks_the_paths(tmp_path):
    ckpt_dir = save_trainer_checkpoint(
        str(tmp_path), params=host_params(1), prng_key=jax.random.PRNGKey(0)
    )
    cfg = RestoreAndConvertBuilder.default_config().set(
        builder=TensorStoreStateStorageBuilder.default_config().set(
            dir=ckpt_dir, validation=CheckpointValidationType.CONTAINS_STATE
        ),
        converter=_DropBiasConverter.default_config(),
    )
    with pytest.raises(ValueError, match="model/linear/bias"):
        _restore(cfg)
