"""Tests axlearn/common/config/typecheck.py: field values checked against annotations at set()."""

import enum
from collections.abc import Callable, Sequence
from typing import Any, Literal, Optional, Union

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from axlearn.common.config import (
    REQUIRED,
    Configurable,
    InvalidConfigValueError,
    Required,
    config_class,
    config_for_function,
    typecheck,
)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Shape:
    """A plain class used as an annotation (callable, so that it is a valid config value)."""

    def __call__(self):
        return self


class Thing(Configurable):
    @config_class
    class Config(Configurable.Config):
        # Sequence of ints, required.
        dims: Required[Sequence[int]] = REQUIRED
        # Optional list of names.
        names: Optional[Sequence[str]] = None
        # A name or several.
        name_or_names: Union[str, Sequence[str], None] = None
        # Exactly two strings.
        pair: Optional[tuple[str, str]] = None
        # Any number of floats.
        floats: tuple[float, ...] = ()
        # Mapping of name to int.
        table: dict[str, int] = {}
        # One of two words.
        mode: Literal["a", "b"] = "a"
        # A function or a config of one.
        fn: Optional[Callable] = None
        # An enum member.
        color: Optional[Color] = None
        # A plain class instance (or a config that builds one).
        shape: Optional[Shape] = None
        # A number.
        rate: Union[int, float] = 1
        # A dtype.
        dtype: Optional[jnp.dtype] = None
        # Partition spec-like tuple or anything.
        spec: Optional[Sequence[Any]] = None


def _set_ok(**kwargs):
    Thing.default_config().set(**kwargs)


def _set_bad(match: str, **kwargs):
    with pytest.raises(InvalidConfigValueError, match=match):
        Thing.default_config().set(**kwargs)


def test_sequences_and_unions_are_checked():
    _set_ok(dims=[1, 2], names=("a",), name_or_names="x", pair=("a", "b"), floats=(1, 2.5))
    _set_bad(r"\.dims expects Sequence\[int\], got str: 'abc'", dims="abc")
    _set_bad(r"\.dims expects Sequence\[int\], got list: \[1, 'x'\]", dims=[1, "x"])
    # A string is not a sequence of strings (a classic bug: 'abc' would be ['a', 'b', 'c']).
    _set_bad(r"\.names expects Sequence\[str\], got str", names="abc")
    _set_bad(r"\.pair expects tuple\[str, str\], got tuple", pair=("a", "b", "c"))
    _set_bad(r"\.floats expects tuple\[float, \.\.\.\]", floats=(1.0, "x"))
    _set_bad(r"\.name_or_names expects str \| Sequence\[str\], got int: 3", name_or_names=3)


def test_mappings_literals_enums_classes_and_callables():
    _set_ok(table={"a": 1}, mode="b", fn=len, color=Color.RED, shape=Shape())
    _set_ok(color="blue")  # An enum member's value stands for it.
    _set_ok(fn=config_for_function(len), shape=config_for_function(Shape))  # Configs build them.
    _set_bad(r"\.table expects dict\[str, int\], got list", table=[("a", 1)])
    _set_bad(r"\.table expects dict\[str, int\], got dict", table={"a": "1"})
    _set_bad(r"\.mode expects Literal\['a', 'b'\], got str: 'c'", mode="c")
    _set_bad(r"\.fn expects Callable, got str", fn="len")
    _set_bad(r"\.color expects Color, got str: 'green'", color="green")
    _set_bad(r"\.shape expects Shape, got str", shape="square")
    _set_bad(r"\.rate expects int \| float, got bool", rate=True)
    # A config is never accepted where only scalars are.
    _set_bad(r"\.rate expects int \| float, got", rate=config_for_function(len))


def test_numpy_and_jax_values_stay_accepted():
    _set_ok(rate=np.float32(0.5), floats=(np.float64(1.0), np.int32(2)))
    _set_ok(dims=[np.int64(2), np.uint8(3)])
    _set_ok(dtype=jnp.bfloat16)
    assert typecheck.matches(PartitionSpec("data", None), Optional[Sequence[Any]])
    assert typecheck.matches(PartitionSpec("data", ("fsdp", "model")), tuple)
    _set_ok(dtype=np.float32, spec=("data", ("fsdp", "model")))
    _set_bad(r"\.dtype expects dtype, got str: 'not_a_dtype'", dtype="not_a_dtype")


def test_trainer_fields():
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.trainer import SpmdTrainer

    cfg = SpmdTrainer.default_config()
    with pytest.raises(InvalidConfigValueError, match=r"SpmdTrainer.Config\)\.mesh_shape expects"):
        cfg.set(mesh_shape="1,8")
    with pytest.raises(InvalidConfigValueError, match=r"max_step expects int \| float, got str"):
        cfg.set(max_step="ten")
    cfg.set(mesh_shape=(1, -1), max_step=10)
    cfg.set(mesh_shape=[2, 4])


def test_describe_and_unresolvable_hints():
    assert typecheck.describe(Required[Sequence[int]]) == "Sequence[int]"
    assert typecheck.describe(Optional[dict[str, int]]) == "dict[str, int]"
    assert typecheck.matches("anything", Any)
    assert typecheck.matches(3, "NotAName")  # An unresolvable string annotation accepts all.
    assert not typecheck.matches(3, str)
