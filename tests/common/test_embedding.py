"""Tests of axlearn.common.embedding's ModalityVocabInfo and ModalityEmbedding."""

import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.embedding import ModalityEmbedding, ModalityVocabInfo
from axlearn.common.module import functional


def test_modality_embedding_interface():
    """A subclass of ModalityEmbedding configured with a ModalityVocabInfo (AXLearn's API)."""

    info = ModalityVocabInfo(
        modality_name="image",
        placeholder_start=10,
        placeholder_end=20,
        vocab_start=100,
        vocab_end=164,
        generate_logits=True,
    )
    assert info.vocab_size == 64
    with pytest.raises(ValueError, match="ranges must be start <= end"):
        ModalityVocabInfo(
            modality_name="x", placeholder_start=2, placeholder_end=1, vocab_start=0, vocab_end=0
        )

    class _Ones(ModalityEmbedding):
        def forward(self, input_batch):
            ids = input_batch["placeholders"] - self.config.modality_vocab_info.placeholder_start
            return self.Output(ids=ids, embeddings=jnp.ones(ids.shape + (self.config.dim,)))

    cfg = _Ones.default_config().set(name="emb", dim=3, modality_vocab_info=info)
    assert "modality_vocab_info" in cfg.debug_string()
    layer = cfg.instantiate(parent=None)
    out, _ = functional(
        layer,
        None,
        {},
        dict(input_batch=dict(placeholders=jnp.array([[10, 12]]))),
        is_training=False,
    )
    np.testing.assert_array_equal(out.ids, [[0, 2]])
    assert out.embeddings.shape == (1, 2, 3) and out.paddings is None
    with pytest.raises(NotImplementedError):
        functional(layer, None, {}, dict(x=jnp.ones((1, 3))), method="attend", is_training=False)
