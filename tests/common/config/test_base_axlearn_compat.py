"""axlearn/common/config/base.py: behaviours AXLearn's config tests rely on.

`__getattr__` overrides, non-config attributes through inheritance, Hugging Face-style values and
dataclass defaults in dumps.
"""

import dataclasses
from typing import Any, Optional

import pytest

from axlearn.common.config import (
    REQUIRED,
    ConfigBase,
    InvalidConfigValueError,
    NonConfigFieldError,
    Required,
    UnknownFieldError,
    config_class,
    validate_config_field_value,
)


def test_config_class_may_override_getattr_and_set():
    @config_class
    class Lenient(ConfigBase):
        a: Required[int] = REQUIRED

        def __getattr__(self, name: str) -> Any:
            try:
                return super().__getattr__(name)
            except KeyError:  # ConfigBase.__getattr__ raises KeyError for a non-field.
                return "fallback"

        def set(self, **kwargs):
            try:
                return super().set(**kwargs)
            except UnknownFieldError:
                return self

    cfg = Lenient().set(a=1, b=2)
    assert (cfg.a, cfg.b) == (1, "fallback")
    clone = cfg.clone(a=3, b=4)  # clone() goes through the overridden set().
    assert (clone.a, clone.b, cfg.a) == (3, "fallback", 1)

    # Without an override, reading a non-field is an UnknownFieldError (an AttributeError).
    @config_class
    class Strict(ConfigBase):
        a: int = 1

    with pytest.raises(UnknownFieldError, match=r"b \(keys are \['a'\]\)"):
        _ = Strict().b
    assert not hasattr(Strict(), "b")

    # A subclass of the overriding class keeps the override.
    @config_class
    class Child(Lenient):
        c: int = 0

    assert Child().zzz == "fallback"


@config_class
class _Parent(ConfigBase):
    foo: int = 10


def _outside(self):
    return self


class _CallableObject:
    def __call__(self):
        return 1


@pytest.mark.parametrize(
    "value",
    [10, _outside, lambda self: self, _CallableObject()],
    ids=["int", "function", "lambda", "callable_object"],
)
def test_unannotated_override_of_a_field_is_an_error(value):
    with pytest.raises(NonConfigFieldError, match=r"_Child.foo \(annotate it"):
        config_class(type("_Child", (_Parent,), {"foo": value}))


def test_methods_are_not_fields_and_late_attributes_are_caught():
    @config_class
    class WithMethods(_Parent):
        bar: int = 1

        def total(self) -> int:
            return self.foo + self.bar

        @property
        def doubled(self) -> int:
            return 2 * self.bar

        def set(self, **kwargs):
            return super().set(**kwargs)

    cfg = WithMethods().set(bar=3)
    assert (cfg.total(), cfg.doubled) == (13, 6)
    # An attribute assigned to the class after decoration is caught when a config is made.
    WithMethods.late = 1
    with pytest.raises(NonConfigFieldError, match=r"WithMethods\)\.late \(annotate it"):
        WithMethods()


class _HFConfigLike:
    """Mimics a Hugging Face config: a class with `from_pretrained` and `to_dict`."""

    def __init__(self, payload):
        self.payload = payload

    @classmethod
    def from_pretrained(cls, *args):
        del args
        return cls({})

    def to_dict(self):
        return self.payload


def test_hugging_face_like_values_are_validated_by_to_dict():
    validate_config_field_value(_HFConfigLike)
    validate_config_field_value(_HFConfigLike({"hidden_size": 8, "act": "silu"}))
    with pytest.raises(InvalidConfigValueError, match="object"):
        validate_config_field_value(_HFConfigLike({"bad": object()}))


@dataclasses.dataclass
class _Cat:
    name: str
    breed: Optional[str] = None
    adopted: Optional[bool] = True


def test_dataclass_fields_at_an_omitted_default_are_left_out_of_dumps():
    @config_class
    class Shelter(ConfigBase):
        cats: list = [_Cat(name="Ross"), _Cat(name="Kit", breed="tabby", adopted=False)]

    cfg = Shelter()
    assert cfg.debug_string().splitlines() == [
        "cats[0]['name']: 'Ross'",
        "cats[0]['adopted']: True",  # True is a default but not one of the omitted (None/REQUIRED).
        "cats[1]['name']: 'Kit'",
        "cats[1]['breed']: 'tabby'",
        "cats[1]['adopted']: False",
    ]
    assert cfg.to_flat_dict(omit_default_values=set()) == {
        "cats[0]['name']": "Ross",
        "cats[0]['breed']": None,
        "cats[0]['adopted']": True,
        "cats[1]['name']": "Kit",
        "cats[1]['breed']": "tabby",
        "cats[1]['adopted']": False,
    }
