"""Helpers for speech tests: random waveforms with random lengths."""

import jax
import jax.numpy as jnp

from axlearn.common.utils import Tensor


def fake_audio(
    *,
    batch_size: int,
    seq_len: int,
    prng_key: Tensor,
    scale: float = 32768.0,
    dtype: jnp.dtype = jnp.float32,
) -> tuple[Tensor, Tensor]:
    """Uniform random waveforms in [-scale, scale) and their paddings.

    Args:
        batch_size: Number of waveforms.
        seq_len: Samples per waveform.
        prng_key: The key; it is split into a key for the samples and one for the lengths.
        scale: The amplitude bound.
        dtype: The samples' dtype (drawn in float32, then cast).

    Returns:
        (inputs [batch_size, seq_len], paddings [batch_size, seq_len] bool, True past each
        waveform's random length in [0, seq_len)).
    """
    sample_key, length_key = jax.random.split(prng_key)
    inputs = jax.random.uniform(
        sample_key, shape=[batch_size, seq_len], minval=-scale, maxval=scale, dtype=jnp.float32
    ).astype(dtype)
    lengths = jax.random.randint(length_key, shape=[batch_size, 1], minval=0, maxval=seq_len)
    paddings = jnp.arange(seq_len)[None, :] >= lengths
    return inputs, paddings
