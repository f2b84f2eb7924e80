"""Trainer config utilities (AXLearn's `axlearn.experiments.trainer_config_utils`).

- `TrainerConfigFn` (`axlearn.common.config.TrainerConfigFn`, re-exported): a function returning
  a trainer config (what `named_trainer_configs()` maps config names to).
- `V6eFlashConfigModifier`: sets the TPU block size of every FlashAttention layer to 1024 (the
  mesh rules of AXLearn's Fuji configs use it on TPU v6e).
- `config_map_cache`: caches a `named_trainer_configs` function per data dir.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

from axlearn.common.config import ConfigBase, ConfigModifier, TrainerConfigFn, config_class
from axlearn.common.flash_attention.layer import set_flash_block_sizes
from axlearn.common.utils import get_data_dir

__all__ = ["TrainerConfigFn", "V6eFlashConfigModifier", "config_map_cache"]


class V6eFlashConfigModifier(ConfigModifier):
    """Sets `tpu_block_size` of every FlashAttention layer (1024 suits TPU v6e).

    A config without FlashAttention layers is left unchanged.
    """

    @config_class
    class Config(ConfigModifier.Config):
        """Configures V6eFlashConfigModifier."""

        # The TPU block size of the flash attention kernels.
        tpu_block_size: int = 1024

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Sets the block size (in place).

        Args:
            cfg: The trainer config.

        Returns:
            The modified config.
        """
        set_flash_block_sizes(cfg, tpu_block_size=self.config.tpu_block_size, gpu_block_size=None)
        return cfg


def config_map_cache(
    func: Callable[..., dict[str, TrainerConfigFn]],
) -> Callable[..., dict[str, TrainerConfigFn]]:
    """Caches a `named_trainer_configs`-like function per `--data_dir` (`get_data_dir()`).

    The cached functions return fresh configs on every call (each TrainerConfigFn builds a new
    config), so callers may modify what they get.

    Args:
        func: Returns {config name: TrainerConfigFn}.

    Returns:
        The cached function (same signature).
    """

    @functools.cache
    def cached(data_dir: Optional[str], *args, **kwargs) -> dict[str, TrainerConfigFn]:
        del data_dir  # Only a cache key: configs may depend on it (e.g. "FAKE").
        return func(*args, **kwargs)

    @functools.wraps(func)
    def wrapper(*args, **kwargs) -> dict[str, TrainerConfigFn]:
        return dict(cached(get_data_dir(), *args, **kwargs))

    return wrapper
