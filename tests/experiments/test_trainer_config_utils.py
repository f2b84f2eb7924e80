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


def test_v7x_and_splash_modifiers_set_flash_layers_only():
    from axlearn.common.config import config_class
    from axlearn.common.flash_attention.layer import FlashAttention
    from axlearn.experiments.trainer_config_utils import (
        SplashAttentionConfigModifier,
        V7xFlashConfigModifier,
        flash_attention_configs,
    )

    cfg = c4_trainer.named_trainer_configs()["fuji-7B-v3-flash"]()
    (flash,) = flash_attention_configs(cfg)  # The mesh rules' layers are not visited.
    assert flash is cfg.model.decoder.transformer.layer.self_attention.attention
    assert V7xFlashConfigModifier.default_config().tpu_block_size == 2048
    V7xFlashConfigModifier.default_config().instantiate()(cfg)
    assert flash.tpu_block_size == 2048
    # The sizes go into FlashAttention's backend_overrides (as AXLearn's); the layer accepts them.
    before = cfg.debug_string()
    SplashAttentionConfigModifier.default_config().set(
        splash_block_q=4096, splash_block_kv_compute=1024
    ).instantiate()(cfg)
    assert flash.backend_overrides == {"splash_block_q": 4096, "splash_block_kv_compute": 1024}
    added = set(cfg.debug_string().splitlines()) - set(before.splitlines())
    assert added == {
        "model.decoder.transformer.layer.self_attention.attention.backend_overrides"
        "['splash_block_q']: 4096",
        "model.decoder.transformer.layer.self_attention.attention.backend_overrides"
        "['splash_block_kv_compute']: 1024",
    }
    flash.clone(name="attention", query_dim=64, key_dim=64, value_dim=64).instantiate(
        parent=None
    )  # Known keys and valid sizes: the layer accepts them.

    class SplashFlash(FlashAttention):
        @config_class
        class Config(FlashAttention.Config):
            backend_overrides: dict = {}  # Kernel options by name.

    cfg.model.decoder.transformer.layer.self_attention.attention = SplashFlash.default_config().set(
        backend_overrides={"other": 1}
    )
    SplashAttentionConfigModifier.default_config().set(
        splash_block_q=4096, splash_block_kv_compute=1024
    ).instantiate()(cfg)
    assert cfg.model.decoder.transformer.layer.self_attention.attention.backend_overrides == {
        "other": 1,
        "splash_block_q": 4096,
        "splash_block_kv_compute": 1024,
    }
    # A model without FlashAttention layers is left as it is.
    plain = c4_trainer.named_trainer_configs()["fuji-7B-v3"]()
    text = plain.debug_string()
    V7xFlashConfigModifier.default_config().instantiate()(plain)
    assert plain.debug_string() == text
