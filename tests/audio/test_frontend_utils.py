"""Tests of axlearn.audio.frontend_utils against NumPy written here."""

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.audio.frontend_utils import (
    WindowType,
    frame,
    frame_paddings,
    linear_to_log_mel_spectrogram,
    linear_to_mel_weight_matrix,
    magnitude_spectrogram,
    ms_to_samples,
    next_power_of_2,
    num_frames,
    pre_emphasis,
    window_coffs,
    windowing,
)
from axlearn.audio.test_utils import fake_audio


@pytest.mark.parametrize("seq_len,frame_size,hop", [(20, 15, 10), (16, 4, 4), (7, 5, 2), (3, 5, 1)])
def test_frame_and_paddings(seq_len, frame_size, hop):
    x = np.arange(1, seq_len + 1, dtype=np.float32).reshape(1, seq_len)
    out = np.asarray(frame(x, frame_size=frame_size, hop_size=hop))
    count = max(-(-(seq_len - frame_size + hop) // hop), 1)
    assert num_frames(seq_len, frame_size=frame_size, hop_size=hop) == count
    expected = np.zeros((1, count, frame_size), np.float32)
    for i in range(count):
        chunk = x[0, i * hop : i * hop + frame_size]
        expected[0, i, : len(chunk)] = chunk
    np.testing.assert_array_equal(out, expected)
    paddings = np.zeros((1, seq_len), np.int32)
    paddings[0, seq_len // 2 :] = 1
    framed = np.asarray(frame_paddings(paddings, frame_size=frame_size, hop_size=hop))
    ref = [
        int(paddings[0, i * hop : i * hop + frame_size].max() or i * hop + frame_size > seq_len)
        for i in range(count)
    ]
    np.testing.assert_array_equal(framed[0], ref)


def test_windows_and_pre_emphasis():
    for size in (8, 9):
        # Periodic windows are the first `size` points of the symmetric window of size + 1
        # for even sizes; NumPy's windows are symmetric.
        n = size + 1 if size % 2 == 0 else size
        np.testing.assert_allclose(
            window_coffs(size, window_type=WindowType.HANN), np.hanning(n)[:size], atol=1e-6
        )
        np.testing.assert_allclose(
            window_coffs(size, window_type=WindowType.HAMMING, periodic=False),
            np.hamming(size),
            atol=1e-6,
        )
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(
        windowing(x, window_type=WindowType.HANN), x * np.hanning(9)[:8], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        pre_emphasis(x, coeff=0.97), x[..., 1:] - 0.97 * x[..., :-1], rtol=1e-5, atol=1e-6
    )
    assert ms_to_samples(25, sample_rate=16000) == 400 and next_power_of_2(400) == 512
    with pytest.raises(ValueError, match="not a whole number"):
        ms_to_samples(0.01, sample_rate=16000)


def test_mel_filterbank_and_log_mel():
    num_filters, bins, rate = 10, 129, 16000
    weights = linear_to_mel_weight_matrix(
        num_filters=num_filters,
        num_spectrogram_bins=bins,
        sample_rate=rate,
        lower_edge_hertz=125.0,
        upper_edge_hertz=7600.0,
    )
    # NumPy: triangles on the HTK-style natural-log mel scale, DC bin excluded.
    mel = lambda f: 1127.0 * np.log(1.0 + f / 700.0)  # noqa: E731
    edges = np.linspace(mel(125.0), mel(7600.0), num_filters + 2)
    freqs = np.linspace(0, rate // 2, bins)
    ref = np.zeros((bins, num_filters))
    for b in range(1, bins):
        m = mel(freqs[b])
        for k in range(num_filters):
            lo, c, hi = edges[k], edges[k + 1], edges[k + 2]
            ref[b, k] = max(0.0, min((m - lo) / (c - lo), (hi - m) / (hi - c)))
    np.testing.assert_allclose(weights, ref, atol=1e-10)

    # A waveform's log-mel features: frames, Hann window, |rFFT|, mel, log.
    audio, _ = fake_audio(batch_size=1, seq_len=1600, prng_key=jax.random.PRNGKey(0))
    frames = frame(audio / 32768.0, frame_size=256, hop_size=128)
    spec = magnitude_spectrogram(
        jnp.fft.rfft(windowing(frames, window_type=WindowType.HANN), n=256), dtype=jnp.float32
    )
    out = linear_to_log_mel_spectrogram(spec, weight_matrix=weights, mel_floor=1e-3)
    f64 = np.asarray(frames, np.float64) * np.hanning(257)[:256]
    ref_spec = np.abs(np.fft.rfft(f64, n=256))
    np.testing.assert_allclose(out, np.log(np.maximum(1e-3, ref_spec @ ref)), rtol=1e-4, atol=1e-4)
