"""axlearn/common/attention/__init__.py: AXLearn's names importable from `attention`."""

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common import attention
from axlearn.common.module import functional


def test_learned_positional_embedding_from_attention_looks_up_positions():
    cfg = attention.LearnedPositionalEmbedding.default_config().set(name="pos", dim=3, shape=[5])
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert params["weight"].shape == (1, 5, 3)
    table = np.arange(15, dtype=np.float32).reshape(1, 5, 3)
    positions = jnp.asarray([[4, 0, 2]])
    out, _ = functional(
        layer, None, {"weight": jnp.asarray(table)}, dict(positions=positions), is_training=False
    )
    np.testing.assert_array_equal(out, table[0][[4, 0, 2]][None])
