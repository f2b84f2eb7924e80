"""Tests of axlearn/common/summary.py (AXLearn's Summary, ImageSummary, CallbackSummary)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.summary import CallbackSummary, ImageSummary, Summary


def test_image_summary_validates_and_is_a_pytree():
    images = jnp.zeros((2, 4, 5, 3))
    s = ImageSummary(images)
    s.validate()
    assert s.value().shape == (2, 4, 5, 3)
    assert ImageSummary(jnp.zeros((4, 5, 1))).value().shape == (1, 4, 5, 1)
    doubled = jax.jit(lambda x: jax.tree.map(lambda v: v + 1, x))(s)
    assert isinstance(doubled, ImageSummary)
    np.testing.assert_array_equal(doubled.value(), np.ones((2, 4, 5, 3)))
    with pytest.raises(ValueError, match="with 1, 3 or 4 channels"):
        ImageSummary(jnp.zeros((4, 5, 2))).validate()
    with pytest.raises(ValueError, match="must be an array"):
        ImageSummary([1, 2]).validate()


def test_summary_subclass_fields_and_errors():
    class Pair(Summary):
        a: object
        b: object

        def value(self):
            return self.a + self.b

    p = Pair(1, b=2)
    assert p.value() == 3 and repr(p) == "Pair(a=1, b=2)"
    assert jax.tree.leaves(p) == [1, 2]
    with pytest.raises(TypeError, match=r"missing fields \['b'\]"):
        Pair(1)
    with pytest.raises(NotImplementedError, match="does not support accumulation"):
        p.accumulate(p)


def test_callback_summary_calls_on_the_host():
    s = CallbackSummary(lambda x, scale: np.asarray(x) * scale, jnp.arange(3), scale=2)
    out = jax.jit(lambda t: t)(s)
    np.testing.assert_array_equal(out.value(), [0, 2, 4])
    with pytest.raises(ValueError, match="must be callable"):
        CallbackSummary(3).validate()


def test_media_summaries_keep_the_first_when_accumulated_and_key_by_field_name():
    from axlearn.common.summary import AudioSummary
    from axlearn.common.utils import flatten_items

    first, second = ImageSummary(jnp.ones((1, 2, 2, 3))), ImageSummary(jnp.zeros((1, 2, 2, 3)))
    assert first.accumulate(second) is first
    audio = AudioSummary(jnp.zeros(4))
    assert audio.sample_rate == 16000 and audio.accumulate(AudioSummary(jnp.ones(4))) is audio
    assert AudioSummary(jnp.zeros(4), sample_rate=8000).sample_rate == 8000
    cb = CallbackSummary(lambda: 1)
    assert cb.accumulate(CallbackSummary(lambda: 2)) is cb
    # Paths use the field names as they are (AXLearn's "_value").
    paths = [p for p, _ in flatten_items(dict(a=first, b=audio))]
    assert paths == ["a/_value", "b/_value"]
