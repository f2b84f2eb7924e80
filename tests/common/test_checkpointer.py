"""Tests for axlearn/common/checkpointer (core, storage, policies, layout, faults)."""

import json
import logging
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from axlearn.common import checkpointer as ckpt_lib
from axlearn.common.checkpointer import (
    CheckpointCorruptionError,
    Checkpointer,
    InjectedFault,
    StateMismatchError,
    TensorStoreStateStorage,
    every_n_steps_and_last_policy,
    every_n_steps_policy,
    latest_checkpoint_step,
    layout,
    tensorstore_save,
)
from axlearn.common.config import ConfigBase, config_class, config_for_function

TESTDATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "testdata")


def _mesh(shape, names):
    return jax.make_mesh(shape, names, devices=jax.devices()[: int(np.prod(shape))])


def _checkpointer(tmp_path, **kwargs) -> Checkpointer:
    storage = kwargs.pop("storage", TensorStoreStateStorage.default_config())
    cfg = Checkpointer.default_config().set(
        name="checkpointer",
        dir=str(tmp_path / "ckpt"),
        save_policy=config_for_function(every_n_steps_policy).set(n=1),
        storage=storage,
        **kwargs,
    )
    return cfg.instantiate(parent=None)


def _bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.reshape(-1).view(np.uint8) if x.size else x.reshape(-1)


def _assert_bit_identical(expected_tree, actual_tree):
    exp_leaves, exp_def = jax.tree_util.tree_flatten(expected_tree)
    act_leaves, act_def = jax.tree_util.tree_flatten(actual_tree)
    assert exp_def == act_def
    for e, a in zip(exp_leaves, act_leaves):
        if isinstance(e, (int, float, str, bytes)):
            assert type(e) is type(a) and (e == a or (e != e and a != a)), (e, a)
            continue
        assert np.asarray(e).dtype == np.asarray(a).dtype
        assert np.asarray(e).shape == np.asarray(a).shape
        np.testing.assert_array_equal(_bits(e), _bits(a))


def _host_state(seed=0):
    """NumPy values of a state with float32/bfloat16/int32 leaves, scalars and empty arrays."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    w[0, 0], w[0, 1], w[0, 2] = np.nan, -0.0, np.inf  # Bit identity, not just value equality.
    return dict(
        params=dict(
            w=w,
            emb=rng.standard_normal((8, 16)).astype(jnp.bfloat16),
            count=rng.integers(-(2**31), 2**31 - 1, size=(8,), dtype=np.int32),
            scale=np.float32(rng.standard_normal()),
            empty=np.zeros((0, 8), np.float32),
        ),
        prng_key=np.array([1, 2], np.uint32),
        step_count=np.int32(7),
    )


def _device_state(host, mesh):
    specs = dict(
        params=dict(
            w=PartitionSpec(("data", "fsdp")),  # 8-way over rows.
            emb=PartitionSpec("fsdp", "data"),
            count=PartitionSpec(),  # Replicated.
            scale=PartitionSpec(),
            empty=PartitionSpec(None, "fsdp"),
        ),
        prng_key=PartitionSpec(),
        step_count=PartitionSpec(),
    )
    return jax.tree.map(
        lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec)),
        host,
        specs,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def _abstract(tree, sharding_fn):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding_fn(x)), tree
    )


# --------------------------------------------------------------------------------------------
# Config dump and policies.
# --------------------------------------------------------------------------------------------


def test_reference_dump_lines():
    @config_class
    class Holder(ConfigBase):
        checkpointer: ConfigBase = None

    cfg = Checkpointer.default_config().set(
        keep_last_n=3,
        keep_every_n_steps=5000,
        save_policy=config_for_function(every_n_steps_and_last_policy).set(n=5000, max_step=750000),
    )
    got = Holder(checkpointer=cfg).debug_string()
    with open(os.path.join(TESTDATA, "checkpointer_reference_lines.txt"), encoding="utf-8") as f:
        expected = f.read()
    assert got + "\n" == expected
    # Defaults that print are the reference's values.
    assert Checkpointer.default_config().gc_loop_interval_seconds == 60
    assert TensorStoreStateStorage.default_config().timeout_secs == 3600


def test_policies():
    every = every_n_steps_policy(n=5, min_step=10, max_step=30)
    assert [s for s in range(0, 40) if every(step=s, evaler_summaries={})] == [10, 15, 20, 25, 30]
    last = every_n_steps_and_last_policy(n=10, min_step=1, max_step=25)
    assert [s for s in range(0, 40) if last(step=s, evaler_summaries={})] == [10, 20, 25]
    with pytest.raises(ValueError, match="positive"):
        every_n_steps_policy(n=0)


def test_policy_decides_and_force_overrides(tmp_path):
    cfg = Checkpointer.default_config().set(
        name="checkpointer",
        dir=str(tmp_path / "ckpt"),
        save_policy=config_for_function(every_n_steps_policy).set(n=10),
        keep_last_n=5,
    )
    ckpt = cfg.instantiate(parent=None)
    state = dict(x=jnp.arange(4))
    assert ckpt.save(step=3, state=state) is None
    assert ckpt.save(step=10, state=state) is not None
    assert ckpt.save(step=11, state=state, force=True) is not None
    ckpt.stop()
    assert [s for s, _ in ckpt_lib.step_dirs(cfg.dir)] == [10, 11]


def test_committed_step_is_never_rewritten(tmp_path):
    ckpt = _checkpointer(tmp_path)
    ckpt.save(step=5, state=dict(x=jnp.zeros(3)))
    # Same step again, e.g. a preemption save right after the policy's save: skipped.
    assert ckpt.save(step=5, state=dict(x=jnp.ones(3)), force=True) is None
    _, restored = ckpt.restore(state=dict(x=jnp.zeros(3)))
    np.testing.assert_array_equal(np.asarray(restored["x"]), np.zeros(3))
    ckpt.stop()


def test_invalid_config():
    with pytest.raises(ValueError, match="keep_last_n"):
        Checkpointer.default_config().set(name="c", dir="/tmp/x", keep_last_n=0).instantiate(
            parent=None
        )
    with pytest.raises(ValueError, match=r"checkpointer.dir='gs://b/c': only local"):
        Checkpointer.default_config().set(name="checkpointer", dir="gs://b/c").instantiate(
            parent=None
        )
    with pytest.raises(ValueError, match="snapshot"):
        TensorStoreStateStorage.default_config().set(snapshot="disk").instantiate()


# --------------------------------------------------------------------------------------------
# Round trip and resharding.
# --------------------------------------------------------------------------------------------


def test_chunk_files_are_zarr_that_tensorstore_reads_back(tmp_path):
    """The writer writes chunk files itself; TensorStore (an independent reader) must read every
    leaf back bit for bit: sharded float32, bfloat16, bool and a 0-d array."""
    import tensorstore as ts  # pylint: disable=import-outside-toplevel

    mesh = _mesh((4,), ("x",))
    rng = np.random.default_rng(3)
    host = dict(
        rows=rng.standard_normal((12, 3)).astype(np.float32),
        bf16=rng.standard_normal((8, 4)).astype(jnp.bfloat16),
        mask=rng.integers(0, 2, size=(4, 5)).astype(bool),
        scalar=np.float32(2.5),
    )
    specs = dict(rows=PartitionSpec("x"), bf16=PartitionSpec(None, "x"), mask=PartitionSpec())
    state = {
        k: jax.device_put(v, NamedSharding(mesh, specs.get(k, PartitionSpec())))
        for k, v in host.items()
    }
    ckpt = _checkpointer(tmp_path)
    with ckpt:
        ckpt.save(step=1, state=state)
    step_dir = os.path.join(tmp_path, "ckpt", "step_00000001")
    assert sorted(os.listdir(os.path.join(step_dir, layout.ARRAYS_DIR, "rows"))) == [
        ".zarray",
        "0.0",
        "1.0",
        "2.0",
        "3.0",
    ]
    for name, expected in host.items():
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": f"{step_dir}/{layout.ARRAYS_DIR}/{name}"},
        }
        actual = ts.open(spec, open=True).result().read().result()
        assert actual.dtype == expected.dtype and actual.shape == np.shape(expected)
        np.testing.assert_array_equal(actual, expected)
    assert ckpt_lib.verify_checkpoint(step_dir).errors == []
    _, restored = ckpt.restore(state=state)
    _assert_bit_identical(host, restored)


@pytest.mark.parametrize(
    "dtype", ["float32", "bfloat16", "float16", "bool", "int8", "uint8", "int32", "int64"]
)
@pytest.mark.parametrize("shape,chunk_shape", [((), ()), ((0, 4), (0, 4)), ((10, 3), (3, 3))])
def test_zarr_metadata_is_byte_for_byte_what_tensorstore_writes(
    tmp_path, dtype, shape, chunk_shape
):
    """The writer writes each leaf's .zarray itself: it must be the file TensorStore creates."""
    import tensorstore as ts  # pylint: disable=import-outside-toplevel

    from axlearn.common.checkpointer import state_tree  # pylint: disable=import-outside-toplevel

    np_dtype = np.dtype(jnp.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    path = str(tmp_path / "a")
    spec = state_tree.zarr_spec(path, shape=shape, dtype=np_dtype, chunk_shape=chunk_shape)
    ts.open(spec, create=True, open=True).result()
    with open(os.path.join(path, ".zarray"), "rb") as f:
        expected = f.read()
    actual = state_tree.zarr_metadata_json(shape=shape, dtype=np_dtype, chunk_shape=chunk_shape)
    assert actual == expected


def test_edge_chunks_are_padded_as_zarr_stores_them(tmp_path):
    """10 rows in chunks of 3: the last chunk file holds 1 row padded to 3 (zarr v2)."""
    import tensorstore as ts  # pylint: disable=import-outside-toplevel

    from axlearn.common.checkpointer import state_tree  # pylint: disable=import-outside-toplevel
    from axlearn.common.checkpointer.tensorstore_save import (  # pylint: disable=import-outside-toplevel
        write_chunk_file,
    )

    path = str(tmp_path / "a")
    data = np.arange(30, dtype=np.float32).reshape(10, 3)
    spec = state_tree.zarr_spec(path, shape=(10, 3), dtype=data.dtype, chunk_shape=(3, 3))
    ts.open(spec, create=True, open=True).result()
    for i in range(4):
        crc = write_chunk_file(f"{path}/{i}.0", data[3 * i : 3 * i + 3], (3, 3))
        assert crc == state_tree.crc32_hex(data[3 * i : 3 * i + 3])
    assert os.path.getsize(f"{path}/3.0") == 3 * 3 * 4
    np.testing.assert_array_equal(ts.open(spec, open=True).result().read().result(), data)


@pytest.mark.parametrize("snapshot", ["device", "host"])
def test_alias_arrays_saves_without_a_copy(tmp_path, snapshot):
    """alias_arrays=True: the plan holds the caller's arrays (no copy); the save is still exact."""
    host = _host_state()
    state = _device_state(host, _mesh((1, 8), ("data", "fsdp")))
    ckpt = _checkpointer(
        tmp_path, storage=TensorStoreStateStorage.default_config().set(snapshot=snapshot)
    )
    with ckpt:
        stats = ckpt.save(step=3, state=dict(state=state), alias_arrays=True)
        assert stats.snapshot == "reference"
        ckpt.wait_until_finished()
        # The caller's arrays were neither donated nor deleted by the save.
        assert not any(x.is_deleted() for x in jax.tree.leaves(state))
        step, restored = ckpt.restore(state=dict(state=state))
    assert step == 3
    _assert_bit_identical(dict(state=host), restored)


@pytest.mark.parametrize("snapshot", ["device", "host"])
def test_round_trip_bit_identical_and_resharding(tmp_path, snapshot):
    host = _host_state()
    mesh8 = _mesh((1, 8), ("data", "fsdp"))
    state = _device_state(host, mesh8)
    full = dict(state=state, step=12, note="hello", lr=0.5, flag=True, iterator=b"\x00it\xff")
    ckpt = _checkpointer(
        tmp_path, storage=TensorStoreStateStorage.default_config().set(snapshot=snapshot)
    )
    stats = ckpt.save(step=12, state=full)
    assert stats.snapshot == snapshot and stats.async_save
    assert stats.num_bytes > 0 and stats.host_bytes > 0
    assert stats.blocking_s >= stats.snapshot_s + stats.wait_for_previous_s
    result = ckpt.wait_until_finished()
    assert result.step == 12 and result.num_bytes == stats.num_bytes
    assert latest_checkpoint_step(str(tmp_path / "ckpt")) == 12

    # Same shardings: bit-identical, same shardings.
    step, restored = ckpt.restore(state=full)
    assert step == 12
    _assert_bit_identical(dict(full, state=host), dict(restored, state=restored["state"]))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored["state"])):
        assert a.sharding == b.sharding

    # Another mesh: (data=2, fsdp=4), with different partitionings.
    mesh24 = _mesh((2, 4), ("data", "fsdp"))
    target = _abstract(
        state,
        lambda x: NamedSharding(
            mesh24, PartitionSpec("data", "fsdp") if x.ndim == 2 else PartitionSpec()
        ),
    )
    step, restored24 = ckpt.restore(state=dict(full, state=target))
    assert step == 12
    _assert_bit_identical(host, restored24["state"])
    assert restored24["state"]["params"]["w"].sharding.mesh.shape == {"data": 2, "fsdp": 4}

    # One device.
    one = _abstract(state, lambda x: SingleDeviceSharding(jax.devices()[0]))
    _, restored1 = ckpt.restore(state=dict(full, state=one))
    _assert_bit_identical(host, restored1["state"])
    assert all(len(x.sharding.device_set) == 1 for x in jax.tree.leaves(restored1["state"]))

    # Host numpy targets.
    _, restored_np = ckpt.restore(state=dict(full, state=jax.tree.map(np.asarray, host)))
    assert isinstance(restored_np["state"]["params"]["w"], np.ndarray)
    _assert_bit_identical(host, restored_np["state"])
    ckpt.stop()


def test_saved_on_one_device_restored_on_eight(tmp_path):
    host = _host_state(seed=3)
    one = jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]), host)
    ckpt = _checkpointer(tmp_path)
    ckpt.save(step=1, state=one)
    mesh = _mesh((2, 4), ("data", "fsdp"))
    target = _abstract(
        one,
        lambda x: NamedSharding(
            mesh, PartitionSpec(None, ("data", "fsdp")) if x.ndim == 2 else PartitionSpec()
        ),
    )
    _, restored = ckpt.restore(state=target)
    _assert_bit_identical(host, restored)
    ckpt.stop()


def test_layout_and_index(tmp_path):
    mesh = _mesh((1, 8), ("data", "fsdp"))
    state = _device_state(_host_state(), mesh)
    ckpt = _checkpointer(tmp_path)
    ckpt.save(step=5, state=dict(model=state, step=5, iterator=b"abc"))
    ckpt.stop()
    step_dir = tmp_path / "ckpt" / "step_00000005"
    assert sorted(os.listdir(step_dir)) == ["gda", "host", "index", "manifest.json"]
    # The commit marker is AXLearn's list of [path, value] pairs (what its Checkpointer reads);
    # our index, with the checksums, is manifest.json beside it.
    pairs = json.loads((step_dir / "index").read_text())
    assert pairs[0] == ["step", 5]
    pairs = dict(pairs)
    assert pairs["model/params/w"] == {"dtype": "float32", "shape": "(16, 8)"}
    assert pairs["model/params/emb"]["dtype"] == "bfloat16"
    assert pairs["model/params/count"]["shape"] == "(8,)"
    assert pairs["iterator"] == "<class 'axlearn.checkpoint.BytesLeaf'>"
    index = json.loads((step_dir / "manifest.json").read_text())
    assert index["format"] == "axlearn.checkpoint" and index["version"] == 2
    leaves = {leaf["path"]: leaf for leaf in index["leaves"]}
    w = leaves["model/params/w"]
    assert w["dtype"] == "float32" and w["shape"] == [16, 8] and w["chunk_shape"] == [2, 8]
    # One chunk file per shard (8 shards of 2 rows), each with a checksum.
    assert sorted(w["checksum"]["crc32"]) == [f"{i}.0" for i in range(8)]
    chunk_files = sorted(os.listdir(step_dir / "gda" / "model" / "params" / "w"))
    assert chunk_files == [".zarray"] + [f"{i}.0" for i in range(8)]
    assert leaves["model/params/emb"]["dtype"] == "bfloat16"
    assert leaves["step"] == dict(path="step", kind="value", value=5)
    assert leaves["iterator"]["per_process"]["0"]["size"] == 3
    # A replicated leaf is written once.
    assert sorted(leaves["model/params/count"]["checksum"]["crc32"]) == ["0"]


def test_mismatch_names_parameter(tmp_path):
    ckpt = _checkpointer(tmp_path)
    state = dict(a=jnp.zeros((4, 2), jnp.float32), b=jnp.zeros((3,), jnp.int32))
    ckpt.save(step=1, state=state)
    ckpt.wait_until_finished()
    with pytest.raises(
        StateMismatchError,
        match=r"'a': the checkpoint holds float32\[4, 2\], "
        r"the target expects bfloat16\[4, 2\]",
    ):
        ckpt.restore(state=dict(a=jnp.zeros((4, 2), jnp.bfloat16), b=state["b"]))
    with pytest.raises(StateMismatchError, match=r"'b'.*int32\[3\].*int32\[4\]"):
        ckpt.restore(state=dict(a=state["a"], b=jnp.zeros((4,), jnp.int32)))
    with pytest.raises(StateMismatchError, match=r"not in the checkpoint: \['c'\]"):
        ckpt.restore(state=dict(state, c=jnp.zeros(())))
    with pytest.raises(StateMismatchError, match=r"not in the target state: \['b'\]"):
        ckpt.restore(state=dict(a=state["a"]))
    with pytest.raises(ValueError, match="step_00000002"):
        ckpt.restore(step=2, state=state)
    # A changed parameter shape is the first problem listed, before a missing leaf (as a
    # trainer's input_iter would be).
    with pytest.raises(StateMismatchError) as e:
        ckpt.restore(state=dict(a=jnp.zeros((5, 2)), b=state["b"], input_iter=b""))
    assert str(e.value).splitlines()[1].strip().startswith("'a': the checkpoint holds")


def test_unsupported_leaf_and_bad_path(tmp_path):
    ckpt = _checkpointer(tmp_path)
    with pytest.raises(TypeError, match="'bad'.*object"):
        ckpt.save(step=1, state=dict(bad=object()))
    with pytest.raises(ValueError, match="cannot name a checkpoint file"):
        ckpt.save(step=1, state={".hidden": jnp.zeros(())})
    ckpt.stop()


def test_no_checkpoint_returns_input(tmp_path):
    ckpt = _checkpointer(tmp_path)
    state = dict(x=jnp.ones(3))
    step, restored = ckpt.restore(state=state)
    assert step is None and restored is state


# --------------------------------------------------------------------------------------------
# Async saves: donation safety, waiting, errors, sync mode, memory bound.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("snapshot", ["device", "host"])
def test_donation_safety(tmp_path, snapshot):
    mesh = _mesh((2, 4), ("data", "fsdp"))
    sharding = NamedSharding(mesh, PartitionSpec("data", "fsdp"))
    rng = np.random.default_rng(1)
    host = dict(w=rng.standard_normal((64, 256)).astype(np.float32), b=np.arange(8, dtype=np.int32))
    state = jax.tree.map(
        lambda x: jax.device_put(
            x, sharding if x.ndim == 2 else NamedSharding(mesh, PartitionSpec())
        ),
        host,
    )
    update = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
    ckpt = _checkpointer(
        tmp_path, storage=TensorStoreStateStorage.default_config().set(snapshot=snapshot)
    )
    ckpt.save(step=10, state=state)
    old = state
    for _ in range(3):
        state = update(state)
    # The update really consumed (donated) the saved buffers.
    assert all(x.is_deleted() for x in jax.tree.leaves(old))
    ckpt.wait_until_finished()
    _, restored = ckpt.restore(state=state)
    _assert_bit_identical(host, restored)
    np.testing.assert_array_equal(np.asarray(state["b"]), host["b"] + 3)
    # Restored buffers can be donated too, without affecting each other.
    restored = update(restored)
    np.testing.assert_array_equal(np.asarray(restored["w"]), host["w"] + 1)
    for shard in restored["b"].addressable_shards:  # Every replica, not just the first.
        np.testing.assert_array_equal(np.asarray(shard.data), host["b"] + 1)
    ckpt.stop()


def test_wait_for_previous_is_measured(tmp_path, monkeypatch):
    real_write = tensorstore_save.write_snapshot

    def slow_write(*args, **kwargs):
        time.sleep(0.5)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(tensorstore_save, "write_snapshot", slow_write)
    ckpt = _checkpointer(tmp_path)
    state = dict(x=jnp.ones((4, 4)))
    first = ckpt.save(step=1, state=state)
    assert first.wait_for_previous_s < 0.1 and first.blocking_s < 0.4
    second = ckpt.save(step=2, state=state)
    assert second.wait_for_previous_s > 0.3
    assert second.blocking_s >= second.wait_for_previous_s
    # At most one save in flight: step 1 was committed before step 2's snapshot.
    assert ckpt_lib.is_committed(ckpt.ckpt_dir(1))
    ckpt.stop()
    assert latest_checkpoint_step(ckpt.config.dir) == 2


def test_sync_save_commits_before_returning(tmp_path):
    ckpt = _checkpointer(tmp_path, async_save=False)
    stats = ckpt.save(step=4, state=dict(x=jnp.ones(3)))
    assert not stats.async_save
    assert ckpt_lib.is_committed(ckpt.ckpt_dir(4))
    assert ckpt.wait_until_finished() is None


def test_host_memory_is_bounded_and_reported(tmp_path):
    mesh = _mesh((8,), ("x",))
    sharding = NamedSharding(mesh, PartitionSpec("x"))
    state = {
        f"p{i}": jax.device_put(jnp.full((64, 128), i, jnp.float32), sharding) for i in range(6)
    }  # 6 x 32 KiB, chunks of 4 KiB.
    budget = 10_000
    storage = TensorStoreStateStorage.default_config().set(
        snapshot="device", max_concurrent_gb=budget / 1e9
    )
    ckpt = _checkpointer(tmp_path, storage=storage)
    stats = ckpt.save(step=1, state=state)
    assert stats.num_bytes == 6 * 64 * 128 * 4
    assert stats.host_bytes == budget
    result = ckpt.wait_until_finished()
    chunk = 8 * 128 * 4
    assert 0 < result.peak_host_bytes <= budget + chunk
    host_storage = TensorStoreStateStorage.default_config().set(snapshot="host")
    ckpt2 = _checkpointer(tmp_path / "h", storage=host_storage)
    stats = ckpt2.save(step=1, state=state)
    assert stats.host_bytes == stats.num_bytes  # The whole snapshot is on the host.
    ckpt2.stop()
    _, restored = ckpt.restore(state=state)
    _assert_bit_identical(jax.tree.map(np.asarray, state), restored)


def test_async_error_is_raised_on_next_call(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt_lib.FAULT_ENV, "after_arrays@2")
    monkeypatch.setenv(ckpt_lib.FAULT_ACTION_ENV, "raise")
    ckpt = _checkpointer(tmp_path)
    state = dict(x=jnp.ones(3))
    ckpt.save(step=1, state=state)
    ckpt.save(step=2, state=state)
    with pytest.raises(InjectedFault, match="after_arrays of step 2"):
        ckpt.wait_until_finished()
    assert not ckpt_lib.is_committed(ckpt.ckpt_dir(2))
    assert latest_checkpoint_step(ckpt.config.dir) == 1
    ckpt.stop()


# --------------------------------------------------------------------------------------------
# Commit marker and corruption.
# --------------------------------------------------------------------------------------------


def _saved(tmp_path, steps=(1,)):
    ckpt = _checkpointer(tmp_path, keep_last_n=10)
    mesh = _mesh((8,), ("x",))
    state = dict(
        w=jax.device_put(
            jnp.arange(32, dtype=jnp.float32).reshape(8, 4), NamedSharding(mesh, PartitionSpec("x"))
        ),
        it=b"iterator",
    )
    for step in steps:
        ckpt.save(step=step, state=state)
    ckpt.wait_until_finished()
    return ckpt, state


def test_truncated_chunk_names_file_and_leaf(tmp_path):
    ckpt, state = _saved(tmp_path)
    chunk = os.path.join(ckpt.ckpt_dir(1), "gda", "w", "3.0")
    with open(chunk, "r+b") as f:
        f.truncate(5)
    with pytest.raises(CheckpointCorruptionError, match=rf"{chunk}.*leaf 'w'"):
        ckpt.restore(state=state)


def test_altered_chunk_names_file_and_leaf(tmp_path):
    ckpt, state = _saved(tmp_path)
    chunk = os.path.join(ckpt.ckpt_dir(1), "gda", "w", "5.0")
    with open(chunk, "r+b") as f:
        f.seek(3)
        byte = f.read(1)
        f.seek(3)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CheckpointCorruptionError, match=rf"{chunk} of leaf 'w' does not match"):
        ckpt.restore(state=state)


def test_missing_chunk_and_bytes_file(tmp_path):
    ckpt, state = _saved(tmp_path)
    chunk = os.path.join(ckpt.ckpt_dir(1), "gda", "w", "0.0")
    os.remove(chunk)
    with pytest.raises(CheckpointCorruptionError, match=rf"{chunk} of leaf 'w' is missing"):
        ckpt.restore(state=state)
    ckpt2, state2 = _saved(tmp_path / "b")
    bytes_file = os.path.join(ckpt2.ckpt_dir(1), "host", "process_0", "it")
    with open(bytes_file, "wb") as f:
        f.write(b"iteratoR")
    with pytest.raises(CheckpointCorruptionError, match=rf"{bytes_file} of leaf 'it'"):
        ckpt2.restore(state=state2)


def test_uncommitted_skipped_with_warning_corrupt_index_refused(tmp_path, caplog):
    ckpt, state = _saved(tmp_path, steps=(1, 2))
    base = ckpt.config.dir
    # step 3: a copy of step 2 without its index (an interrupted save).
    shutil.copytree(ckpt.ckpt_dir(2), os.path.join(base, "step_00000003"))
    os.remove(os.path.join(base, "step_00000003", "index"))
    # step 2: garbage index: a corrupt checkpoint, not an uncommitted one (see
    # test_checkpointer_recovery.py for the fallback and restore_step choices).
    with open(os.path.join(ckpt.ckpt_dir(2), "index"), "w", encoding="utf-8") as f:
        f.write("{not json")
    with caplog.at_level(logging.WARNING), pytest.raises(ckpt_lib.CorruptCheckpointError):
        ckpt.restore(state=state)
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "step_00000003" in messages and "uncommitted" in messages
    assert os.path.isdir(ckpt.ckpt_dir(2))
    assert ckpt.restore(state=state, step=1)[0] == 1


# --------------------------------------------------------------------------------------------
# Garbage collection.
# --------------------------------------------------------------------------------------------


def test_gc_keeps_last_n_and_every_n(tmp_path):
    ckpt = _checkpointer(tmp_path, keep_last_n=2, keep_every_n_steps=10)
    state = dict(x=jnp.ones(2))
    for step in range(1, 26):
        ckpt.save(step=step, state=state)
    ckpt.stop()
    ckpt.run_garbage_collection()
    assert [s for s, _ in ckpt_lib.step_dirs(ckpt.config.dir)] == [10, 20, 24, 25]


def test_gc_removes_abandoned_partial_dir_after_newer_commit(tmp_path, monkeypatch):
    ckpt = _checkpointer(tmp_path, keep_last_n=3)
    state = dict(x=jnp.ones((8, 2)), it=b"x")
    ckpt.save(step=4, state=state)
    monkeypatch.setenv(ckpt_lib.FAULT_ENV, "mid_arrays@5")
    monkeypatch.setenv(ckpt_lib.FAULT_ACTION_ENV, "raise")
    ckpt.save(step=5, state=state)
    with pytest.raises(InjectedFault):
        ckpt.wait_until_finished()
    partial = ckpt.ckpt_dir(5)
    assert os.path.isdir(partial) and not ckpt_lib.is_committed(partial)
    # Newer than the newest committed step: not abandoned yet (GC keeps it).
    assert ckpt.run_garbage_collection() == []
    monkeypatch.delenv(ckpt_lib.FAULT_ENV)
    ckpt.save(step=6, state=state)
    ckpt.wait_until_finished()
    assert not os.path.exists(partial)
    assert [s for s, _ in ckpt_lib.step_dirs(ckpt.config.dir)] == [4, 6]
    ckpt.stop()


def test_gc_never_removes_dir_being_written(tmp_path, monkeypatch):
    ckpt = _checkpointer(tmp_path, keep_last_n=1)
    state = dict(x=jnp.ones(2))
    ckpt.save(step=1, state=state)
    ckpt.wait_until_finished()
    os.makedirs(os.path.join(ckpt.config.dir, "step_00000000"))  # Old partial dir.
    monkeypatch.setattr(ckpt.storage, "writing_dir", lambda: ckpt.ckpt_dir(0))
    assert ckpt.run_garbage_collection() == []
    ckpt.stop()


def test_gc_thread_runs(tmp_path):
    ckpt = _checkpointer(tmp_path, keep_last_n=1, gc_loop_interval_seconds=0.05)
    state = dict(x=jnp.ones(2))
    with ckpt:
        ckpt.save(step=1, state=state)
        ckpt.wait_until_finished()
        os.makedirs(os.path.join(ckpt.config.dir, "step_00000000"))
        deadline = time.time() + 5
        while os.path.exists(os.path.join(ckpt.config.dir, "step_00000000")):
            assert time.time() < deadline
            time.sleep(0.05)
    assert ckpt_lib.is_committed(ckpt.ckpt_dir(1))


# --------------------------------------------------------------------------------------------
# Fault-injection hook.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ckpt_lib.FAULT_POINTS)
def test_fault_points_leave_expected_state(tmp_path, monkeypatch, point):
    ckpt = _checkpointer(tmp_path, keep_last_n=5)
    state = dict(x=jnp.arange(16.0).reshape(8, 2))
    ckpt.save(step=1, state=state)
    ckpt.wait_until_finished()
    monkeypatch.setenv(ckpt_lib.FAULT_ENV, f"{point}@2")
    monkeypatch.setenv(ckpt_lib.FAULT_ACTION_ENV, "raise")
    ckpt.save(step=2, state=state)
    with pytest.raises(InjectedFault, match=point):
        ckpt.wait_until_finished()
    expected = 2 if point == "after_index" else 1
    assert latest_checkpoint_step(ckpt.config.dir) == expected
    step, restored = ckpt.restore(state=state)
    assert step == expected
    np.testing.assert_array_equal(np.asarray(restored["x"]), np.asarray(state["x"]))


def test_fault_env_validation(monkeypatch):
    from axlearn.common.checkpointer import faults  # pylint: disable=import-outside-toplevel

    monkeypatch.setenv(ckpt_lib.FAULT_ENV, "nowhere")
    with pytest.raises(ValueError, match="point must be one of"):
        faults.configured_fault()
    monkeypatch.setenv(ckpt_lib.FAULT_ENV, "mid_arrays@x")
    with pytest.raises(ValueError, match="must be an integer"):
        faults.configured_fault()
    monkeypatch.setenv(ckpt_lib.FAULT_ENV, "mid_arrays@3")
    monkeypatch.setenv(ckpt_lib.FAULT_ACTION_ENV, "explode")
    with pytest.raises(ValueError, match="must be one of"):
        faults.configured_fault()
    monkeypatch.setenv(ckpt_lib.FAULT_ACTION_ENV, "hang")
    assert faults.configured_fault() == ("mid_arrays", 3, "hang")


def test_restore_into_tensor_specs_and_state_spec(tmp_path):
    from axlearn.common.utils import TensorSpec  # pylint: disable=import-outside-toplevel

    mesh = _mesh((2, 4), ("data", "fsdp"))
    host = dict(w=np.arange(64, dtype=np.float32).reshape(8, 8), b=np.arange(4, dtype=np.int32))
    ckpt = _checkpointer(tmp_path)
    ckpt.save(step=3, state=jax.tree.map(jnp.asarray, host))
    ckpt.wait_until_finished()
    specs = dict(
        w=TensorSpec(shape=(8, 8), dtype=jnp.float32, mesh_axes=PartitionSpec("fsdp", "data")),
        b=TensorSpec(shape=(4,), dtype=None, mesh_axes=PartitionSpec()),
    )
    with jax.set_mesh(mesh):
        _, restored = ckpt.restore(state=specs)
    _assert_bit_identical(host, restored)
    assert restored["w"].sharding.spec == PartitionSpec("fsdp", "data")
    # Without the model at hand: the saved specs from the index.
    spec = ckpt_lib.read_state_spec(ckpt.ckpt_dir(3))
    _, restored = ckpt.restore(state=spec)
    _assert_bit_identical(host, restored)


def test_resharding_across_unaligned_chunks(tmp_path):
    # Saved as 8 chunks of 3 rows; restored as 6 shards of 4 rows (each spans two chunks) and
    # as 6 column shards (each needs a slice of every chunk).
    host = np.arange(24 * 6, dtype=np.float32).reshape(24, 6)
    mesh8 = _mesh((8,), ("x",))
    ckpt = _checkpointer(tmp_path)
    ckpt.save(step=1, state=dict(w=jax.device_put(host, NamedSharding(mesh8, PartitionSpec("x")))))
    ckpt.wait_until_finished()
    mesh6 = _mesh((6,), ("y",))
    for spec in (PartitionSpec("y"), PartitionSpec(None, "y")):
        target = dict(
            w=jax.ShapeDtypeStruct((24, 6), jnp.float32, sharding=NamedSharding(mesh6, spec))
        )
        _, restored = ckpt.restore(state=target)
        for shard in restored["w"].addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), host[shard.index])
    assert ckpt.storage.last_restore_stats.num_bytes == host.nbytes  # Each chunk read once.


def test_sync_filesystem_uses_syncfs_and_falls_back_to_sync(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "sync", lambda: calls.append("sync"))
    layout.sync_filesystem(str(tmp_path))  # syncfs on Linux: os.sync is not needed.
    assert calls == ([] if hasattr(layout._libc(), "syncfs") else ["sync"])  # pylint: disable=protected-access
    monkeypatch.setattr(layout, "_libc", lambda: None)
    layout.sync_filesystem(str(tmp_path))
    assert calls[-1] == "sync"
    with pytest.raises(FileNotFoundError):
        monkeypatch.undo()
        layout.sync_filesystem(str(tmp_path / "missing"))
