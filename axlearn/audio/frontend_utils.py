"""Audio feature building blocks: framing, windows, spectrograms and mel filterbanks.

A waveform [..., seq_len] is cut into frames [..., num_frames, frame_size] (`frame`, with a
last partial frame padded), optionally pre-emphasized (`pre_emphasis`) and windowed
(`windowing`: Hann or Hamming), transformed with an FFT of size `next_power_of_2(frame_size)`,
and turned into a magnitude spectrogram (`magnitude_spectrogram`) and log-mel features
(`linear_to_mel_weight_matrix`, `linear_to_log_mel_spectrogram`; the mel scale is
1127 * ln(1 + f / 700), TensorFlow's `tf.signal.linear_to_mel_weight_matrix` filters).
"""

import enum
import math
from typing import Callable, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec
from numpy.typing import ArrayLike

from axlearn.common.utils import Tensor
from axlearn.common.utils_data import current_mesh


class WindowType(enum.Enum):
    """Window functions applied to frames."""

    HANN = 0
    HAMMING = 1


class FrequencyScale(enum.Enum):
    """Warped frequency scales (MEL_LN: 1127 * ln(1 + f / 700))."""

    MEL_LN = 0


def hertz_to_warped_scale(freq: ArrayLike, *, freq_scale: FrequencyScale) -> ArrayLike:
    """Converts frequencies in Hz to `freq_scale`.

    Args:
        freq: Frequencies in Hz.
        freq_scale: The target scale.

    Returns:
        The frequencies on the target scale.
    """
    if freq_scale != FrequencyScale.MEL_LN:
        raise NotImplementedError(f"hertz_to_warped_scale: unsupported scale {freq_scale}")
    return 1127.0 * np.log1p(np.asarray(freq) / 700.0)


def warped_to_hertz_scale(freq: ArrayLike, *, freq_scale: FrequencyScale) -> ArrayLike:
    """Converts frequencies on `freq_scale` back to Hz.

    Args:
        freq: Frequencies on the source scale.
        freq_scale: The source scale.

    Returns:
        The frequencies in Hz.
    """
    if freq_scale != FrequencyScale.MEL_LN:
        raise NotImplementedError(f"warped_to_hertz_scale: unsupported scale {freq_scale}")
    return 700.0 * np.expm1(np.asarray(freq) / 1127.0)


def ms_to_samples(ms: Union[int, float], *, sample_rate: int) -> int:
    """Converts a duration in milliseconds to a whole number of samples.

    Args:
        ms: The duration in milliseconds.
        sample_rate: Samples per second.

    Returns:
        The number of samples.

    Raises:
        ValueError: If the duration is not a whole number of samples.
    """
    samples = sample_rate * ms / 1000
    if not float(samples).is_integer():
        raise ValueError(
            f"ms_to_samples: {ms} ms at {sample_rate} Hz is {samples} samples, not a whole "
            "number; pick a duration that is"
        )
    return int(samples)


def num_frames(seq_len: int, *, frame_size: int, hop_size: int) -> int:
    """The number of frames of a sequence, a last partial frame included.

    ceil((seq_len - frame_size + hop_size) / hop_size), at least 1 for a non-empty sequence.

    Args:
        seq_len: The sequence length (>= 0).
        frame_size: Samples per frame (>= 1).
        hop_size: Samples between frame starts (>= 0).

    Returns:
        The number of frames (0 for an empty sequence).

    Raises:
        ValueError: On a negative length, a frame_size < 1 or a negative hop_size.
    """
    if seq_len < 0 or frame_size < 1 or hop_size < 0:
        raise ValueError(
            f"num_frames: invalid seq_len={seq_len}, frame_size={frame_size}, "
            f"hop_size={hop_size} (need seq_len >= 0, frame_size >= 1, hop_size >= 0)"
        )
    if seq_len == 0:
        return 0
    return max(-(-(seq_len - frame_size + hop_size) // hop_size), 1)


def frame(x: Tensor, *, frame_size: int, hop_size: int, pad_value: int = 0) -> Tensor:
    """Cuts the last axis into (overlapping) frames; the last partial frame is padded.

    Args:
        x: [..., seq_len].
        frame_size: Samples per frame.
        hop_size: Samples between frame starts.
        pad_value: The value of the samples past the end.

    Returns:
        [..., num_frames, frame_size], frame i holding x[..., i * hop_size : i * hop_size +
        frame_size].
    """
    seq_len = x.shape[-1]
    count = num_frames(seq_len, frame_size=frame_size, hop_size=hop_size)
    needed = (count - 1) * hop_size + frame_size if count else 0
    pad = [(0, 0)] * (x.ndim - 1) + [(0, max(0, needed - seq_len))]
    x = jnp.pad(x, pad, constant_values=pad_value)
    index = hop_size * jnp.arange(count)[:, None] + jnp.arange(frame_size)[None, :]
    return x[..., index]


def frame_paddings(paddings: Tensor, *, frame_size: int, hop_size: int) -> Tensor:
    """The paddings of `frame`'s frames: a frame is padding if any of its samples is.

    Args:
        paddings: [..., seq_len], 1 (True) for padding.
        frame_size: Samples per frame.
        hop_size: Samples between frame starts (<= frame_size).

    Returns:
        [..., num_frames].

    Raises:
        ValueError: If hop_size > frame_size (samples between frames would be skipped).
    """
    if hop_size > frame_size:
        raise ValueError(f"frame_paddings: hop_size={hop_size} must be <= frame_size={frame_size}")
    framed = frame(paddings, frame_size=frame_size, hop_size=hop_size, pad_value=1)
    return jnp.max(framed, axis=-1)


def pre_emphasis(x: Tensor, *, coeff: Tensor) -> Tensor:
    """The pre-emphasis filter y[n] = x[n + 1] - coeff * x[n] over the last axis.

    Args:
        x: Frames [..., frame_size].
        coeff: The coefficient.

    Returns:
        [..., frame_size - 1].
    """
    return x[..., 1:] - jnp.asarray(coeff).astype(x.dtype) * x[..., :-1]


def window_coffs(window_size: int, *, window_type: WindowType, periodic: bool = True) -> Tensor:
    """The coefficients of a Hann or Hamming window.

    Args:
        window_size: The window length.
        window_type: HANN or HAMMING.
        periodic: For an even size, the periodic window (the first `window_size` points of the
            symmetric window of size + 1), as spectral analysis uses.

    Returns:
        [window_size].
    """
    length = window_size + 1 if (periodic and window_size % 2 == 0) else window_size
    if window_type == WindowType.HANN:
        alpha = 0.5
    elif window_type == WindowType.HAMMING:
        alpha = 0.54
    else:
        raise NotImplementedError(f"window_coffs: unsupported window_type {window_type}")
    if length == 1:
        return jnp.ones([window_size])
    n = jnp.arange(window_size)
    return alpha - (1 - alpha) * jnp.cos(2 * jnp.pi * n / (length - 1))


def windowing(x: Tensor, *, window_type: WindowType, periodic: bool = True) -> Tensor:
    """Multiplies frames [..., num_frames, window_size] by a window (see `window_coffs`)."""
    coeffs = window_coffs(x.shape[-1], window_type=window_type, periodic=periodic)
    return (x * coeffs).astype(x.dtype)


def magnitude_spectrogram(ffts: Tensor, *, dtype: jnp.dtype) -> Tensor:
    """|FFT| of frames.

    Args:
        ffts: [..., num_frames, fft_size // 2 + 1] complex.
        dtype: The output dtype.

    Returns:
        [..., num_frames, fft_size // 2 + 1].
    """
    return jnp.abs(ffts).astype(dtype)


def linear_to_log_spectrogram(x: Tensor) -> Tensor:
    """log(x), with x floored at the dtype's smallest positive normal number."""
    return jnp.log(jnp.maximum(x, jnp.finfo(x.dtype).tiny))


def linear_to_log_mel_spectrogram(
    x: Tensor, *, weight_matrix: ArrayLike, mel_floor: float = 1.0
) -> Tensor:
    """log(max(mel_floor, x @ weight_matrix)).

    Args:
        x: A magnitude or power spectrogram [..., num_frames, num_spectrogram_bins].
        weight_matrix: [num_spectrogram_bins, num_filters] (`linear_to_mel_weight_matrix`).
        mel_floor: The floor before the log.

    Returns:
        [..., num_frames, num_filters].
    """
    return linear_to_log_spectrogram(jnp.maximum(mel_floor, x @ weight_matrix).astype(x.dtype))


def linear_to_mel_weight_matrix(
    *,
    num_filters: int,
    num_spectrogram_bins: int,
    sample_rate: float,
    lower_edge_hertz: float,
    upper_edge_hertz: float,
    dtype: np.dtype = np.float64,
) -> ArrayLike:
    """Triangular mel filters mapping a linear spectrogram to `num_filters` mel bands.

    Filter k rises linearly (on the mel scale) from band edge k to k + 1 and falls to k + 2,
    the num_filters + 2 edges spaced evenly in mel between the lower and upper edge. Bin 0 (DC)
    gets no weight, as in `tf.signal.linear_to_mel_weight_matrix`.

    Args:
        num_filters: Number of mel bands.
        num_spectrogram_bins: Number of linear bins (fft_size // 2 + 1).
        sample_rate: The signal's sample rate.
        lower_edge_hertz: The lowest frequency of the filters.
        upper_edge_hertz: The highest frequency of the filters.
        dtype: The matrix dtype.

    Returns:
        [num_spectrogram_bins, num_filters].
    """
    scale = FrequencyScale.MEL_LN
    bins_hz = np.linspace(0, sample_rate // 2, num_spectrogram_bins)[1:].astype(dtype)
    bins_mel = hertz_to_warped_scale(bins_hz, freq_scale=scale)[:, None]
    edges = np.linspace(
        hertz_to_warped_scale(lower_edge_hertz, freq_scale=scale),
        hertz_to_warped_scale(upper_edge_hertz, freq_scale=scale),
        num_filters + 2,
    ).astype(dtype)
    left, center, right = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    rising = (bins_mel - left) / (center - left)
    falling = (right - bins_mel) / (right - center)
    weights = np.maximum(np.minimum(rising, falling), 0.0)
    return np.concatenate([np.zeros((1, num_filters), weights.dtype), weights], axis=0)


def next_power_of_2(n: float) -> int:
    """The smallest power of 2 >= n."""
    return 2 ** math.ceil(math.log2(n))


def cast_for_rfft(x: Tensor) -> Tensor:
    """`x` as float32 unless it is float32 or float64 already (what `jnp.fft.rfft` accepts)."""
    return x if x.dtype in (jnp.float32, jnp.float64) else x.astype(jnp.float32)


def sharded_fft(n: int, partition_spec: PartitionSpec) -> Callable[[Tensor], Tensor]:
    """An rFFT of size `n` over the last axis, run per shard of the current mesh.

    (An FFT under GSPMD may replicate its input on GPU; running it under `shard_map` keeps it
    sharded.)

    Args:
        n: The FFT size.
        partition_spec: The sharding of the inputs and outputs (the last axis unsharded).

    Returns:
        A function [..., frame_size] -> [..., n // 2 + 1] complex.

    Raises:
        ValueError: Outside a mesh context.
    """
    mesh = current_mesh()
    if mesh is None:
        raise ValueError("sharded_fft needs a mesh: call it inside `with Mesh(...)`")
    return jax.shard_map(
        lambda x: jnp.fft.rfft(cast_for_rfft(x), n=n),
        mesh=mesh,
        in_specs=partition_spec,
        out_specs=partition_spec,
    )
