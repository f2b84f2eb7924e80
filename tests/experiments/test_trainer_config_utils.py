"""Tests axlearn/experiments/trainer_config_utils.py."""

from axlearn.common.utils import set_data_dir
from axlearn.experiments.text.gpt import c4_trainer
from axlearn.experiments.trainer_config_utils import config_map_cache


def test_config_map_cache_is_per_data_dir():
    calls = []

    @config_map_cache
    def named_trainer_configs():
        calls.append(1)
        return dict(c4_trainer.named_trainer_configs())

    first = named_trainer_configs()
    second = named_trainer_configs()
    assert len(calls) == 1 and first.keys() == second.keys()
    # Each TrainerConfigFn builds a fresh config: changing one leaves the next call unchanged.
    cfg = second["fuji-7B-v3"]()
    cfg.max_step = 1
    assert first["fuji-7B-v3"]().max_step == 983040
    with set_data_dir("FAKE"):
        fake = named_trainer_configs()["fuji-7B-v3"]()
    assert len(calls) == 2  # Another data dir: built again (c4_trainer reads it).
    assert fake.input.source.preprocessor.shuffle_buffer_size == 0
    assert first["fuji-7B-v3"]().input.source.preprocessor.shuffle_buffer_size == 8192
