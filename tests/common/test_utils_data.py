"""Tests of the data/key helpers in axlearn.common.utils_data (re-exported by utils)."""

from unittest import mock

import jax
import numpy as np
import pytest
from jax import numpy as jnp
from jax.experimental import checkify
from jax.sharding import Mesh, PartitionSpec

from axlearn.common import utils
from axlearn.common.config import maybe_instantiate
from axlearn.common.utils import (
    DataPartitionType,
    PerParamFn,
    StackedKeyArray,
    canonicalize_per_param_dtype,
    cast_floats_per_param,
    data_partition_type_to_spec,
    host_to_global_device_array,
    host_to_global_specs,
    input_partition_spec,
    replicate_to_local_data,
    runtime_checks,
    split_prng_key,
)


def _mesh():
    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def test_partition_specs():
    with _mesh():
        assert input_partition_spec() == PartitionSpec(("data", "model"))
        assert data_partition_type_to_spec(DataPartitionType.FULL) == PartitionSpec(
            ("data", "model")
        )
    assert data_partition_type_to_spec(DataPartitionType.REPLICATED) == PartitionSpec(None)
    spec = {"a": PartitionSpec("x")}
    assert data_partition_type_to_spec(spec) is spec
    with pytest.raises(NotImplementedError, match="Unsupported partition: bad"):
        data_partition_type_to_spec("bad")
    with mock.patch.object(utils, "input_partition_spec", return_value=PartitionSpec("z")):
        assert data_partition_type_to_spec(DataPartitionType.FULL) == PartitionSpec("z")


def test_batch_partition_uses_the_batch_and_seq_axes():
    with Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("fsdp", "seq", "model")):
        assert data_partition_type_to_spec(DataPartitionType.BATCH) == PartitionSpec(
            ("fsdp",), ("seq",)
        )
    with _mesh():
        spec = data_partition_type_to_spec(DataPartitionType.BATCH)
        assert spec == PartitionSpec(("data",), ())
        host = {"x": np.arange(16).reshape(8, 2), "y": np.arange(8)}
        arrays = host_to_global_device_array(host, partition=DataPartitionType.BATCH)
        # Split 4 ways over "data" only: each device holds 2 rows (replicated over "model").
        assert {s.data.shape for s in arrays["x"].addressable_shards} == {(2, 2)}
        assert {s.data.shape for s in arrays["y"].addressable_shards} == {(2,)}
        np.testing.assert_array_equal(np.asarray(arrays["x"]), host["x"])
    with pytest.raises(ValueError, match="needs a mesh"):
        data_partition_type_to_spec(DataPartitionType.BATCH)


def test_host_to_global_and_back():
    host = {"x": np.arange(16).reshape(8, 2), "y": np.arange(4)}
    with _mesh():
        out = host_to_global_device_array(host, partition={"x": PartitionSpec("data"), "y": None})
        assert out["x"].sharding.spec == PartitionSpec("data")
        assert out["y"].sharding.is_fully_replicated
        back = replicate_to_local_data(out)
        np.testing.assert_array_equal(back["x"], host["x"])
        np.testing.assert_array_equal(back["y"], host["y"])
        full = host_to_global_device_array(np.arange(8))
        assert {s.data.shape for s in full.addressable_shards} == {(1,)}  # One row per device.
        specs = host_to_global_specs({"x": jax.ShapeDtypeStruct((8, 2), jnp.int32)})
        # One process feeds everything: the global shape equals the host shape.
        assert specs["x"].shape == (8, 2) and specs["x"].dtype == jnp.int32


def test_split_prng_key_matches_sequential_splits():
    key = jax.random.PRNGKey(3)
    expected, k = [], key
    for _ in range(6):
        k, child = jax.random.split(k)
        expected.append(child)
    stacked = split_prng_key(key, 6)
    assert isinstance(stacked, StackedKeyArray)
    np.testing.assert_array_equal(stacked.keys, np.stack(expected))
    assert split_prng_key(stacked, 6) is stacked
    with pytest.raises(AssertionError, match="5"):
        split_prng_key(stacked, 5)
    two_d = split_prng_key(key, (2, 3))
    assert isinstance(two_d.keys, StackedKeyArray)
    np.testing.assert_array_equal(two_d.keys.keys.reshape(6, -1), np.stack(expected))


def test_per_param_dtypes():
    fn = maybe_instantiate(canonicalize_per_param_dtype(jnp.bfloat16))
    assert isinstance(fn, PerParamFn)
    tree = {"w": jnp.ones(2), "i": jnp.ones(2, jnp.int32)}
    assert fn(tree) == {"w": jnp.bfloat16, "i": jnp.bfloat16}
    out = cast_floats_per_param(tree, {"w": jnp.bfloat16, "i": jnp.bfloat16})
    assert out["w"].dtype == jnp.bfloat16 and out["i"].dtype == jnp.int32
    out = cast_floats_per_param(tree, {"w": None, "i": None})
    assert out["w"].dtype == jnp.float32


def test_runtime_checks():
    def f(x):
        checkify.check(x != 0, "x is zero")
        return 1 / x

    with runtime_checks():
        with pytest.raises(jax.errors.JaxRuntimeError, match="x is zero"):
            jax.block_until_ready(jax.jit(f)(0))
    assert not jax.config.jax_experimental_unsafe_xla_runtime_errors
