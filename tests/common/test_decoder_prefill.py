"""Tests of axlearn.common.decoder's AXLearn-style decoding calls: `extend_step(input_batch=,
is_prefill=True)` (a prompt fills an empty cache) and multi-token `extend_step`, against the
full-sequence forward logits."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.common.test_decoder import BATCH, LENGTH, _decoder, _forward_logits, _ids, _method


@pytest.mark.parametrize("stack,causal_mask_layer", [("repeat", False), ("stack", True)])
def test_prefill_extend_step_then_multi_token_steps_match_forward(stack, causal_mask_layer):
    decoder, params = _decoder(stack, causal_mask_layer=causal_mask_layer)
    ids = _ids(seed=3)
    full = _forward_logits(decoder, params, ids)
    prefix_len = jnp.array([4, 2])
    segments = (jnp.arange(LENGTH)[None] < prefix_len[:, None]).astype(jnp.int32)
    states = decoder.init_states(batch_size=BATCH, max_sequence_length=LENGTH)
    states, out = _method(decoder, "extend_step")(
        params,
        dict(
            cached_states=states,
            is_prefill=True,
            input_batch=dict(input_ids=ids * segments, input_segment_ids=segments),
        ),
        None,
    )
    np.testing.assert_array_equal(states["time_step"], prefix_len)
    for b in range(BATCH):
        n = int(prefix_len[b])
        np.testing.assert_allclose(out["logits"][b, :n], full[b, :n], atol=1e-5, rtol=1e-5)
    # Then two tokens per call, from each row's own time step.
    for step in range(0, 6, 2):
        cols = (prefix_len + step)[:, None] + jnp.arange(2)[None]
        tokens = jnp.take_along_axis(ids, cols, axis=1)
        states, out = _method(decoder, "extend_step")(
            params, dict(cached_states=states, input_batch=dict(input_ids=tokens)), None
        )
        expected = jnp.take_along_axis(full, cols[:, :, None], axis=1)
        np.testing.assert_allclose(out["logits"], expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(states["time_step"], prefix_len + 6)


def test_extend_step_needs_exactly_one_input():
    decoder, params = _decoder("repeat")
    states = decoder.init_states(batch_size=BATCH, max_sequence_length=LENGTH)
    with pytest.raises(ValueError, match="pass exactly one of input_ids and input_batch"):
        _method(decoder, "extend_step")(params, dict(cached_states=states), None)
