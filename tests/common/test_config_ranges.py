"""Tests axlearn/common/config_ranges.py: nonsense values fail at instantiation, naming the path."""

import math

import jax
import pytest

from axlearn.common.config_ranges import ConfigRangeError, validate_config_ranges
from tests.common import trainer_test_utils as tu


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda c: c.set(max_step=-5), r"trainer\.max_step=-5: a step count must be >= 0"),
        (
            lambda c: setattr(c.learner.optimizer, "learning_rate", -0.01),
            r"trainer\.learner\.optimizer\.learning_rate=-0\.01: a learning rate must be >= 0",
        ),
        (
            lambda c: setattr(c.input, "global_batch_size", 0),
            r"trainer\.input\.global_batch_size=0: a size must be >= 1",
        ),
        (lambda c: setattr(c.model, "vocab_size", 0), r"trainer\.model\.vocab_size=0"),
        (lambda c: setattr(c.learner.optimizer, "eps", math.nan), r"optimizer\.eps=nan is NaN"),
    ],
)
def test_out_of_range_values_fail_at_instantiation(tmp_path, mutate, match):
    cfg = tu.bigram_trainer_config(str(tmp_path))
    mutate(cfg)
    with pytest.raises(ValueError, match=match):
        cfg.instantiate(parent=None)
    # Nothing saved (the directory itself holds the run lock, which covers checkpointer.dir).
    assert not list((tmp_path / "checkpoints").glob("step_*"))


def test_valid_values_pass(tmp_path):
    cfg = tu.bigram_trainer_config(str(tmp_path)).set(max_step=math.inf)
    validate_config_ranges(cfg, root="trainer")
    cfg.set(max_step=0)
    validate_config_ranges(cfg)


def test_token_ids_beyond_vocab_fail_at_the_first_batch(tmp_path):
    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=3)
    cfg.model.vocab_size = 20  # FakeLmInput draws ids up to VOCAB (> 20).
    with pytest.raises(ValueError, match=r"token id \d+, but trainer\.model\.vocab_size is 20"):
        cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
    # Nothing saved (the directory itself holds the run lock, which covers checkpointer.dir).
    assert not list((tmp_path / "checkpoints").glob("step_*"))


def test_fractional_step_counts_fail_and_a_zero_learning_rate_warns(tmp_path, caplog):
    """Issue 29 case 6: max_step=20.5 (a float the int-or-inf field accepts) is refused, and a
    learning rate of 0 (which trains nothing) is allowed with a warning naming the field."""
    cfg = tu.bigram_trainer_config(str(tmp_path)).set(max_step=20.5)
    with pytest.raises(ConfigRangeError, match=r"trainer\.max_step=20\.5: .* a whole number"):
        validate_config_ranges(cfg, root="trainer")
    validate_config_ranges(cfg.set(max_step=20.0), root="trainer")
    cfg.learner.optimizer.learning_rate = 0.0
    with caplog.at_level("WARNING"):
        validate_config_ranges(cfg, root="trainer")
    assert any(
        "trainer.learner.optimizer.learning_rate=0.0: with a learning rate of 0" in r.getMessage()
        for r in caplog.records
    )
    cfg.model.dim = 0
    with pytest.raises(ConfigRangeError, match=r"trainer\.model\.dim=0: a size must be >= 1"):
        validate_config_ranges(cfg, root="trainer")
