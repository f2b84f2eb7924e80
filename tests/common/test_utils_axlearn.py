"""axlearn/common/utils.py: AXLearn's per_param_dtype_by_path, numeric_checks and data dir."""

import threading

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common import input_tf_data
from axlearn.common.config import TrainerConfigFn, config_for_function
from axlearn.common.utils import (
    PerParamFn,
    TensorSpec,
    check_numerics,
    get_data_dir,
    numeric_checks,
    per_param_dtype_by_path,
    set_data_dir,
)


def test_per_param_dtype_by_path_first_full_match_wins():
    tree = {
        "conv1_weights": jnp.ones((3, 3)),
        "fc1_weights": jnp.ones((2, 2)),
        "head": {"fc2_weights": TensorSpec(shape=(4,), dtype=jnp.float32), "bias": jnp.ones(1)},
    }
    fn = per_param_dtype_by_path(
        jnp.float32, update_rules=[("^fc.*", jnp.bfloat16), ("head/fc.*", jnp.float16)]
    )
    assert isinstance(fn, PerParamFn)
    assert fn(tree) == {
        "conv1_weights": jnp.float32,
        "fc1_weights": jnp.bfloat16,  # "^fc.*" fully matches "fc1_weights".
        # "^fc.*" does not match "head/fc2_weights" (full match from the start); the second does.
        "head": {"fc2_weights": jnp.float16, "bias": jnp.float32},
    }
    # No rules: every parameter gets the default; no default: None (keep the own dtype).
    assert per_param_dtype_by_path(jnp.bfloat16)(tree)["head"]["bias"] == jnp.bfloat16
    assert (
        jax.tree.leaves(per_param_dtype_by_path()(tree), is_leaf=lambda x: x is None) == [None] * 4
    )
    # Configurable as AXLearn's layers configure it.
    cfg = config_for_function(per_param_dtype_by_path).set(
        default_dtype=jnp.float32, update_rules=[(".*bias", jnp.bfloat16)]
    )
    assert cfg.instantiate()({"a": {"bias": 0, "w": 0}}) == {
        "a": {"bias": jnp.bfloat16, "w": jnp.float32}
    }


def test_numeric_checks_context():
    bad = jnp.asarray([1.0, np.nan])
    assert check_numerics(bad) is bad  # Off by default: no check.
    before = jax.config.jax_debug_nans
    with numeric_checks():
        assert jax.config.jax_debug_nans
        with pytest.raises(AssertionError, match="Check numerics layer=ffn"):
            check_numerics(bad, "layer={name}", name="ffn")
        check_numerics(jnp.asarray([0.5, -2.0]))
        with pytest.raises(FloatingPointError):
            jnp.log(jnp.asarray(-1.0)).block_until_ready()  # jax_debug_nans raises on NaN.
        with numeric_checks(False):
            assert check_numerics(bad) is bad
        with pytest.raises(AssertionError):
            check_numerics(bad)  # Restored on exit of the inner context.
    assert jax.config.jax_debug_nans == before
    assert check_numerics(bad) is bad


@pytest.mark.parametrize(
    "outer,inner,conflict",
    [
        ("$DATA_DIR", None, False),
        ("$DATA_DIR", "FAKE", False),
        ("FAKE", None, False),
        ("FAKE", "$DATA_DIR", False),
        ("gs://a", "gs://a", False),
        ("gs://a", "gs://b", True),
    ],
)
def test_set_data_dir_nests_and_conflicts(monkeypatch, outer, inner, conflict):
    monkeypatch.delenv("DATA_DIR", raising=False)
    assert get_data_dir() is None
    with set_data_dir(outer):
        assert get_data_dir() == outer == input_tf_data.get_data_dir()
        if conflict:
            with pytest.raises(ValueError, match=f"set_data_dir conflict: data_dir={inner}"):
                with set_data_dir(inner):
                    pass
        elif inner is not None:
            with set_data_dir(inner):
                assert get_data_dir() == inner
        assert get_data_dir() == outer
    assert get_data_dir() is None


def test_data_dir_env_exception_and_threads(monkeypatch):
    monkeypatch.setenv("DATA_DIR", "FAKE")
    assert get_data_dir() == "FAKE"
    with pytest.raises(RuntimeError):
        with set_data_dir("dir1"):
            assert get_data_dir() == "dir1"
            seen = []
            # The stack is per thread: another thread sees the environment's value.
            thread = threading.Thread(target=lambda: seen.append(get_data_dir()))
            thread.start()
            thread.join()
            assert seen == ["FAKE"]
            raise RuntimeError()
    assert get_data_dir() == "FAKE"  # Popped despite the exception.
    monkeypatch.setenv("DATA_DIR", "")
    assert get_data_dir() is None


def _steps(max_step: int = 10) -> int:
    return max_step


def test_trainer_config_fn_protocol():
    def my_trainer():
        return config_for_function(_steps).set(max_step=3)

    fn: TrainerConfigFn = my_trainer
    assert fn().instantiate() == 3
    assert TrainerConfigFn.__module__ == "axlearn.common.config"
