"""axlearn/common/config/base.py: value kinds AXLearn accepts, register_validator, path methods."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from axlearn.common import config
from axlearn.common.config import (
    REQUIRED,
    ConfigBase,
    InvalidConfigValueError,
    Required,
    UnknownFieldError,
    config_class,
    config_for_function,
    register_validator,
)
from axlearn.common.layers import Linear


@pytest.fixture(name="restore_validators")
def fixture_restore_validators():
    saved = list(config._validators)  # pylint: disable=protected-access
    yield
    config._validators[:] = saved  # pylint: disable=protected-access


def test_partition_spec_is_a_config_value_and_dumps_stably():
    cfg = Linear.default_config().set(
        name="l", input_dim=2, output_dim=3, param_partition_spec=PartitionSpec("data", None)
    )
    assert cfg.param_partition_spec == PartitionSpec("data", None)
    assert "param_partition_spec: PartitionSpec('data', None)" in cfg.debug_string().splitlines()
    # Nested specs (tuples of axes) and specs inside containers.
    cfg.param_partition_spec = PartitionSpec(("data", "fsdp"), "model")
    assert "PartitionSpec(('data', 'fsdp'), 'model')" in cfg.debug_string()
    fn_cfg = config_for_function(lambda specs: specs).set(specs=[PartitionSpec(None, "model")])
    assert fn_cfg.instantiate() == [PartitionSpec(None, "model")]
    assert cfg.clone().param_partition_spec == cfg.param_partition_spec


def test_tensor_valued_fields():
    cfg = config_for_function(lambda w, b: (w, b)).set(w=np.arange(3), b=jnp.ones((2,)))
    w, b = cfg.instantiate()
    np.testing.assert_array_equal(w, [0, 1, 2])
    np.testing.assert_array_equal(b, [1.0, 1.0])
    lines = cfg.debug_string().splitlines()
    assert "w: array([0, 1, 2])" in lines
    assert "b: array([1., 1.], dtype=float32)" in lines
    # Assignment is by value.
    arr = np.zeros(2)
    cfg.set(w=arr)
    arr[0] = 5
    assert cfg.w[0] == 0


def test_register_validator_runs_on_set_and_instantiate(restore_validators):
    del restore_validators
    seen = []

    def check_positive(v):
        seen.append(v)
        if v < 0:
            raise InvalidConfigValueError(f"negative: {v}")

    register_validator(
        match_fn=lambda v: isinstance(v, int) and not isinstance(v, bool),
        validate_fn=check_positive,
    )

    @config_class
    class Cfg(ConfigBase):
        n: int = 1  # A count.
        items: list = []  # Some ints.

    cfg = Cfg()
    with pytest.raises(InvalidConfigValueError, match="negative: -3"):
        cfg.set(n=-3)
    # In-place mutation escapes set(); instantiate validates again.
    fn_cfg = config_for_function(lambda items: items).set(items=[1, 2])
    fn_cfg.items.append(-7)
    with pytest.raises(InvalidConfigValueError, match="negative: -7"):
        fn_cfg.instantiate()
    assert -3 in seen and -7 in seen


def test_register_validator_admits_custom_kind(restore_validators):
    del restore_validators

    class Token:
        def __init__(self, text):
            self.text = text

    cfg = config_for_function(lambda t: t.text)
    with pytest.raises(InvalidConfigValueError, match="Consider registering a custom validator"):
        cfg.set(t=Token("a"))
    register_validator(match_fn=lambda v: isinstance(v, Token), validate_fn=lambda v: None)
    assert cfg.set(t=Token("a")).instantiate() == "a"


def test_get_and_set_recursively_methods():
    @config_class
    class Inner(ConfigBase):
        dim: Required[int] = REQUIRED  # A dimension.

    @config_class
    class Outer(ConfigBase):
        inner: Inner = Inner()  # The inner config.

    cfg = Outer()
    cfg.set_recursively(["inner", "dim"], value=8)
    assert cfg.get_recursively(["inner", "dim"]) == 8
    assert cfg.get_recursively([]) is cfg
    with pytest.raises(ValueError, match="Path is empty"):
        cfg.set_recursively([], value=1)
    with pytest.raises(UnknownFieldError):
        cfg.get_recursively(["inner", "dmi"])
    # The module-level forms take '.'-separated strings too.
    config.set_recursively(cfg, path="inner.dim", new_value=4)
    assert config.get_recursively(cfg, "inner.dim") == 4
