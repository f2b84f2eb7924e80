"""Tests of axlearn/common/config.py: semantics, the dump format and every error message."""

from __future__ import annotations

import copy
import dataclasses
import pathlib
import subprocess
import sys
from typing import Any, NamedTuple

import attr
import pytest

from axlearn.common import config
from axlearn.common.config import (
    REQUIRED,
    ConfigBase,
    ConfigModifier,
    Configurable,
    InstantiableConfig,
    InvalidConfigClassError,
    InvalidConfigNameError,
    InvalidConfigValueError,
    MissingConfigClassDecoratorError,
    NonConfigFieldError,
    Required,
    RequiredFieldMissingError,
    UnknownFieldError,
    config_class,
    config_for_class,
    config_for_function,
    get_recursively,
    maybe_instantiate,
    maybe_set_config,
    register_validator,
    set_recursively,
    validate_config_field_value,
)

TESTDATA = pathlib.Path(__file__).parent.parent / "testdata"


# ---- Components used by the tests. ----


class Block(Configurable):
    """A configurable with scalar fields of several kinds."""

    @config_class
    class Config(Configurable.Config):
        hidden: int | None = None  # Hidden size; omitted from dumps while None.
        rate: float = 0.5  # A float field.
        norm: str | None = "rms"  # A non-None default.


class Trainer(Configurable):
    """A configurable holding a tree of other configs."""

    @config_class
    class Config(Configurable.Config):
        name: Required[str] = REQUIRED  # Required; omitted from dumps while unset.
        encoder: Block.Config = Block.default_config()  # A nested config.
        blocks: dict[str, Block.Config] = {}  # A dict of configs.
        schedule: InstantiableConfig | None = None  # A function config.
        mesh_rules: list[tuple[str, Any]] = []  # A list of tuples.
        remat: Any | None = None  # A dataclass value.
        spec: Any | None = None  # A NamedTuple value.
        dtype: Any = None  # A dtype.
        learning_rate: float = 0.1  # A float field that is given an int.
        max_step: int | None = None  # Omitted while None.

    def __init__(self, cfg, **kwargs):
        super().__init__(cfg)
        self.kwargs = kwargs
        self.encoder = cfg.encoder.instantiate()


def warmup(peak: float, steps: int, begin: float = 0.0):
    """A schedule-like function."""
    return lambda step: begin + (peak - begin) * min(step / steps, 1.0)


def policy_fn(names: str, offload: str | None = None):
    """A remat-policy-like function."""
    return (names, offload)


@dataclasses.dataclass
class RematLike:
    prevent_cse: bool = True
    policy: Any = None
    cache: Any = dataclasses.field(default=None, metadata={"skip_serialization": True})


class SpecLike(NamedTuple):
    name: str
    axes: tuple


def _build_tree() -> Trainer.Config:
    import jax.numpy as jnp

    cfg = Trainer.default_config()
    cfg.encoder.set(hidden=512, norm=None)  # Explicit None over a non-None default.
    cfg.blocks = {
        "attn": Block.default_config().set(rate=0.25),
        "ffn": Block.default_config().set(hidden=1024),
    }
    cfg.schedule = config_for_function(warmup).set(peak=0.01, steps=5000)
    cfg.mesh_rules = [("tpu-v4-.*", (1, -1)), ("gpu", (2, 4))]
    cfg.remat = RematLike(
        prevent_cse=False,
        policy=config_for_function(policy_fn).set(names=".*proj"),
        cache="not printed",
    )
    cfg.spec = SpecLike(name="weights", axes=("data", None))
    cfg.dtype = jnp.bfloat16
    cfg.learning_rate = 100  # An int in a float field stays an int.
    return cfg


# ---- The dump format. ----


def test_debug_string_matches_hand_written_text():
    expected = (TESTDATA / "config_tree_expected.txt").read_text().rstrip("\n")
    assert _build_tree().debug_string() == expected


def test_int_in_float_field_is_not_coerced():
    cfg = _build_tree()
    assert type(cfg.learning_rate) is int
    assert "learning_rate: 100\n" in cfg.debug_string()


def test_omit_default_values_none_prints_everything():
    text = Block.default_config().debug_string(omit_default_values=())
    assert text.splitlines() == [
        "hidden: None",
        "klass: 'tests.common.test_config.Block'",
        "norm: 'rms'",
        "rate: 0.5",
    ]


def test_to_flat_dict_and_to_dict():
    cfg = _build_tree()
    flat = cfg.to_flat_dict(omit_default_values=(None, REQUIRED))
    assert flat["encoder.hidden"] == 512
    assert flat["schedule.fn"] is warmup
    assert "name" not in flat and "max_step" not in flat
    nested = cfg.to_dict()
    assert nested["encoder"]["hidden"] == 512
    assert nested["klass"] == "tests.common.test_config.Trainer"
    assert nested["blocks"]["ffn"]["hidden"] == 1024
    assert nested["remat"] == {
        "prevent_cse": False,
        "policy": {"fn": "tests.common.test_config.policy_fn", "names": ".*proj", "offload": None},
    }
    assert nested["spec"] == {"name": "weights", "axes": ("data", None)}


def test_visit_reports_every_leaf_with_exit():
    cfg = Block.default_config()
    leaves, exits = [], []
    cfg.visit(visit_fn=lambda k, v: leaves.append(k), exit_fn=lambda k, v: exits.append(k))
    assert leaves == ["hidden", "klass", "norm", "rate"]
    assert exits == [""]


def test_repr_and_str():
    cfg = Block.default_config().set(hidden=3)
    assert str(cfg) == cfg.debug_string()
    assert repr(cfg) == ("hidden:3; klass:'tests.common.test_config.Block'; norm:'rms'; rate:0.5")


def test_dump_of_attrs_value_enters_fields_in_order():
    @attr.define
    class Pair:
        second: int
        first: int

    cfg = Trainer.default_config().set(remat=Pair(second=2, first=1))
    lines = [line for line in cfg.debug_string().splitlines() if line.startswith("remat")]
    assert lines == ["remat['second']: 2", "remat['first']: 1"]


# ---- Semantics. ----


def test_set_returns_self_and_clone_leaves_original():
    cfg = Block.default_config()
    assert cfg.set(hidden=4) is cfg
    other = cfg.clone(hidden=8)
    assert cfg.hidden == 4 and other.hidden == 8
    assert other != cfg
    assert other.clone(hidden=4) == cfg


def test_keys_items_len_contains():
    cfg = Block.default_config()
    assert cfg.keys() == ["hidden", "klass", "norm", "rate"]
    assert cfg.items()[1] == ("klass", Block)
    assert len(cfg) == 4
    assert "rate" in cfg and "missing" not in cfg


def test_assignment_copies_mutable_values_but_not_callables():
    values = [("a", 1), ("b", 2)]
    cfg = Trainer.default_config().set(mesh_rules=values)
    values.append(("c", 3))
    assert cfg.mesh_rules == [("a", 1), ("b", 2)]
    # Mutable defaults are not shared between instances.
    a, b = Trainer.default_config(), Trainer.default_config()
    a.blocks["x"] = Block.default_config()
    a.encoder.hidden = 7
    assert b.blocks == {} and b.encoder.hidden is None
    # Functions and classes are kept by reference.
    fn_cfg = config_for_function(warmup)
    assert fn_cfg.fn is warmup and copy.deepcopy(fn_cfg).fn is warmup
    assert Block.default_config().klass is Block


def test_instantiate_configurable_and_kwargs():
    cfg = _build_tree().set(name="run")
    obj = cfg.instantiate(lock="shared")
    assert isinstance(obj, Trainer) and obj.kwargs == {"lock": "shared"}
    assert obj.encoder.config.hidden == 512
    # The object holds a copy of its config.
    cfg.encoder.hidden = 1
    assert obj.config.encoder.hidden == 512


def test_config_for_function_fields_and_instantiate():
    cfg = config_for_function(warmup)
    assert cfg.keys() == ["begin", "fn", "peak", "steps"]
    assert cfg.peak is REQUIRED and cfg.begin == 0.0
    fn = cfg.set(peak=1.0, steps=10).instantiate()
    assert fn(5) == pytest.approx(0.5)
    assert maybe_instantiate(cfg)(10) == 1.0
    assert maybe_instantiate(3) == 3


def test_config_for_class():
    class Point:
        def __init__(self, x, y=2, *args, **kwargs):
            self.x, self.y, self.args, self.kwargs = x, y, args, kwargs

    cfg = config_for_class(Point).set(x=1, args=(5,), kwargs={"z": 3})
    point = cfg.instantiate()
    assert (point.x, point.y, point.args, point.kwargs) == (1, 2, (5,), {"z": 3})


def test_maybe_set_config():
    cfg = Block.default_config()
    maybe_set_config(cfg, "hidden", 3)
    maybe_set_config(cfg, "no_such_field", 3)
    maybe_set_config(cfg, rate=0.1, other=1)
    assert cfg.hidden == 3 and cfg.rate == 0.1
    # Fields named like the positional parameters work as keywords.
    fn_cfg = config_for_function(lambda key, value: None)
    maybe_set_config(fn_cfg, key="k", value=2.0)
    assert (fn_cfg.key, fn_cfg.value) == ("k", 2.0)
    with pytest.raises(TypeError, match="takes"):
        maybe_set_config(cfg, "hidden")


def test_get_and_set_recursively():
    cfg = _build_tree()
    assert get_recursively(cfg, "encoder.hidden") == 512
    assert get_recursively(cfg, ["blocks", "ffn", "hidden"]) == 1024
    set_recursively(cfg, path="blocks.attn.rate", new_value=0.75)
    assert cfg.blocks["attn"].rate == 0.75
    assert get_recursively(cfg, "") is cfg
    with pytest.raises(ValueError, match="path must not be empty"):
        set_recursively(cfg, path="", new_value=1)


def test_values_of_many_kinds_are_accepted():
    import jax.numpy as jnp
    import numpy as np

    for value in [
        1,
        1.5,
        "s",
        b"b",
        None,
        REQUIRED,
        jnp.float32,
        np.dtype("int8"),
        np.int32(3),
        (1, [2, {"a": 3}]),
        Block,
        warmup,
        print,
        Block.default_config(),
    ]:
        validate_config_field_value(value)


def test_config_modifiers_chain_and_dump():
    class SetHidden(ConfigModifier):
        @config_class
        class Config(ConfigModifier.Config):
            hidden: Required[int] = REQUIRED  # The hidden size to set.

        def __call__(self, cfg):
            cfg.encoder.hidden = self.config.hidden
            return cfg

    class DoubleRate(ConfigModifier):
        def __call__(self, cfg):
            cfg.encoder.rate *= 2
            return cfg

    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.trainer_config_modifier import ChainConfigModifier

    chain = ChainConfigModifier.default_config().set(
        config_modifiers=[SetHidden.default_config().set(hidden=64), DoubleRate.default_config()]
    )
    result = chain.instantiate()(Trainer.default_config())
    assert result.encoder.hidden == 64 and result.encoder.rate == 1.0
    assert chain.debug_string().splitlines() == [
        "config_modifiers[0].hidden: 64",
        "config_modifiers[0].klass: 'tests.common.test_config.SetHidden'",
        "config_modifiers[1].klass: 'tests.common.test_config.DoubleRate'",
        "klass: 'axlearn.common.trainer_config_modifier.ChainConfigModifier'",
    ]


# ---- Errors and their messages. ----


def test_unknown_field_suggests_close_names():
    cfg = Block.default_config()
    with pytest.raises(UnknownFieldError) as e:
        cfg.hiden = 3
    assert str(e.value) == "config_class(tests.common.test_config.Block.Config): " + (
        "hiden (did you mean: [hidden])"
    )
    with pytest.raises(UnknownFieldError, match=r"did you mean: \[hidden\]"):
        _ = cfg.hidde
    with pytest.raises(
        UnknownFieldError, match=r"xyz \(keys are \['hidden', 'klass', 'norm', 'rate'\]\)"
    ):
        cfg.set(xyz=1)
    # UnknownFieldError is an AttributeError, so hasattr works.
    assert not hasattr(cfg, "xyz")


def test_wrong_type_names_field_and_both_types():
    cfg = Block.default_config()
    with pytest.raises(InvalidConfigValueError) as e:
        cfg.rate = "fast"
    assert str(e.value) == (
        "config_class(tests.common.test_config.Block.Config).rate expects float, got str: 'fast'"
    )
    with pytest.raises(InvalidConfigValueError, match=r"\.hidden expects int, got float: 1.5"):
        cfg.hidden = 1.5
    with pytest.raises(InvalidConfigValueError, match=r"\.hidden expects int, got bool: True"):
        cfg.hidden = True
    with pytest.raises(InvalidConfigValueError, match=r"\.norm expects str, got int: 3"):
        cfg.norm = 3


def test_invalid_value_kind():
    class Opaque:
        __slots__ = ()

        def __repr__(self):
            return "<opaque>"

    with pytest.raises(InvalidConfigValueError) as e:
        Trainer.default_config().set(remat=[Opaque()])
    assert str(e.value) == (
        f'Invalid config value type {Opaque!r} for value "<opaque>". '
        "Consider registering a custom validator with `register_validator`."
    )


def test_register_validator_admits_new_kind():
    class Token:
        def __init__(self, ok):
            self.ok = ok

    def check(value):
        if not value.ok:
            raise InvalidConfigValueError("bad token")

    register_validator(lambda v: isinstance(v, Token), check)
    try:
        Trainer.default_config().set(remat=Token(True))
        with pytest.raises(InvalidConfigValueError, match="bad token"):
            Trainer.default_config().set(remat=Token(False))
    finally:
        config._validators.pop()  # pylint: disable=protected-access


def test_required_field_missing_names_full_paths():
    cfg = Trainer.default_config()
    with pytest.raises(RequiredFieldMissingError) as e:
        cfg.instantiate()
    assert str(e.value) == (
        "Missing value for required field when instantiating tests.common.test_config.Trainer: "
        "name (set it on the config or pass it to instantiate())"
    )
    # Inside a parent's instantiation scope, paths are full and every missing field is named.
    fn_cfg = config_for_function(warmup)
    with config.instantiation_scope("model"), config.instantiation_scope("decoder"):
        with pytest.raises(RequiredFieldMissingError) as e:
            fn_cfg.instantiate()
    assert str(e.value) == (
        "Missing value for required field when instantiating tests.common.test_config.warmup: "
        "model.decoder.peak, model.decoder.steps (set it on the config or pass it to instantiate())"
    )


def test_missing_config_class_decorator():
    class Undecorated(ConfigBase):
        pass

    with pytest.raises(
        MissingConfigClassDecoratorError, match="was not decorated with @config_class"
    ):
        Undecorated()


def test_invalid_config_class():
    with pytest.raises(InvalidConfigClassError) as e:
        config_class(object)
    assert str(e.value) == "A config class must be a subclass of ConfigBase: <class 'object'>"


def test_invalid_config_name():
    with pytest.raises(InvalidConfigNameError) as e:

        @config_class
        class Bad(ConfigBase):
            camelCase: int = 1  # Not lower_snake_case.

    assert str(e.value) == 'Invalid config field name "camelCase"'


def test_non_config_field():
    with pytest.raises(NonConfigFieldError) as e:

        @config_class
        class Bad(ConfigBase):
            ok: int = 1  # A field.
            not_a_field = 2

    assert "Non-config attribute is not supported:" in str(e.value)
    assert str(e.value).endswith(
        "Bad.not_a_field (annotate it, `not_a_field: <type> = ...`, to make it a config field)"
    )


def test_config_does_not_import_tensorflow_or_jax():
    code = (
        "import sys, axlearn.common.config; "
        "bad = [m for m in ('tensorflow', 'seqio', 'jax') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_jax_dots_saveable_policy_dumps_as_its_function_name():
    """JAX's `dots_saveable` (a `DotsSaveable` dataclass instance in newer JAX, a function in
    older JAX and in AXLearn's dumps) dumps under the function's name, as a leaf."""
    from jax.ad_checkpoint import checkpoint_policies as policies

    @config.config_class
    class Remat(config.ConfigBase):
        policy: Any = None  # A remat policy.
        other: Any = None  # Another.

    cfg = Remat(policy=policies.dots_saveable, other=policies.dots_with_no_batch_dims_saveable)
    assert cfg.debug_string().splitlines() == [
        "other: 'jax._src.ad_checkpoint.dot_with_no_batch_dims_saveable'",
        "policy: 'jax._src.ad_checkpoint.dots_saveable'",
    ]
    assert cfg.policy == policies.dots_saveable  # The value itself is unchanged.
