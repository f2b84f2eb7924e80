"""Tests for axlearn/common/config/paths.py: dotted paths through fields, dict keys and lists."""

from __future__ import annotations

import pytest

from axlearn.common.config import ConfigBase, config_class
from axlearn.common.config.paths import ConfigPathError, lookup_path, replace_path, split_path
from axlearn.common.trainer_config_modifier import find_config, replace_config


@config_class
class _Leaf(ConfigBase):
    n: int = 1


@config_class
class _Root(ConfigBase):
    leaf: _Leaf = _Leaf()
    rules: list = []
    named: dict = {}


def _root():
    return _Root(leaf=_Leaf(n=3), rules=[("a.*", (1, 2)), ("b", _Leaf(n=5))], named={"x": _Leaf()})


def test_lookup_fields_dict_keys_and_list_items():
    root = _root()
    assert lookup_path(root, "leaf.n") == 3
    assert lookup_path(root, "rules.0") == ("a.*", (1, 2))
    assert lookup_path(root, "rules.1.1.n") == 5  # Into a tuple inside the list.
    assert lookup_path(root, "named.x.n") == 1
    # The config modifiers' lookup is the same one (lists included).
    assert find_config(root, "rules.1.1.n") == 5
    assert split_path("a..b.") == ["a", "b"]


@pytest.mark.parametrize(
    "path,message",
    [
        ("leaf.m", "leaf.m: config_class(tests.common.config.test_paths._Leaf) has no field"),
        ("named.y", "named.y: no entry 'y' (entries: ['x'])"),
        ("rules.2", "rules.2: no item '2' in a list of length 2"),
        ("leaf.n.k", "leaf.n.k: cannot look up 'k' in a int"),
        ("", "Empty config path"),
    ],
)
def test_missing_parts_are_named(path, message):
    with pytest.raises(ConfigPathError) as e:
        lookup_path(_root(), path)
    assert str(e.value).startswith(message)
    assert isinstance(e.value, ValueError)


def test_replace_fields_dict_entries_and_list_items():
    root = _root()
    replace_path(root, "leaf.n", 7)
    replace_path(root, "rules.0", ("c", (4,)))
    replace_config(root, "named.x", _Leaf(n=9))
    assert (root.leaf.n, root.rules[0], root.named["x"].n) == (7, ("c", (4,)), 9)
    with pytest.raises(ConfigPathError, match="rules.1.0: cannot set an item of a tuple"):
        replace_path(root, "rules.1.0", "d")
    with pytest.raises(ConfigPathError, match="^leaf.m: .*_Leaf.* has no field 'm'$"):
        replace_path(root, "leaf.m", 1)
