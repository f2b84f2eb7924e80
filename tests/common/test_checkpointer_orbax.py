"""Tests OrbaxCheckpointer: save/restore through orbax-checkpoint, policy, retention."""

import jax
import numpy as np
import pytest
from jax import numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from axlearn.common.checkpointer_orbax import OrbaxCheckpointer
from axlearn.common.utils import TensorSpec, VDict

pytest.importorskip("orbax.checkpoint")


def test_save_restore_keeps_structure_and_sharding(tmp_path):
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec("data", "model"))
    state = VDict(
        w=jax.device_put(jnp.arange(16, dtype=jnp.float32).reshape(4, 4), sharding),
        step=jnp.asarray(7, jnp.int32),
    )
    cfg = OrbaxCheckpointer.default_config().set(name="ckpt", dir=str(tmp_path), keep_last_n=1)
    cfg.save_policy.set(n=2)
    ckpt = cfg.instantiate(parent=None)
    assert ckpt.restore(state=state) == (None, state)
    assert not ckpt.save(step=1, state=state)  # Not a multiple of n=2.
    assert ckpt.save(step=2, state=state)
    assert ckpt.save(step=4, state=jax.tree.map(lambda x: x + 1, state))
    ckpt.wait_until_finished()
    assert OrbaxCheckpointer.latest_checkpoint_path(str(tmp_path)) == ckpt.ckpt_dir(4)
    assert OrbaxCheckpointer.latest_checkpoint_step(str(tmp_path)) == 4
    assert OrbaxCheckpointer.checkpoint_paths(str(tmp_path)) == [ckpt.ckpt_dir(4)]  # keep 1.
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
    step, restored = ckpt.restore(state=target)
    assert step == 4 and isinstance(restored, VDict)
    np.testing.assert_array_equal(restored["w"], np.arange(16).reshape(4, 4) + 1)
    assert restored["w"].sharding == sharding
    assert int(restored["step"]) == 8
    with jax.set_mesh(mesh):  # TensorSpec targets restore with their mesh axes.
        spec = TensorSpec(shape=[4, 4], dtype=jnp.float32, mesh_axes=PartitionSpec("data", None))
        _, from_spec = ckpt.restore(step=4, state=VDict(w=spec, step=jnp.asarray(0, jnp.int32)))
    assert from_spec["w"].sharding.spec == PartitionSpec("data", None)
    np.testing.assert_array_equal(from_spec["w"], np.arange(16).reshape(4, 4) + 1)
    with pytest.raises(ValueError, match="saves arrays and numbers only"):
        ckpt.save(step=6, state={"it": iter([])}, force=True)
    ckpt.stop()
    with ckpt:  # Usable again after stop; nested blocks are refused.
        with pytest.raises(ValueError, match="Already in a context"):
            with ckpt:
                pass
        assert ckpt.save(step=8, state=state)
    assert OrbaxCheckpointer.latest_checkpoint_step(str(tmp_path)) == 8
