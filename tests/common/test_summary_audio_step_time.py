"""Tests AudioSummary writing and the writers' average_step_time records (read back with TB)."""

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from axlearn.common.summary import AudioSummary
from axlearn.common.summary_writer import CompositeWriter, SummaryWriter, _average_step_time


def _tensors(path, tag):
    acc = EventAccumulator(path, size_guidance={"tensors": 0})
    acc.Reload()
    if tag not in acc.Tags().get("tensors", []):
        return {}
    import tensorflow as tf

    return {e.step: tf.make_ndarray(e.tensor_proto) for e in acc.Tensors(tag)}


def test_average_step_time():
    assert _average_step_time([], 3) is None
    assert _average_step_time([1.0], 0) is None
    assert _average_step_time([9.0, 1.0, 2.0, 6.0], 3) == pytest.approx(3.0)
    assert _average_step_time([1.0, 2.0], 5) == pytest.approx(1.5)


def test_log_average_step_time_every_n(tmp_path):
    writer = (
        CompositeWriter.default_config()
        .set(
            name="w",
            dir=str(tmp_path),
            writers={
                "fast": SummaryWriter.default_config().set(write_every_n_steps=2),
                "slow": SummaryWriter.default_config().set(write_every_n_steps=4),
            },
        )
        .instantiate(parent=None)
    )
    times = [1.0, 2.0, 3.0, 10.0]
    for step in (1, 2, 3, 4):
        writer.log_average_step_time(step=step, step_times=times[:step])
    fast = _tensors(str(tmp_path / "fast"), "average_step_time")
    slow = _tensors(str(tmp_path / "slow"), "average_step_time")
    assert sorted(fast) == [2, 4] and sorted(slow) == [4]
    assert float(fast[2]) == pytest.approx(1.5) and float(fast[4]) == pytest.approx(6.5)
    assert float(slow[4]) == pytest.approx(4.0)


def test_audio_summary(tmp_path):
    audio = np.linspace(-1, 1, 10, dtype=np.float32)
    summary = AudioSummary(audio, sample_rate=16000)
    summary.validate()
    assert summary.value().shape == (10, 1)
    with pytest.raises(ValueError, match="sample_rate"):
        AudioSummary(audio, sample_rate=0).validate()
    with pytest.raises(ValueError, match="num_samples"):
        AudioSummary(np.zeros([2, 3, 4]), sample_rate=8000).validate()
    writer = (
        SummaryWriter.default_config().set(name="w", dir=str(tmp_path)).instantiate(parent=None)
    )
    writer(3, {"speech": summary})
    written = _tensors(str(tmp_path), "speech")
    assert list(written) == [3]  # One encoded clip (WAV bytes and a label) at step 3.
    assert written[3].reshape(-1)[0][:4] == b"RIFF"


def test_summaries_compare_by_value():
    from axlearn.common.metrics import WeightedSummary

    assert WeightedSummary(2.0, 3) == WeightedSummary(2.0, 3)
    assert WeightedSummary(2.0, 3) != WeightedSummary(2.0, 4)
    assert WeightedSummary(np.ones(2), 1) == WeightedSummary(np.ones(2), 1)
    assert WeightedSummary(np.ones(2), 1) != WeightedSummary(np.zeros(2), 1)
    # A Python number equals an array holding it at the array's dtype (float32 5.4 == 5.4).
    assert WeightedSummary(jnp.asarray(81.0) / 15, 15) == WeightedSummary(5.4, 15)
    assert AudioSummary(np.ones(2), sample_rate=8) != AudioSummary(np.ones(2), sample_rate=16)
    assert len({WeightedSummary(1, 1), WeightedSummary(1, 1)}) == 2  # Hashable by identity.
