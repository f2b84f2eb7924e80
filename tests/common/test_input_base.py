"""Tests axlearn/common/input_base.py."""

from collections.abc import Iterable

import jax
import numpy as np
import pytest

from axlearn.common.config import config_class
from axlearn.common.input_base import Input
from axlearn.common.input_dispatch import InputDispatcher
from axlearn.common.utils import PHYSICAL_TO_LOGICAL_DISPATCH_KEY


class _CountingInput(Input):
    """Per-feed batches of `batch_size` rows counting up from 0."""

    @config_class
    class Config(Input.Config):
        """Configures _CountingInput."""

        batch_size: int = 2  # Rows per per-feed logical batch.
        num_batches: int = 3  # Batches in the dataset.

    def dataset(self) -> Iterable[dict]:
        cfg = self.config
        n = cfg.batch_size
        return [
            {"input_ids": np.arange(i * n, (i + 1) * n, dtype=np.int32)[:, None] + 1}
            for i in range(cfg.num_batches)
        ]

    def element_spec(self) -> dict:
        return {"input_ids": jax.ShapeDtypeStruct((self.config.batch_size, 1), np.int32)}


def _input(**kwargs) -> _CountingInput:
    return _CountingInput.default_config().set(name="input", **kwargs).instantiate(parent=None)


def test_without_dispatcher():
    inp = _input()
    batches = list(inp)
    assert len(batches) == 3
    np.testing.assert_array_equal(batches[1]["input_ids"], [[3], [4]])
    assert inp.element_spec()["input_ids"].shape == (2, 1)
    # No dispatch key: the global batch passes through.
    out = inp.dispatch_global_batch(batches[0])
    np.testing.assert_array_equal(out["input_ids"], [[1], [2]])


def test_with_dispatcher_pads_and_dispatches():
    # Logical 2 on one feed of 8 devices: physical 8 rows, 6 padding rows marked in dispatch.
    inp = _input(input_dispatcher=InputDispatcher.default_config().set(global_logical_batch_size=2))
    batches = list(inp)
    assert len(batches) == 3
    physical = batches[2]
    assert physical["input_ids"].shape == (8, 1)
    np.testing.assert_array_equal(physical["input_ids"][:, 0], [5, 6, 0, 0, 0, 0, 0, 0])
    dispatch = physical[PHYSICAL_TO_LOGICAL_DISPATCH_KEY]
    np.testing.assert_array_equal(dispatch.sum(axis=1), [1, 1, 0, 0, 0, 0, 0, 0])
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    with mesh:
        logical = jax.jit(inp.dispatch_global_batch)(physical)
    np.testing.assert_array_equal(logical["input_ids"], [[5], [6]])
    assert set(logical) == {"input_ids"}


def test_wrong_feed_batch_size():
    inp = _input(
        batch_size=3,
        input_dispatcher=InputDispatcher.default_config().set(global_logical_batch_size=2),
    )
    with pytest.raises(ValueError, match="Expected per-feed batch size to be 2, got: 3"):
        next(iter(inp))


def test_dataset_not_implemented():
    base = Input.default_config().set(name="input").instantiate(parent=None)
    with pytest.raises(NotImplementedError):
        base.dataset()
    with pytest.raises(NotImplementedError):
        base.element_spec()


def test_partition_by_path_rank():
    from jax.sharding import PartitionSpec

    from axlearn.common.input_base import partition_by_path_rank

    fn = partition_by_path_rank(
        {
            ("target_.*", 2): PartitionSpec("data", None),
            (None, 1): PartitionSpec(("data", "fsdp")),
            (None, 2): (("data", "fsdp"), "seq"),  # A tuple of a spec's entries.
        }
    )
    batch = {
        "input_ids": np.zeros((4, 8)),
        "target_labels": np.zeros((4, 8)),
        "target_num_bytes": np.zeros((4,)),
    }
    assert fn(batch) == {
        "input_ids": PartitionSpec(("data", "fsdp"), "seq"),
        "target_labels": PartitionSpec("data", None),
        "target_num_bytes": PartitionSpec(("data", "fsdp")),
    }
    with pytest.raises(ValueError, match=r"no rule for input 'image' of rank 4"):
        fn({"image": np.zeros((2, 3, 4, 5))})


def test_partition_by_path_rank_keys_and_values():
    from jax.sharding import PartitionSpec

    from axlearn.common.input_base import PathAndRank, partition_by_path_rank

    fn = partition_by_path_rank(
        {
            PathAndRank("target_num_.*", None): PartitionSpec.UNCONSTRAINED,
            PathAndRank("input_ids", 2): None,  # Replicated.
            PathAndRank(None, None): PartitionSpec("data"),  # The rest, any rank.
        }
    )
    batch = {
        "input_ids": np.zeros((4, 8)),
        "target_labels": np.zeros((4, 8)),
        "target_num_bytes": np.zeros((4,)),
        "image": np.zeros((4, 2, 2, 3)),
    }
    assert fn(batch) == {
        "input_ids": PartitionSpec(),
        "target_labels": PartitionSpec("data"),
        "target_num_bytes": PartitionSpec.UNCONSTRAINED,
        "image": PartitionSpec("data"),
    }
    with pytest.raises(ValueError, match="No rules matched"):
        partition_by_path_rank({})(batch)


def _sharding_specs(inp, batch, mesh):
    """The PartitionSpecs of dispatch_global_batch's outputs under jit on `mesh`."""
    with jax.set_mesh(mesh):
        out = jax.jit(inp.dispatch_global_batch)(batch)
    return jax.tree.map(lambda x: x.sharding.spec, out)


def test_dispatch_global_batch_partition_spec_and_partitioner():
    from jax.sharding import PartitionSpec

    from axlearn.common.input_base import partition_by_path_rank

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "seq"))
    batch = {"input_ids": np.ones((4, 8), np.int32), "target_num_bytes": np.ones((4,), np.int32)}
    inp = _input(partition_spec=PartitionSpec("data"))
    specs = _sharding_specs(inp, batch, mesh)
    assert specs == {"input_ids": PartitionSpec("data"), "target_num_bytes": PartitionSpec("data")}
    # A partitioner returning specs: input_ids further over seq, target_num_bytes left as is.
    partitioner = partition_by_path_rank(
        {
            (".*", 2): PartitionSpec("data", "seq"),
            ("target_num_bytes", None): PartitionSpec.UNCONSTRAINED,
        }
    )
    inp = _input(partition_spec=PartitionSpec("data"), input_partitioner=partitioner)
    specs = _sharding_specs(inp, batch, mesh)
    assert specs["input_ids"] == PartitionSpec("data", "seq")
    assert specs["target_num_bytes"] == PartitionSpec("data")

    # A partitioner that constrains the batch itself (AXLearn's kind) is used as it is.
    def replicate_ids(b):
        return {**b, "input_ids": jax.lax.with_sharding_constraint(b["input_ids"], PartitionSpec())}

    inp = _input(partition_spec=PartitionSpec("data"), input_partitioner=replicate_ids)
    assert _sharding_specs(inp, batch, mesh)["input_ids"] == PartitionSpec()
    # Values are unchanged by any of this.
    with jax.set_mesh(mesh):
        out = jax.jit(inp.dispatch_global_batch)(batch)
    np.testing.assert_array_equal(out["input_ids"], batch["input_ids"])
    from axlearn.common.config import config_for_function

    with pytest.raises(ValueError, match="input.input_partitioner must be callable"):
        _input(input_partitioner=config_for_function(lambda: 3))


def test_partition_spec_property_and_spmd_dispatcher_gets_the_spec():
    from jax.sharding import PartitionSpec

    from axlearn.common.input_dispatch import SpmdInputDispatcher

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    with jax.set_mesh(mesh):
        assert _input().partition_spec == PartitionSpec(("data", "model"))
        inp = _input(
            batch_size=4,
            partition_spec=PartitionSpec("data"),
            input_dispatcher=SpmdInputDispatcher.default_config().set(global_logical_batch_size=4),
        )
        assert inp.input_dispatcher.config.partition_spec == PartitionSpec("data")
        assert inp.partition_spec == PartitionSpec("data")
        shapes = inp.input_dispatcher.logical_to_physical_shapes(inp.element_spec())
        assert shapes["input_ids"].shape == (4, 1)
        inp = _input(
            batch_size=4,
            partition_spec=PartitionSpec("data"),
            input_dispatcher=InputDispatcher.default_config().set(global_logical_batch_size=4),
        )
        # InputDispatcher pads the feed to the 8 devices.
        shapes = inp.input_dispatcher.logical_to_physical_shapes(inp.element_spec())
        assert shapes["input_ids"].shape == (8, 1)
        assert inp.partition_spec == PartitionSpec(("data", "model"))
