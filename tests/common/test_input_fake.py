"""Tests axlearn/common/input_fake.py."""

from __future__ import annotations

import numpy as np
import pytest

from axlearn.common import input_tf_data
from axlearn.common.config import REQUIRED, ConfigBase, Required, config_class, config_for_function
from axlearn.common.input_fake import FakeLmInput, replace_inputs_with_fake
from axlearn.common.input_iterator import InputStateError
from axlearn.experiments.text.common import embedded_vocab_config
from axlearn.experiments.text.gpt.common import tfds_input


def _fake(**kwargs) -> FakeLmInput.Config:
    return (
        FakeLmInput.default_config()
        .set(name="input", is_training=True, global_batch_size=4, source_length=8, max_token_id=50)
        .set(**kwargs)
    )


def test_fake_lm_batches():
    it = iter(_fake().instantiate(parent=None))
    b = next(it)
    assert set(b) == {"input_ids", "target_labels", "target_num_bytes"}
    assert b["input_ids"].shape == (4, 8) and b["input_ids"].dtype == np.int32
    assert b["input_ids"].min() >= 1 and b["input_ids"].max() < 50
    # Targets are the inputs shifted by one.
    np.testing.assert_array_equal(b["input_ids"][:, 1:], b["target_labels"][:, :-1])
    # Deterministic, and different batches differ.
    again = next(iter(_fake().instantiate(parent=None)))
    np.testing.assert_array_equal(b["input_ids"], again["input_ids"])
    assert not np.array_equal(next(it)["input_ids"], b["input_ids"])


def test_fake_process_slices_union_and_resume():
    cfg = _fake()
    g = iter(cfg.instantiate(parent=None))
    parts = [iter(cfg.instantiate(parent=None, process_index=i, process_count=2)) for i in (0, 1)]
    for _ in range(2):
        whole = next(g)["input_ids"]
        np.testing.assert_array_equal(whole, np.concatenate([next(p)["input_ids"] for p in parts]))
    state = g.get_state()
    expected = next(g)["input_ids"]
    restored = cfg.instantiate(parent=None).restore_iterator(state)
    np.testing.assert_array_equal(next(restored)["input_ids"], expected)


def test_fake_eval_is_finite_and_validates():
    it = iter(_fake(is_training=False, total_num_batches=3).instantiate(parent=None))
    assert len(list(it)) == 3
    with pytest.raises(ValueError, match="total_num_batches"):
        _fake(is_training=False).instantiate(parent=None)
    with pytest.raises(ValueError, match="divisible by the process count"):
        _fake(global_batch_size=3).instantiate(parent=None, process_index=0, process_count=2)


@config_class
class _Decoder(ConfigBase):
    vocab_size: int = 512


@config_class
class _Model(ConfigBase):
    decoder: _Decoder = _Decoder()


@config_class
class _Evaler(ConfigBase):
    input: Required[ConfigBase] = REQUIRED


@config_class
class _Trainer(ConfigBase):
    input: Required[ConfigBase] = REQUIRED
    evalers: dict = {}
    model: _Model = _Model()


def _lm_input(is_training: bool, batch_size: int):
    return input_tf_data.Input.default_config().set(
        is_training=is_training,
        source=config_for_function(tfds_input).set(
            is_training=is_training,
            dataset_name="python_docs:1.0.0",
            split="train",
            vocab_cfg=embedded_vocab_config(),
            max_sequence_length=128,
        ),
        processor=config_for_function(input_tf_data.identity),
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=batch_size, pad_example_fn=input_tf_data.default_pad_example_fn
        ),
    )


def test_replace_inputs_with_fake():
    cfg = _Trainer(input=_lm_input(True, 8), evalers={"valid": _Evaler(input=_lm_input(False, 4))})
    replace_inputs_with_fake(cfg)
    assert cfg.input.klass is FakeLmInput
    assert (cfg.input.global_batch_size, cfg.input.source_length) == (8, 128)
    assert cfg.input.max_token_id == 512 and cfg.input.total_num_batches is None
    ev = cfg.evalers["valid"].input
    assert ev.klass is FakeLmInput and not ev.is_training and ev.total_num_batches == 2
    assert ev.global_batch_size == 4


def test_replace_inputs_with_fake_errors_name_the_path():
    bad = _lm_input(True, 8)
    bad.batcher.global_batch_size = REQUIRED
    with pytest.raises(ValueError, match="evalers\\['x'\\].input"):
        replace_inputs_with_fake(
            _Trainer(input=_lm_input(True, 8), evalers={"x": _Evaler(input=bad)})
        )


def test_element_spec_matches_batches():
    cfg = FakeLmInput.default_config().set(
        name="fake", is_training=True, global_batch_size=8, source_length=16
    )
    fake = cfg.instantiate(parent=None, process_index=1, process_count=2)
    batch = next(iter(fake))
    spec = fake.element_spec()
    assert set(spec) == set(batch)
    for key, value in batch.items():
        assert spec[key].shape == value.shape and spec[key].dtype == value.dtype, key


def test_restoring_another_inputs_state_says_so():
    """E.g. a tf.data run's checkpoint resumed with --data_dir=FAKE."""
    cfg = FakeLmInput.default_config().set(
        name="fake", is_training=True, global_batch_size=2, source_length=4, max_token_id=10
    )
    fake = cfg.instantiate(parent=None)
    for state in (b"\x80\x04binary tf.data state", b'{"format": "tf_data"}'):
        with pytest.raises(ValueError, match=r"saved by an unknown input .* FakeLmInput"):
            fake.restore_iterator(state)
    # Issue 55 case 1: a real-data run's state (tf.data, Grain) resumed with --data_dir=FAKE is
    # one line naming both inputs and both fixes; the state's bytes are not shown.
    for state, saved in (
        (b"AXINPUT1\x10\x00\x00\x00secret-payload", "a tf.data input reading real data"),
        (b'{"format": "axlearn.grain_input_state", "x": "secret-payload"}', "a Grain input"),
    ):
        with pytest.raises(InputStateError) as e:
            fake.restore_iterator(state)
        msg = str(e.value)
        assert "\n" not in msg and "secret-payload" not in msg
        assert f"input position was saved by {saved}" in msg, msg
        assert "(a run without --data_dir=FAKE), but this run reads with FakeLmInput" in msg
        assert msg.endswith(
            "resume with the --data_dir of the run that saved it (not FAKE), or train in a "
            "fresh --trainer_dir."
        ), msg


_HEAD = b'{"format": "axlearn.fake_input_state", '


@pytest.mark.parametrize(
    "state, expected",
    [
        # Over input_state_check.MAX_STATE_BYTES (16 MiB): refused before decoding.
        (_HEAD + b'"num_batches": 1, "pad": "' + b"x" * (16 << 20) + b'"}', "more than the"),
        # 100k levels: plain json.loads raises RecursionError; the bounded parser refuses.
        (_HEAD + b'"num_batches": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deeper"),
        (_HEAD + b'"num_batches": 3', "not valid JSON at line 1"),  # Truncated.
        (_HEAD + b'"num_batches": "3"}', "'num_batches' must be an integer, got str"),
        (_HEAD + b'"num_batches": true}', "'num_batches' must be an integer, got bool"),
        (_HEAD + b'"num_batches": null}', "'num_batches' must be an integer, got NoneType"),
        (_HEAD + b'"num_batches": 2.5}', "'num_batches' must be an integer, got float"),
        (_HEAD + b'"num_batches": -1}', "'num_batches' is -1, outside [0, 2**63 - 1]"),
        (_HEAD + b'"num_batches": ' + b"9" * 30 + b"}", "outside [0, 2**63 - 1]"),
        (_HEAD + b'"batches": 3}', "has no field 'num_batches'"),
    ],
)
def test_restoring_a_bad_fake_state_is_one_line(state, expected):
    """A saved FakeLmInput state is decoded bounded; each defect is one line naming the fix."""
    fake = _fake().instantiate(parent=None)
    with pytest.raises(InputStateError) as e:
        fake.restore_iterator(state)
    msg = str(e.value)
    assert expected in msg, msg
    assert msg.startswith("Input 'input': the checkpoint's") and "\n" not in msg, msg
    assert len(msg) < 400 and "xxxx" not in msg, msg
    assert msg.endswith("resume from an earlier checkpoint, or train in a fresh --trainer_dir")


def test_restoring_a_fake_state_resumes_its_position():
    """The reference: the batches after a restore are those a fresh iterator yields there."""
    reference = iter(_fake().instantiate(parent=None))
    expected = [next(reference) for _ in range(3)][2]
    restored = _fake().instantiate(parent=None)
    it = restored.restore_iterator(b' {"format": "axlearn.fake_input_state", "num_batches": 2}')
    np.testing.assert_array_equal(next(it)["input_ids"], expected["input_ids"])
    with pytest.raises(InputStateError, match="holds no input state"):
        restored.restore_iterator([])
