"""Utilities for tests, with AXLearn's names: `TestCase`, `assert_allclose`, `prng_impl`, ...

AXLearn users' unit tests start with

    from axlearn.common.test_utils import TestCase, assert_allclose

and use `absl.testing.parameterized`; this module provides the same entry points:

- `assert_allclose(actual, desired, atol=1e-6, rtol=1e-3, err_msg="")`: compares as float32,
  reporting the max absolute difference.
- `TestCase`: a `parameterized.TestCase` with `assertNestedAllClose`, `assertNestedEqual` and
  `assertAllCloseWithOutliers` (tolerances per fraction of elements, see `Tolerance`). As in
  AXLearn, each test runs with data dir `self.data_dir` ("FAKE") and JAX's "rbg" PRNG (what
  AXLearn's `utils_spmd.setup` selects), so `jax.random` values match AXLearn's expectations;
  both are restored after the test.
- `prng_impl(name)`: a context manager switching `jax_default_prng_impl`.
- `is_supported_platform`, `is_supported_mesh_shape`: whether a test's platform / mesh fits the
  current devices (tests skip themselves when not).
- `TestWithTemporaryCWD`, `temp_chdir`, `DummyForwardModel`, `clean_hlo`, `as_local_tensor`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging
from absl.testing import parameterized
from jax import numpy as jnp

from axlearn.common.base_model import BaseModel
from axlearn.common.config import REQUIRED
from axlearn.common.invocation_context import (
    InvocationContext,
    new_output_collection,
    set_current_context,
)
from axlearn.common.test_utils_params import (  # noqa: F401
    ParamInitSpec,
    ThirdPartyInitializer,
    read_param_init_specs_recursively,
    read_per_param_settings,
)
from axlearn.common.utils import (  # noqa: F401
    Nested,
    NestedTensor,
    Tensor,
    as_tensor,
    flatten_items,
    pop_data_dir,
    push_data_dir,
)

# The PRNG implementation AXLearn's tests run with (its `utils_spmd.setup` selects it).
_AXLEARN_TEST_PRNG_IMPL = "rbg"


def assert_allclose(
    actual: Any, desired: Any, atol: float = 1e-6, rtol: float = 1e-3, err_msg: str = ""
) -> None:
    """Asserts |actual - desired| <= atol + rtol * |desired| elementwise, compared as float32.

    Args:
        actual: The computed value (array-like).
        desired: The expected value (array-like, broadcastable to `actual`).
        atol: Absolute tolerance.
        rtol: Relative tolerance.
        err_msg: Prefix of the failure message (followed by the max absolute difference).

    Raises:
        AssertionError: If the values differ by more than the tolerance.
    """
    actual = np.asarray(jnp.asarray(actual).astype(np.float32))
    desired = np.asarray(jnp.asarray(desired).astype(np.float32))
    diff = np.abs(actual - desired)
    max_diff = diff.max() if diff.size > 0 else diff
    np.testing.assert_allclose(
        actual,
        desired,
        atol=atol,
        rtol=rtol,
        err_msg=f"{err_msg}: {max_diff}.\nactual={actual}\ndesired={desired}",
    )


def assert_not_allclose(
    actual: Any, desired: Any, atol: float = 1e-6, rtol: float = 1e-3, err_msg: str = ""
) -> None:
    """Asserts that `assert_allclose(actual, desired, atol, rtol)` would fail.

    Raises:
        AssertionError: If the arrays are close.
    """
    try:
        assert_allclose(actual, desired, atol=atol, rtol=rtol)
    except AssertionError:
        return
    raise AssertionError(f"Arrays are close (atol={atol}, rtol={rtol}). {err_msg}")


def is_supported_platform(target_platform: str) -> bool:
    """Whether every current device is on `target_platform` ("cpu", "gpu", "tpu").

    Args:
        target_platform: The platform a test needs.

    Returns:
        True if the test can run here (otherwise it should skip).
    """
    platforms = [d.platform for d in jax.devices()]
    supported = all(p == target_platform for p in platforms)
    if not supported:
        logging.info("Skipping test for %s on %s", target_platform, platforms)
    return supported


def is_supported_mesh_shape(mesh_shape: Sequence[int]) -> bool:
    """Whether a mesh of `mesh_shape` uses exactly the current devices.

    Args:
        mesh_shape: The mesh shape a test needs.

    Returns:
        True if `prod(mesh_shape) == jax.device_count()`.
    """
    supported = jax.device_count() == int(np.prod(mesh_shape))
    if not supported:
        logging.info("Skipping mesh_shape=%s with device_count=%s", mesh_shape, jax.device_count())
    return supported


def as_local_tensor(x: Tensor) -> NestedTensor:
    """Returns `x` if it is a jax array.

    Args:
        x: The value.

    Returns:
        `x`.

    Raises:
        NotImplementedError: If `x` is not a jax array.
    """
    if isinstance(x, Tensor):
        return x
    raise NotImplementedError(f"{type(x)}: {x}")


def clean_hlo(hlo: str) -> str:
    """Removes `metadata={...}` attributes (source locations etc.) from HLO text.

    Args:
        hlo: The HLO text.

    Returns:
        The text without metadata, for comparisons that should not depend on source lines.
    """
    escaped_str = r'"(?:[^"\\]|\\\\|\\")*"'
    value = f"(?:{escaped_str}|\\d+)"
    return re.sub(r"metadata=\{(?:\w+=" + value + r"\s*)*\}", "", hlo)


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Tolerances for `TestCase.assertAllCloseWithOutliers`."""

    # Relative tolerance.
    rtol: float = 0.001
    # Absolute tolerance.
    atol: float = 0.001


class TestCase(parameterized.TestCase):
    """Base test class (a `parameterized.TestCase`) with nested-tree assertions.

    Each test runs with `get_data_dir() == self.data_dir` and `jax_default_prng_impl == "rbg"`,
    as AXLearn's `TestCase` sets them up; both are restored in `tearDown`.
    """

    @property
    def data_dir(self) -> str:
        """The data dir tests run with ("FAKE": fake inputs)."""
        return "FAKE"

    def setUp(self):
        super().setUp()
        push_data_dir(self.data_dir)
        self._saved_prng_impl = jax.config.jax_default_prng_impl
        jax.config.update("jax_default_prng_impl", _AXLEARN_TEST_PRNG_IMPL)

    def tearDown(self):
        jax.config.update("jax_default_prng_impl", self._saved_prng_impl)
        popped = pop_data_dir()
        super().tearDown()
        self.assertEqual(popped, self.data_dir)

    def assertNestedAllClose(self, a: Any, b: Any, atol: float = 1e-6, rtol: float = 1e-3):
        """Asserts that two trees have the same paths, and leaves that are all close.

        Array leaves must also agree in dtype and shape; other leaves are compared with
        `assertAlmostEqual`.

        Args:
            a: A tree.
            b: A tree.
            atol: Absolute tolerance.
            rtol: Relative tolerance.
        """
        a_items = sorted(flatten_items(a), key=lambda kv: kv[0])
        b_items = sorted(flatten_items(b), key=lambda kv: kv[0])
        self.assertEqual([k for k, _ in a_items], [k for k, _ in b_items])
        for (name, a_value), (_, b_value) in zip(a_items, b_items):
            if isinstance(a_value, (np.ndarray, jax.Array)) or isinstance(
                b_value, (np.ndarray, jax.Array)
            ):
                a_value, b_value = as_tensor(a_value), as_tensor(b_value)
                self.assertEqual(a_value.dtype, b_value.dtype, msg=name)
                self.assertEqual(a_value.shape, b_value.shape, msg=name)
                assert_allclose(a_value, b_value, atol=atol, rtol=rtol, err_msg=name)
            else:
                self.assertAlmostEqual(a_value, b_value, msg=name)

    def assertNestedEqual(self, a: Any, b: Any):
        """Asserts that two trees have the same paths, and equal leaves of the same dtype.

        Args:
            a: A tree.
            b: A tree.
        """
        a_items, b_items = dict(flatten_items(a)), dict(flatten_items(b))
        self.assertCountEqual(list(a_items), list(b_items))
        for key, a_value in a_items.items():
            b_value = b_items[key]
            np.testing.assert_array_equal(a_value, b_value, err_msg=key)
            if hasattr(a_value, "dtype"):
                self.assertEqual(a_value.dtype, b_value.dtype, msg=key)

    def assertAllCloseWithOutliers(
        self, actual: Any, expected: Any, *, tolerance_map: dict[float, Tolerance]
    ):
        """Asserts closeness with a tolerance per fraction of elements.

        For each (fraction, tolerance) in `tolerance_map`, at least `fraction` of the elements
        must be within `tolerance`, e.g. {1.0: Tolerance(atol=1e-2), 0.95: Tolerance(atol=1e-4)}
        allows 5% of elements to be only within 1e-2.

        Args:
            actual: The computed array.
            expected: The expected array (same shape).
            tolerance_map: Maps a fraction in (0, 1] to a `Tolerance`.
        """
        actual = np.asarray(jnp.asarray(actual).astype(np.float32))
        expected = np.asarray(jnp.asarray(expected).astype(np.float32))
        self.assertEqual(actual.shape, expected.shape)
        diff = np.abs(actual - expected)
        for fraction, tol in tolerance_map.items():
            within = diff <= tol.atol + tol.rtol * np.abs(expected)
            got = float(within.mean()) if within.size else 1.0
            self.assertGreaterEqual(
                got,
                fraction,
                msg=f"Only {got:.4%} of elements are within {tol} (need {fraction:.4%}); "
                f"max diff {diff.max() if diff.size else 0}",
            )


@contextlib.contextmanager
def temp_chdir(new_cwd: str) -> Iterator[None]:
    """Changes the working directory for the duration of the context.

    Args:
        new_cwd: The directory to change to.
    """
    old_cwd = os.getcwd()
    os.chdir(new_cwd)
    try:
        yield
    finally:
        os.chdir(old_cwd)


class TestWithTemporaryCWD(TestCase):
    """Runs each test in a fresh temporary working directory."""

    def run(self, result=None):
        # `_temp_root` (the TemporaryDirectory, as in AXLearn) lets a test name the directory.
        self._temp_root = tempfile.TemporaryDirectory()  # pylint: disable=consider-using-with
        with self._temp_root as root, temp_chdir(os.path.realpath(root)):
            return super().run(result)


@contextlib.contextmanager
def prng_impl(new_prng_impl: str) -> Iterator[None]:
    """Sets `jax_default_prng_impl` (e.g. "rbg", "threefry2x32") for the context.

    Args:
        new_prng_impl: The PRNG implementation name.
    """
    old = jax.config.jax_default_prng_impl
    jax.config.update("jax_default_prng_impl", new_prng_impl)
    try:
        yield
    finally:
        jax.config.update("jax_default_prng_impl", old)


class DummyForwardModel(BaseModel):
    """A model whose `forward` returns (0, input_batch["aux"]); `predict` returns the aux."""

    def forward(self, input_batch: NestedTensor, **kwargs) -> tuple[Tensor, NestedTensor]:
        """Returns a zero loss and `input_batch.get("aux", {})`."""
        del kwargs
        return jnp.zeros([], dtype=jnp.float32), input_batch.get("aux", {})

    def predict(self, input_batch: NestedTensor) -> NestedTensor:
        """Returns `input_batch.get("aux", {})`."""
        return self.forward(input_batch)[1]


def mock_trainer_config(
    input_config: Any,
    model_config: Any,
    mesh_axis_names: Sequence[str] = ("data", "model"),
) -> Any:
    """A small SpmdTrainer config for tests: AdamW on a polynomial schedule, a temporary dir.

    Args:
        input_config: The training input's config.
        model_config: The model's config.
        mesh_axis_names: The mesh axis names; the mesh is (all devices, 1).

    Returns:
        The `SpmdTrainer.Config` (named "mock_trainer_config").
    """
    # Imported here: the trainer imports much of the library, which imports this module.
    # pylint: disable=import-outside-toplevel
    from axlearn.common import optimizers, schedule
    from axlearn.common.config import config_for_function
    from axlearn.common.learner import Learner
    from axlearn.common.trainer import SpmdTrainer

    cfg = SpmdTrainer.default_config()
    cfg.name = "mock_trainer_config"
    cfg.input = input_config
    cfg.dir = tempfile.mkdtemp()
    cfg.mesh_axis_names = mesh_axis_names
    cfg.mesh_shape = (len(jax.devices()), 1)
    cfg.model = model_config
    learning_rate = config_for_function(schedule.polynomial).set(
        begin_step=0, begin_value=1e-5, end_step=200, end_value=1e-7
    )
    cfg.learner = Learner.default_config().set(
        optimizer=config_for_function(optimizers.adamw_optimizer).set(
            learning_rate=learning_rate, b1=0.9, b2=0.999, eps=1e-4
        )
    )
    return cfg


__all__ = [
    "DummyForwardModel",
    "TestCase",
    "TestWithTemporaryCWD",
    "Tolerance",
    "as_local_tensor",
    "assert_allclose",
    "clean_hlo",
    "is_supported_mesh_shape",
    "is_supported_platform",
    "mock_trainer_config",
    "prng_impl",
    "temp_chdir",
]


@contextlib.contextmanager
def set_threefry_partitionable(enabled: bool) -> Iterator[None]:
    """Sets `jax_threefry_partitionable` for the context; also usable as a test decorator.

    Args:
        enabled: The flag's value inside the context.
    """
    old = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", enabled)
    try:
        yield
    finally:
        jax.config.update("jax_threefry_partitionable", old)


@contextlib.contextmanager
def bind_layer(
    cfg, *, is_training: bool = True, prng_key: Any = None, state: Any = None
) -> Iterator[Any]:
    """Instantiates the layer `cfg` and makes it callable inside the context.

    The layer (named "layer" unless `cfg.name` is set) gets a root invocation context with
    `state` (default: parameters initialized from `prng_key`), so `layer(...)`, `layer.prng_key`
    and `current_context()` work as inside `functional(...)`.

    Args:
        cfg: The layer config.
        is_training: The context's training mode.
        prng_key: The context's key (default: PRNGKey(0)); also initializes the parameters.
        state: Optional parameters to use instead of initializing them.

    Yields:
        The layer.
    """
    if getattr(cfg, "name", None) in (None, REQUIRED):
        cfg = cfg.clone(name="layer")
    layer = cfg.instantiate(parent=None)
    if prng_key is None:
        prng_key = jax.random.PRNGKey(0)
    init_key, context_key = jax.random.split(prng_key)
    if state is None:
        state = layer.initialize_parameters_recursively(init_key)
    context = InvocationContext(
        name="root",
        parent=None,
        module=layer,
        state=state,
        is_training=is_training,
        prng_key=context_key,
        output_collection=new_output_collection(),
    )
    with set_current_context(context, require_parent=False):
        yield layer


def dummy_padding_mask(*, batch_size: int, max_seq_len: int) -> Tensor:
    """A padding mask whose rows hold 1 to `max_seq_len` real tokens, then padding.

    The lengths are drawn from `PRNGKey(123)` (as AXLearn's helper draws them), so a test gets the
    same mask on every run. Example (batch_size=3, max_seq_len=3): [[1, 1, 0], [1, 0, 0], ...].

    Args:
        batch_size: The number of rows.
        max_seq_len: The sequence length.

    Returns:
        A bool [batch_size, max_seq_len] mask, True at real tokens (a prefix of each row).
    """
    lengths = 1 + jax.random.randint(
        jax.random.PRNGKey(123), shape=(batch_size,), minval=0, maxval=max_seq_len
    )
    return jnp.arange(max_seq_len)[None, :] < lengths[:, None]


def dummy_segments_positions(
    batch: int, seq_len: int, *, num_segments: int, seed: int = 123
) -> tuple[Tensor, Tensor]:
    """Random packed-sequence segment ids and the positions within each segment.

    Each row's segment ids are non-decreasing values in [0, num_segments) (some ids may be
    absent, i.e. empty segments); positions count 0, 1, ... from the start of each segment.

    Example: segment ids [[0, 1, 1, 1], [1, 1, 2, 2]] have positions [[0, 0, 1, 2], [0, 1, 0, 1]].

    Args:
        batch: Batch size.
        seq_len: Sequence length.
        num_segments: Number of segment ids (>= 1).
        seed: Seed of the NumPy generator drawing the ids.

    Returns:
        (segment_ids, positions), both int32 [batch, seq_len].

    Raises:
        ValueError: If num_segments < 1.
    """
    if num_segments < 1:
        raise ValueError(f"dummy_segments_positions: num_segments={num_segments} must be >= 1.")
    rng = np.random.default_rng(seed)
    segment_ids = np.sort(rng.integers(0, num_segments, size=(batch, seq_len)), axis=-1)
    index = np.arange(seq_len)[None, :]
    starts = np.concatenate(
        [np.ones((batch, 1), dtype=bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=-1
    )
    # Position = index - index of the current segment's first token.
    first = np.maximum.accumulate(np.where(starts, index, 0), axis=-1)
    return jnp.asarray(segment_ids, jnp.int32), jnp.asarray(index - first, jnp.int32)


def take_segment(inputs: Tensor, mask: Tensor, *, pad_value: int = 0) -> Tensor:
    """Left-aligns, per row, the elements of `inputs` where `mask` is True; pads the rest.

    E.g. inputs [[1, 2, 3], [4, 5, 6]], mask [[0, 0, 1], [0, 1, 1]], pad_value -100 give
    [[3, -100, -100], [5, 6, -100]].

    Args:
        inputs: [batch, seq_len, ...].
        mask: Bool [batch, seq_len]: the elements to keep.
        pad_value: The value of the positions after the kept elements.

    Returns:
        A tensor of the shape of `inputs`.
    """
    mask = jnp.asarray(mask, bool)
    seq_len = mask.shape[-1]
    # A stable sort of (not kept) brings the kept positions first, in their order.
    order = jnp.argsort(~mask, axis=-1, stable=True)
    expand = (slice(None), slice(None)) + (None,) * (jnp.ndim(inputs) - 2)
    gathered = jnp.take_along_axis(jnp.asarray(inputs), order[expand], axis=1)
    keep = jnp.arange(seq_len)[None, :] < mask.sum(axis=-1, keepdims=True)
    return jnp.where(keep[expand], gathered, jnp.asarray(pad_value, gathered.dtype))
