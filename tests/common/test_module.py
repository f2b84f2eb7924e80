"""Tests of axlearn.common.module: contexts, functional, PRNG derivation, errors, transforms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.config import REQUIRED, Required, RequiredFieldMissingError, config_class
from axlearn.common.module import (
    Module,
    OutputCollection,
    OutputConflictError,
    _generate_seed_from_name,
    child_context,
    current_context,
    functional,
    new_output_collection,
    nowrap,
    scan_in_context,
)


class Leaf(Module):
    """Multiplies by state["w"], adds noise-free summaries and outputs."""

    def forward(self, x):
        self.add_summary("x_mean", jnp.mean(x))
        self.add_module_output("y", x * self.state["w"])
        return x * self.state["w"]

    def key(self):
        return self.prng_key

    @nowrap
    def helper(self):
        return current_context()


class Parent(Module):
    @config_class
    class Config(Module.Config):
        # Child names.
        child_names: tuple = ("a", "b")

    def __init__(self, cfg, *, parent):
        super().__init__(cfg, parent=parent)
        for name in self.config.child_names:
            self._add_child(name, Leaf.default_config())

    def forward(self, x):
        y = self.a(x)
        if "b" in self.children:
            y = y + self.b(x)
        self.add_state_update("count", jnp.array(1))
        return y

    def twice_bad(self, x):
        return self.a(x) + self.a(x)

    def twice_ok(self, x):
        y = self.a(x)
        with child_context("a_again", module=self.a):
            y = y + self.a(x)
        return y

    def child_keys(self):
        return {name: child.key() for name, child in self.children.items()}


def _parent(child_names=("a", "b")):
    cfg = Parent.default_config().set(name="root", child_names=child_names)
    return cfg.instantiate(parent=None)


STATE = {"a": {"w": jnp.array(2.0)}, "b": {"w": jnp.array(3.0)}}


def test_tree_and_paths():
    root = _parent()
    assert root.name == "root" and root.parent is None
    assert list(root.children) == ["a", "b"]
    assert root.a.parent is root
    assert root.a.path() == "root.a"
    with pytest.raises(AttributeError, match="not an attribute or child"):
        _ = root.c


def test_functional_outputs():
    root = _parent()
    x = jnp.arange(3.0)
    out, col = functional(
        root, None, STATE, dict(x=x), is_training=False, drop_output_collections=()
    )
    np.testing.assert_allclose(out, x * 5)
    assert isinstance(col, OutputCollection)
    np.testing.assert_allclose(col.summaries["a"]["x_mean"], 1.0)
    np.testing.assert_allclose(col.module_outputs["b"]["y"], x * 3)
    assert int(col.state_updates["count"]) == 1
    # module_outputs are dropped by default.
    _, col = functional(root, None, STATE, [x], is_training=False)
    assert col.module_outputs == {}
    assert "x_mean" in col.summaries["a"]


def test_calling_child_twice_is_an_error():
    root = _parent()
    with pytest.raises(OutputConflictError, match="child_context"):
        functional(root, None, STATE, dict(x=jnp.ones(2)), method="twice_bad", is_training=False)
    out, col = functional(
        root, None, STATE, dict(x=jnp.ones(2)), method="twice_ok", is_training=False
    )
    np.testing.assert_allclose(out, 4.0)
    assert set(col.summaries) == {"a", "a_again"}


def test_outside_functional_is_an_error():
    root = _parent()
    with pytest.raises(RuntimeError, match="functional"):
        root.a(jnp.ones(2))


def test_nowrap():
    root = _parent()

    def fn():
        return root.a.helper()

    # helper does not enter a's context: the current context stays the root's.
    ctx = fn_in_context(root, fn)
    assert ctx.module is root


def fn_in_context(root, fn):
    from axlearn.common.module import InvocationContext, set_current_context

    ctx = InvocationContext(
        name="root",
        parent=None,
        module=root,
        state=STATE,
        is_training=False,
        prng_key=None,
        output_collection=new_output_collection(),
    )
    with set_current_context(ctx):
        return fn()


def test_child_keys_depend_on_names_only():
    key = jax.random.PRNGKey(7)
    keys_ab, _ = functional(
        _parent(("a", "b")), key, STATE, {}, method="child_keys", is_training=True
    )
    keys_ba, _ = functional(
        _parent(("b", "a")), key, STATE, {}, method="child_keys", is_training=True
    )
    keys_xab, _ = functional(
        _parent(("x", "a", "b")), key, {**STATE, "x": {}}, {}, method="child_keys", is_training=True
    )
    for name in ("a", "b"):
        np.testing.assert_array_equal(keys_ab[name], keys_ba[name])
        np.testing.assert_array_equal(keys_ab[name], keys_xab[name])
        np.testing.assert_array_equal(
            keys_ab[name], jax.random.fold_in(key, _generate_seed_from_name(name))
        )
    assert not np.array_equal(keys_ab["a"], keys_ab["b"])


def test_missing_required_child_field_names_full_path():
    class Inner(Module):
        @config_class
        class Config(Module.Config):
            # A required dim.
            dim: Required[int] = REQUIRED

    class Middle(Module):
        def __init__(self, cfg, *, parent):
            super().__init__(cfg, parent=parent)
            self._add_child("inner", Inner.default_config())

    class Outer(Module):
        def __init__(self, cfg, *, parent):
            super().__init__(cfg, parent=parent)
            self._add_child("middle", Middle.default_config())

    class Root(Module):
        def __init__(self, cfg, *, parent):
            super().__init__(cfg, parent=parent)
            self._add_child("model", Outer.default_config())

    with pytest.raises(RequiredFieldMissingError, match=r"model\.middle\.inner\.dim"):
        Root.default_config().set(name="trainer").instantiate(parent=None)


def test_jit_grad_vmap_scan():
    root = _parent()

    def loss(state, x):
        out, _ = functional(root, None, state, dict(x=x), is_training=True)
        return jnp.sum(out)

    x = jnp.arange(4.0)
    grads = jax.jit(jax.grad(loss))(STATE, x)
    np.testing.assert_allclose(grads["a"]["w"], x.sum())
    np.testing.assert_allclose(jax.vmap(lambda x: loss(STATE, x))(jnp.ones((3, 4))), [20.0] * 3)
    total, _ = jax.lax.scan(lambda c, x: (c + loss(STATE, x), None), 0.0, jnp.ones((3, 4)))
    np.testing.assert_allclose(total, 60.0)


class Looper(Module):
    def __init__(self, cfg, *, parent):
        super().__init__(cfg, parent=parent)
        self._add_child("leaf", Leaf.default_config())

    def forward(self, xs):
        def body(carry, x):
            return carry + self.leaf(x), None

        return scan_in_context(body, carry=jnp.zeros(()), xs=dict(xs=xs))


def test_scan_in_context():
    looper = Looper.default_config().set(name="looper").instantiate(parent=None)
    (carry, _), col = functional(
        looper, None, {"leaf": {"w": jnp.array(2.0)}}, dict(xs=jnp.arange(3.0)), is_training=False
    )
    np.testing.assert_allclose(carry, 6.0)
    np.testing.assert_allclose(col.summaries["iter1"]["leaf"]["x_mean"], 1.0)


def test_add_child_errors():
    from axlearn.common.module import ChildNameConflictError

    class Adder(Module):
        @config_class
        class Config(Module.Config):
            # What to do in __init__.
            case: str = "ok"

        def __init__(self, cfg, *, parent):
            super().__init__(cfg, parent=parent)
            case = self.config.case
            if case == "bad_name":
                self._add_child("Bad-Name", Leaf.default_config())
            elif case == "duplicate":
                self._add_child("a", Leaf.default_config())
                self._add_child("a", Leaf.default_config())
            elif case == "not_module":
                self._add_child("a", Parent.Config)
            elif case == "name_mismatch":
                self._add_child("a", Leaf.default_config().set(name="b"))

    def build(case):
        return Adder.default_config().set(name="root", case=case).instantiate(parent=None)

    with pytest.raises(ValueError, match="Bad-Name"):
        build("bad_name")
    with pytest.raises(ChildNameConflictError, match="a already exists"):
        build("duplicate")
    with pytest.raises(TypeError, match="expects a Module config"):
        build("not_module")
    with pytest.raises(ValueError, match="different name"):
        build("name_mismatch")
    # The caller's config is not modified by _add_child (it is copied).
    cfg = Leaf.default_config()
    root = _parent()
    root._add_child("c", cfg)
    assert cfg.name is REQUIRED


def test_module_output_conflict_and_non_descendant_call():
    class Outputs(Module):
        def __init__(self, cfg, *, parent):
            super().__init__(cfg, parent=parent)
            self._add_child("a", Leaf.default_config())
            self._add_child("b", Leaf.default_config())

        def twice(self):
            self.add_module_output("o", jnp.ones(()))
            self.add_module_output("o", jnp.ones(()))

        def call_sibling(self, x):
            # a calls b directly: b is not a descendant of a.
            with child_context("a"):
                return self.b(x)

    root = Outputs.default_config().set(name="root").instantiate(parent=None)
    with pytest.raises(OutputConflictError, match="'o' already exist"):
        functional(root, None, STATE, {}, method="twice", is_training=False)
    with pytest.raises(ValueError, match="not a descendant"):
        functional(root, None, STATE, dict(x=jnp.ones(1)), method="call_sibling", is_training=False)


def test_functional_does_not_mutate_inputs():
    class Mutator(Module):
        def forward(self, x):
            self.state["w"] = jnp.zeros(())
            x["extra"] = 1
            return self.state["w"]

    module = Mutator.default_config().set(name="m").instantiate(parent=None)
    state = {"w": jnp.ones(())}
    inputs = {"x": {"v": jnp.ones(())}}
    functional(module, None, state, inputs, is_training=False)
    assert float(state["w"]) == 1.0 and set(inputs["x"]) == {"v"}


def test_is_training_and_prng_propagate_and_vmap_over_keys():
    class Noisy(Module):
        def forward(self, x):
            assert self.is_training
            return x + jax.random.normal(self.prng_key, x.shape)

    class Outer(Module):
        def __init__(self, cfg, *, parent):
            super().__init__(cfg, parent=parent)
            self._add_child("noisy", Noisy.default_config())

        def forward(self, x):
            return self.noisy(x)

    outer = Outer.default_config().set(name="outer").instantiate(parent=None)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)

    def run(key):
        return functional(outer, key, {}, dict(x=jnp.zeros(3)), is_training=True)[0]

    outs = jax.jit(jax.vmap(run))(keys)
    assert outs.shape == (4, 3)
    assert len({tuple(np.asarray(o)) for o in outs}) == 4
    # Each row equals the un-vmapped call with the same key.
    np.testing.assert_allclose(outs[2], run(keys[2]), rtol=1e-6)
    # The child's key: fold_in(root key, seed("noisy")).
    expected = jax.random.normal(
        jax.random.fold_in(keys[2], _generate_seed_from_name("noisy")), (3,)
    )
    np.testing.assert_allclose(outs[2], expected, rtol=1e-6)


def test_import_is_free_of_tensorflow_and_seqio():
    import subprocess
    import sys

    code = (
        "import sys; import axlearn.common.module, axlearn.common.base_layer, "
        "axlearn.common.layers; print('tensorflow' in sys.modules, 'seqio' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_summable_protocol():
    from axlearn.common.metrics import WeightedScalar  # pylint: disable=import-outside-toplevel
    from axlearn.common.module import Summable  # pylint: disable=import-outside-toplevel

    class _Adds:
        def __add__(self, other):
            return self

    assert isinstance(WeightedScalar(1.0, 2.0), Summable)
    assert isinstance(_Adds(), Summable) and isinstance(jnp.ones(2), Summable)
    assert not isinstance(object(), Summable) and not isinstance(None, Summable)
    total = WeightedScalar(1.0, 1.0) + WeightedScalar(3.0, 3.0)
    assert float(total.mean) == pytest.approx(2.5) and float(total.weight) == pytest.approx(4.0)
