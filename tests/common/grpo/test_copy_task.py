"""Tests axlearn/common/grpo/copy_task.py: the prompts' layout and determinism."""

import numpy as np
import pytest

from axlearn.common.grpo.copy_task import EOS_ID, FIRST_DIGIT_ID, SEP_ID, CopyDigitsPrompts


def test_prompts_layout_and_determinism():
    prompts = CopyDigitsPrompts.default_config().set(num_prompts=5, num_digits=4).instantiate()
    batch = prompts.batch(3)
    assert batch["prefix"].shape == (5, 6) and batch["target"].shape == (5, 4)
    assert batch["prefix"].dtype == np.int32 and batch["target"].dtype == np.int32
    np.testing.assert_array_equal(batch["prefix"][:, 0], EOS_ID)
    np.testing.assert_array_equal(batch["prefix"][:, -1], SEP_ID)
    np.testing.assert_array_equal(batch["prefix"][:, 1:-1], batch["target"])
    assert batch["target"].min() >= FIRST_DIGIT_ID
    assert batch["target"].max() < prompts.vocab_size == FIRST_DIGIT_ID + 10
    # A pure function of (seed, index): the same batch again, another one for another index.
    np.testing.assert_array_equal(prompts.batch(3)["prefix"], batch["prefix"])
    assert not np.array_equal(prompts.batch(4)["prefix"], batch["prefix"])


@pytest.mark.parametrize("field", ["num_prompts", "num_digits", "num_symbols"])
def test_bad_sizes_name_the_field(field):
    with pytest.raises(ValueError, match=f"CopyDigitsPrompts.{field}=0: must be an integer >= 1"):
        CopyDigitsPrompts.default_config().set(**{field: 0}).instantiate()
