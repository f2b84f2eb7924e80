"""TransformerTextEmbeddings.forward(input_batch=...) equals the keyword form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.embedding import LearnedPositionalEmbedding, TransformerTextEmbeddings
from axlearn.common.module import functional


def test_input_batch_form():
    cfg = TransformerTextEmbeddings.default_config().set(
        name="emb",
        dim=4,
        vocab_size=10,
        pos_emb=LearnedPositionalEmbedding.default_config().set(shape=(6,)),
    )
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    ids = jnp.array([[1, 2, 3], [4, 5, 6]])
    positions = jnp.array([[0, 1, 2], [3, 4, 5]])
    ref, _ = functional(
        layer, None, params, dict(inputs=ids, positions=positions), is_training=False
    )
    got, _ = functional(
        layer,
        None,
        params,
        dict(input_batch=dict(inputs=ids, positions=positions)),
        is_training=False,
    )
    np.testing.assert_array_equal(got, ref)
    table = np.asarray(params["token_emb"]["weight"])
    pos = np.asarray(params["pos_emb"]["weight"])[0]
    np.testing.assert_allclose(got, table[np.asarray(ids)] + pos[np.asarray(positions)], rtol=1e-6)
    with pytest.raises(ValueError, match="emb: pass either inputs or input_batch"):
        functional(
            layer, None, params, dict(inputs=ids, input_batch=dict(inputs=ids)), is_training=False
        )
