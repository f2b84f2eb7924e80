"""Tests of calling a shared module (`Module._share_with_descendants`) from a descendant."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.config import config_class
from axlearn.common.module import Module, functional


class _Adder(Module):
    def forward(self, x):
        self.add_summary("seen", x)
        return x + self.state["w"]


class _Consumer(Module):
    def forward(self, x):
        return self.get_shared_module("shared").module(x)


class _Owner(Module):
    @config_class
    class Config(Module.Config):
        pass

    def __init__(self, cfg, *, parent):
        super().__init__(cfg, parent=parent)
        self._add_child("adder", _Adder.default_config())
        self._share_with_descendants(self.adder, shared_module_name="shared")
        self._add_child("c1", _Consumer.default_config())
        self._add_child("c2", _Consumer.default_config())

    def forward(self, x):
        return self.c1(x) * 10 + self.c2(x + 1)


def test_shared_module_called_from_descendants():
    root = _Owner.default_config().set(name="root").instantiate(parent=None)
    state = {"adder": {"w": jnp.asarray(3.0)}, "c1": {}, "c2": {}}
    out, col = functional(root, jax.random.PRNGKey(0), state, [jnp.asarray(1.0)], is_training=True)
    np.testing.assert_allclose(out, (1 + 3) * 10 + (2 + 3))
    # Each call runs in a child context named by the shared name under its caller.
    np.testing.assert_allclose(col.summaries["c1"]["shared"]["seen"], 1.0)
    np.testing.assert_allclose(col.summaries["c2"]["shared"]["seen"], 2.0)


def test_shared_module_missing_state():
    root = _Owner.default_config().set(name="root").instantiate(parent=None)
    with pytest.raises(ValueError, match="state does not contain 'adder'"):
        functional(root, None, {"c1": {}, "c2": {}}, [jnp.asarray(1.0)], is_training=True)
