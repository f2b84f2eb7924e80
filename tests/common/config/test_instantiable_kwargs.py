"""axlearn/common/config/instantiable.py: instantiate(**kwargs) and function-config errors."""

import pytest

from axlearn.common.config import (
    RequiredFieldMissingError,
    config_for_class,
    config_for_function,
)


def _add(a, b, c=10):
    return a + b + c


class _Pair:
    def __init__(self, x, y=2):
        self.x, self.y = x, y


def test_instantiate_kwargs_fill_required_fields_and_take_precedence():
    cfg = config_for_function(_add).set(a=1)
    assert cfg.instantiate(b=2) == 1 + 2 + 10
    # A keyword given to instantiate() overrides the config's value for that call only.
    assert cfg.instantiate(a=5, b=2) == 5 + 2 + 10
    assert cfg.a == 1
    with pytest.raises(RequiredFieldMissingError, match="b"):
        cfg.instantiate()
    pair = config_for_class(_Pair).instantiate(x=7)
    assert (pair.x, pair.y) == (7, 2)


def test_function_config_parameter_kinds():
    def var_args(*args, scale=1):
        return [a * scale for a in args]

    def var_kwargs(**kwargs):
        return kwargs

    assert config_for_function(var_args).set(args=[1, 2], scale=3).instantiate() == [3, 6]
    assert config_for_function(var_kwargs).set(kwargs={"k": 1}).instantiate() == {"k": 1}

    def uses_fn(fn):
        return fn

    def uses_underscore(_, x):
        return x

    with pytest.raises(ValueError, match="should not have a 'fn' parameter"):
        config_for_function(uses_fn)
    with pytest.raises(ValueError, match="should not have a '_' parameter"):
        config_for_function(uses_underscore)

    def positional_only(x, /, y):
        return x + y

    cfg = config_for_function(positional_only).set(x=1, y=2)
    with pytest.raises(NotImplementedError, match="Unsupported param kind POSITIONAL_ONLY: x"):
        cfg.instantiate()
