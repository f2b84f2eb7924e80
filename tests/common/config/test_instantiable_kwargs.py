"""axlearn/common/config/instantiable.py: instantiate(**kwargs) and function-config errors."""

import dataclasses
import typing
from typing import Optional

import attr
import numpy as np
import pytest

from axlearn.common.config import (
    Required,
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


def test_array_valued_arguments_are_passed_at_instantiate():
    @dataclasses.dataclass
    class Bias:
        shape: tuple
        target_positions: np.ndarray
        source_positions: Optional[np.ndarray] = None

    cfg = config_for_class(Bias).set(shape=[1, 2])
    target, source = np.asarray([0, 1]), np.asarray([2, 3])
    bias = cfg.instantiate(target_positions=target, source_positions=source)  # Overrides None.
    np.testing.assert_array_equal(bias.source_positions, [2, 3])
    assert bias.shape == [1, 2]
    with pytest.raises(RequiredFieldMissingError, match=r"required field .*: target_positions"):
        cfg.instantiate(source_positions=source)

    def total(axis: int, x: np.ndarray):
        return x.sum(axis=axis)

    x = np.asarray([[0, 1, 3], [2, 5, 7]])
    summed = config_for_function(total).set(axis=0).instantiate(x=x)
    np.testing.assert_array_equal(summed, [2, 6, 10])


def test_var_kwargs_are_overridden_by_instantiate_kwargs():
    def collect(**options):
        return options

    cfg = config_for_function(collect).set(options={"a": 1, "b": 2})
    assert cfg.instantiate() == {"a": 1, "b": 2}
    assert cfg.instantiate(a=3) == {"a": 3, "b": 2}

    def head(first, *rest):
        return [first, *rest]

    cfg = config_for_function(head).set(first=0, rest=[1, 2])
    assert cfg.instantiate() == [0, 1, 2]
    assert cfg.instantiate(first=9) == [9, 1, 2]


def test_function_config_fields_carry_parameter_annotations_unchecked():
    def fn(w: int, x: str, y: typing.Union[int, str], z: Required[float], plain=1):
        return (w, x, y, z, plain)

    cfg = config_for_function(fn)
    types = {f.name: f.type for f in attr.fields(type(cfg))}
    assert typing.get_origin(types.pop("fn")).__name__ == "Callable"
    assert types == dict(w=int, x=str, y=typing.Union[int, str], z=Required[float], plain=None)
    # Annotations document; they do not reject values (a schedule config may stand for a float).
    assert cfg.set(w="not an int", x=1, y=2.5, z=0).instantiate() == ("not an int", 1, 2.5, 0, 1)
    assert typing.get_origin(attr.fields_dict(type(config_for_class(_Pair)))["klass"].type) is type
