"""A unit test written the way AXLearn users write theirs; it must run unchanged against axlearn.

Guard: it only uses AXLearn's public testing surface (test_utils.TestCase, assert_allclose,
absl parameterized), configs with PartitionSpec values, `module.functional` and a mesh. If a name
or behaviour it relies on changes, this file fails.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax.sharding import Mesh, PartitionSpec

from axlearn.common import schedule, utils
from axlearn.common.config import config_for_function
from axlearn.common.layers import Linear
from axlearn.common.module import functional as F
from axlearn.common.test_utils import TestCase, assert_allclose, is_supported_mesh_shape


class LinearTest(TestCase):
    """Tests Linear the AXLearn way."""

    @parameterized.parameters(
        (PartitionSpec("data", "model"),),
        (PartitionSpec(None, "model"),),
        (PartitionSpec(None, None),),
    )
    def test_forward_sharded(self, spec):
        mesh_shape = (2, 4)
        if not is_supported_mesh_shape(mesh_shape):
            self.skipTest(f"needs {np.prod(mesh_shape)} devices")
        cfg = Linear.default_config().set(
            name="linear", input_dim=8, output_dim=16, param_partition_spec=spec
        )
        layer = cfg.instantiate(parent=None)
        devices = utils.create_device_mesh(mesh_shape)
        with Mesh(devices, ("data", "model")):
            params = layer.initialize_parameters_recursively(prng_key=jax.random.PRNGKey(1))
            x = jax.random.normal(jax.random.PRNGKey(2), (3, 8))
            outputs, _ = F(
                layer,
                inputs=dict(x=x),
                state=params,
                is_training=False,
                prng_key=jax.random.PRNGKey(3),
            )
        expected = np.asarray(x) @ np.asarray(params["weight"]) + np.asarray(params["bias"])
        assert_allclose(outputs, expected, atol=1e-5, rtol=1e-5)
        self.assertEqual(outputs.shape, (3, 16))
        self.assertIn(f"param_partition_spec: PartitionSpec{tuple(spec)!r}", str(cfg))

    @parameterized.named_parameters(
        ("warmup_start", 1, 0.01),
        ("warmup_second", 2, 0.02),
        ("peak", 100, 1.0),
    )
    def test_warmup_schedule(self, step, expected):
        lr = config_for_function(schedule.cosine_with_linear_warmup).set(
            peak_lr=1.0, max_step=1000, warmup_steps=100
        )
        assert_allclose(schedule.as_schedule_fn(lr)(step), expected)

    def test_nested_all_close(self):
        tree = {"a": jnp.ones((2,)), "b": {"c": jnp.zeros((1,), jnp.int32)}}
        self.assertNestedAllClose(tree, jax.tree.map(lambda x: x + 0, tree))
        self.assertNestedEqual(tree, tree)


if __name__ == "__main__":
    absltest.main()
