"""Tests of axlearn/common/test_utils.py (AXLearn's testing helpers)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import test_utils
from axlearn.common.layers import Linear
from axlearn.common.module import current_context
from axlearn.common.test_utils import TestCase, Tolerance, assert_allclose


def test_assert_allclose_tolerances_and_message():
    assert_allclose([1.0, 2.0], [1.0, 2.001])  # rtol=1e-3 by default.
    with pytest.raises(AssertionError, match=r"mine: 0\.0099"):
        assert_allclose([1.0, 2.0], [1.0, 2.01], err_msg="mine")
    # Compared as float32: bfloat16 inputs work.
    assert_allclose(jax.numpy.ones(3, jax.numpy.bfloat16), np.ones(3))


class _Case(TestCase):
    def runTest(self):  # pylint: disable=invalid-name
        pass


def test_nested_assertions():
    case = _Case()
    a = {"x": np.ones((2,), np.float32), "y": {"z": 3.0}}
    case.assertNestedAllClose(a, {"x": np.ones((2,), np.float32) + 1e-7, "y": {"z": 3.0}})
    with pytest.raises(AssertionError):
        case.assertNestedAllClose(a, {"x": np.ones((2,), np.int32), "y": {"z": 3.0}})
    with pytest.raises(AssertionError):
        case.assertNestedAllClose(a, {"x": np.ones((2,), np.float32)})
    case.assertNestedEqual({"k": np.arange(3)}, {"k": np.arange(3)})
    with pytest.raises(AssertionError):
        case.assertNestedEqual({"k": np.arange(3)}, {"k": np.arange(3.0)})


def test_all_close_with_outliers():
    case = _Case()
    expected = np.zeros(100)
    actual = expected.copy()
    actual[:3] = 0.05  # 3% outliers.
    case.assertAllCloseWithOutliers(
        actual, expected, tolerance_map={1.0: Tolerance(atol=0.1), 0.95: Tolerance(atol=1e-6)}
    )
    with pytest.raises(AssertionError, match="97.0000% of elements"):
        case.assertAllCloseWithOutliers(
            actual, expected, tolerance_map={0.99: Tolerance(atol=1e-6, rtol=0)}
        )


def test_prng_impl_restores_on_error():
    before = jax.config.jax_default_prng_impl
    other = "rbg" if before != "rbg" else "threefry2x32"
    with pytest.raises(RuntimeError):
        with test_utils.prng_impl(other):
            assert jax.config.jax_default_prng_impl == other
            raise RuntimeError("boom")
    assert jax.config.jax_default_prng_impl == before


def test_platform_and_mesh_helpers(tmp_path):
    assert test_utils.is_supported_platform("cpu")
    assert not test_utils.is_supported_platform("tpu")
    assert test_utils.is_supported_mesh_shape((2, 4))  # conftest sets 8 CPU devices.
    assert not test_utils.is_supported_mesh_shape((3, 3))
    cwd = os.getcwd()
    with test_utils.temp_chdir(str(tmp_path)):
        assert os.getcwd() == str(tmp_path)
    assert os.getcwd() == cwd


def test_clean_hlo_drops_metadata():
    hlo = 'x = f32[] add(a, b), metadata={op_name="jit(f)/add" source_line=12}'
    assert test_utils.clean_hlo(hlo) == "x = f32[] add(a, b), "


def test_test_case_runs_with_fake_data_dir_and_rbg_prng(monkeypatch):
    from axlearn.common.utils import get_data_dir  # pylint: disable=import-outside-toplevel

    monkeypatch.delenv("DATA_DIR", raising=False)
    seen = {}

    class _Probe(TestCase):
        def runTest(self):  # pylint: disable=invalid-name
            seen["data_dir"] = get_data_dir()
            seen["prng"] = jax.config.jax_default_prng_impl

    before = jax.config.jax_default_prng_impl
    result = _Probe().run()
    assert result.wasSuccessful(), result.errors + result.failures
    assert seen == {"data_dir": "FAKE", "prng": "rbg"}
    # Both restored after the test.
    assert get_data_dir() is None and jax.config.jax_default_prng_impl == before


def test_bind_layer_calls_the_layer_with_initialized_parameters():
    cfg = Linear.default_config().set(input_dim=3, output_dim=2)
    with test_utils.bind_layer(cfg, prng_key=jax.random.PRNGKey(7)) as layer:
        params = current_context().state
        x = jnp.arange(3.0)
        np.testing.assert_allclose(
            layer(x), np.asarray(x) @ np.asarray(params["weight"]) + np.asarray(params["bias"])
        )
        assert layer.prng_key is not None and current_context().module is layer
    assert current_context() is None


def test_set_threefry_partitionable():
    before = jax.config.jax_threefry_partitionable

    @test_utils.set_threefry_partitionable(not before)
    def flag():
        return jax.config.jax_threefry_partitionable

    assert flag() == (not before)
    assert jax.config.jax_threefry_partitionable == before


def test_dummy_segments_positions():
    segments, positions = test_utils.dummy_segments_positions(4, 9, num_segments=3)
    segments, positions = np.asarray(segments), np.asarray(positions)
    assert segments.shape == positions.shape == (4, 9)
    assert segments.min() >= 0 and segments.max() < 3
    assert np.all(np.diff(segments, axis=-1) >= 0)
    for row_seg, row_pos in zip(segments, positions):
        count = {}
        for seg, pos in zip(row_seg, row_pos):
            assert pos == count.get(seg, 0)
            count[seg] = pos + 1
    with pytest.raises(ValueError, match="num_segments=0"):
        test_utils.dummy_segments_positions(1, 2, num_segments=0)


def test_take_segment_left_aligns_kept_elements():
    inputs = np.array([[1, 2, 3], [4, 5, 6]])
    mask = np.array([[0, 0, 1], [0, 1, 1]], bool)
    np.testing.assert_array_equal(
        test_utils.take_segment(inputs, mask, pad_value=-100), [[3, -100, -100], [5, 6, -100]]
    )
    # Trailing feature axes move with their positions (NumPy loop reference).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 2)).astype(np.float32)
    m = rng.random((3, 5)) < 0.5
    expected = np.zeros_like(x)
    for b in range(3):
        kept = x[b][m[b]]
        expected[b, : len(kept)] = kept
    np.testing.assert_array_equal(test_utils.take_segment(x, m), expected)


def test_dummy_padding_mask_is_a_prefix_of_drawn_lengths():
    mask = np.asarray(test_utils.dummy_padding_mask(batch_size=64, max_seq_len=5))
    assert mask.shape == (64, 5) and mask.dtype == np.bool_
    lengths = mask.sum(axis=1)
    # Each row: `length` real tokens, then padding; at least one real token.
    np.testing.assert_array_equal(mask, np.arange(5)[None, :] < lengths[:, None])
    assert lengths.min() >= 1 and lengths.max() <= 5 and len(set(lengths.tolist())) > 1
    expected = 1 + np.asarray(jax.random.randint(jax.random.PRNGKey(123), (64,), 0, 5))
    np.testing.assert_array_equal(lengths, expected)
    # The same on every call.
    np.testing.assert_array_equal(mask, test_utils.dummy_padding_mask(batch_size=64, max_seq_len=5))
